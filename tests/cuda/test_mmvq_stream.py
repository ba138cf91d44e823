"""mmvq.cu's mmvq_stream (one column, rows brought into shared memory by bulk copies) against the
f64 reference and against mmvq: groups of matrices whose last item is partial, items of 1-8
rows, rings of 1-16 stages wrapped many times, bias and residual; outputs poisoned with NaN
first, so an item never computed fails. What lets backend/pending.py's mmvq_stream on."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import mmvq as mv  # noqa: E402
from minferd.kernels import mmvq_stream as ms  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402

TOL = 1e-2  # mmvq's contract (test_mmvq.py)
NAMES = mv.STREAM_TYPES
# (item bytes at most, stages, CTAs an SM, units a lane a trip): the default, one row an item, a
# ring of one, a deep ring, and one CTA an SM over many items (each slot's barrier turns its
# parity many times), each at 1 and 2 units a trip.
CONFIGS = [ms.CONFIG, (1, 4, 2, 2), (16384, 1, 1, 1), (4096, 12, 1, 2), (8192, 2, 1, 1), (4096, 3, 3, 2)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("nblocks", [7, 74])
def test_group_matches_reference(name, config, nblocks, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id * 7 + nblocks + sum(config) % 97)
    K = qt.block_elems * nblocks
    raws = [random_blocks(qt, rows, K, rng) for rows in (67, 5, 130)]
    ws = [to_device(raw) for raw in raws]
    x = rng.standard_normal((1, K)).astype(np.float32)
    outs = [poisoned((1, w.shape[0]), cp.float32) for w in ws]
    ms.mmvq_stream(qt, ws, cp.asarray(x), outs, config=config)
    for raw, out in zip(raws, outs):
        err = rel_err(out, reference(qt, raw, x))
        assert err < TOL, f"{name} {config} rows={raw.shape[0]} K={K}: rel err {err:.2e}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", CONFIGS)
def test_many_items_a_cta_with_bias_and_residual(name, config, to_device):
    """5000 one-block rows: 625 items of 8 rows on at most 264 CTAs (the ring wraps); the bias
    and the residual land on every row, as mmvq's epilogue adds them."""
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id + 3)
    K = qt.block_elems
    raw = random_blocks(qt, 5000, K, rng)
    w = to_device(raw)
    x = rng.standard_normal((1, K)).astype(np.float32)
    bias = cp.asarray(rng.standard_normal(5000).astype(np.float32))
    res = cp.asarray(rng.standard_normal((1, 5000)).astype(np.float32))
    out = poisoned((1, 5000), cp.float32)
    ms.mmvq_stream(qt, [w], cp.asarray(x), [out], biases=[bias], residual=res, config=config)
    want = reference(qt, raw, x) + cp.asnumpy(bias)[None] + cp.asnumpy(res)
    err = rel_err(out, want)
    assert err < TOL, f"{name} {config}: rel err {err:.2e}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rows,K", [(512, 3584), (3584, 3584), (18944, 3584), (3584, 18944)])
def test_real_shapes_agree_with_mmvq(name, rows, K, to_device):
    """The 7B's shapes: the same products as mmvq's, summed in another order."""
    qt = TYPES[name]
    rng = np.random.default_rng(rows + K)
    raw = random_blocks(qt, rows, K, rng)
    w = to_device(raw)
    x = cp.asarray(rng.standard_normal((1, K)).astype(np.float32))
    a, b = poisoned((1, rows), cp.float32), poisoned((1, rows), cp.float32)
    mv.mmvq(qt, w, x, a)
    ms.mmvq_stream(qt, [w], x, [b])
    assert rel_err(b, cp.asnumpy(a)) < 1e-5, f"{name} {rows}x{K}"


def test_refuses_what_it_cannot_stream(to_device):
    qt = TYPES["Q6_K"]
    w = to_device(random_blocks(qt, 8, 256, np.random.default_rng(0)))
    x = cp.zeros((1, 256), cp.float32)
    with pytest.raises(ValueError, match="Q6_K is not streamed"):
        ms.mmvq_stream(qt, [w], x, [cp.empty((1, 8), cp.float32)])
    q4 = TYPES["Q4_K"]
    w4 = to_device(random_blocks(q4, 8, 256, np.random.default_rng(0)), 8)  # 8 bytes in: not 16-aligned
    with pytest.raises(ValueError, match="16-aligned"):
        ms.mmvq_stream(q4, [w4], x, [cp.empty((1, 8), cp.float32)])
    with pytest.raises(ValueError, match="stages"):
        ms.mmvq_stream(q4, [to_device(random_blocks(q4, 8, 256, np.random.default_rng(0)))], x,
                       [cp.empty((1, 8), cp.float32)], config=(16384, 16, 1, 1))
