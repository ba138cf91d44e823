"""mmvq_xs.cu (the x-stationary probe) against the f64 reference and against mmvq: every compiled
config that fits K, rows a CTA that do and do not divide the rows, a residual; bad arguments refused."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import mmvq as mv  # noqa: E402
from minferd.kernels import mmvq_xs as xs  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402


def _quantized(K, rng):
    x = rng.standard_normal((1, K)).astype(np.float32)
    scratch = cp.empty(mv.scratch_bytes(1, K), cp.uint8)
    mv.quantize_x(cp.asarray(x), scratch)
    return x, scratch


@pytest.mark.parametrize("name", xs.TYPES)
@pytest.mark.parametrize("shape", range(3))
def test_xs_is_the_reference_and_mmvq(name, shape, to_device):
    qt = TYPES[name]
    # a short row (7 blocks of 256), the 7B's 3584, and the longest K each unit size fits (ffn_down)
    rows, K = [(67, 1792), (300, 3584), (130, 18944 if qt.block_elems == 256 else 4864)][shape]
    rng = np.random.default_rng(rows + K + qt.ggml_id)
    raw = random_blocks(qt, rows, K, rng)
    w = to_device(raw)
    x, scratch = _quantized(K, rng)
    ref = reference(qt, raw, x)
    base = poisoned((1, rows), cp.float32)
    mv.mmvq(qt, w, cp.asarray(x), base, scratch=scratch, x_quantized=True)
    ran = 0
    for cfg in xs.CONFIGS:
        if not xs.fits(qt, K, cfg):
            continue
        for rpc in (7, 16, 64):
            out = poisoned((1, rows), cp.float32)
            xs.mmvq_xs(qt, w, scratch, out, config=cfg, rows_per_cta=rpc)
            assert rel_err(out, ref) < 1e-2, f"{name} {rows}x{K} {cfg} rows/CTA {rpc}"
            assert rel_err(out, cp.asnumpy(base)) < 1e-5, f"{name} {rows}x{K} {cfg} rows/CTA {rpc}: not mmvq's sums"
            ran += 1
    assert ran >= 3, f"{name} K={K}: only {ran} configs fit"


def test_xs_adds_the_residual(to_device):
    qt = TYPES["Q4_K"]
    rng = np.random.default_rng(5)
    raw = random_blocks(qt, 100, 3584, rng)
    x, scratch = _quantized(3584, rng)
    res = cp.asarray(rng.standard_normal((1, 100)).astype(np.float32))
    out = poisoned((1, 100), cp.float32)
    xs.mmvq_xs(qt, to_device(raw), scratch, out, config=(4, 1, 1), rows_per_cta=16, residual=res)
    assert rel_err(out, reference(qt, raw, x) + cp.asnumpy(res)) < 1e-2


def test_xs_refuses_bad_arguments(to_device):
    qt = TYPES["Q4_K"]
    rng = np.random.default_rng(6)
    w = to_device(random_blocks(qt, 8, 18944, rng))
    _, scratch = _quantized(18944, rng)
    out = cp.empty((1, 8), cp.float32)
    with pytest.raises(ValueError, match="do not fit"):
        xs.mmvq_xs(qt, w, scratch, out, config=(4, 1, 1), rows_per_cta=8)  # 592 units on 128 threads
    with pytest.raises(ValueError, match="not compiled"):
        xs.mmvq_xs(qt, w, scratch, out, config=(3, 1, 1), rows_per_cta=8)
    with pytest.raises(ValueError, match="rows_per_cta"):
        xs.mmvq_xs(qt, w, scratch, out, config=(20, 1, 1), rows_per_cta=65)
    with pytest.raises(ValueError, match="not one of"):
        xs.mmvq_xs("Q3_K", w, scratch, out, config=(20, 1, 1), rows_per_cta=8)
