"""mmvq_xs.cu (one decode column, x held in registers) against the f64 reference within mmvq's 1e-2
contract and within 1e-5 of mmvq itself (the same unit products, added in another order): every
compiled (UPL, R) with rows a CTA that leave a tail, groups of three with biases, a residual, the
tensor one block in (every block's alignment flips), and the real 7B / 8B shapes. Outputs are
poisoned with NaN first, so a row never written fails. Then the decode graphs of a model with the
pending path on give the same tokens as with it off."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import mmvq as mv, mmvq_xs as xs  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402

TOL = 1e-2


def _run(qt, ws, x_h, **kw):
    outs = [poisoned((1, w.shape[0]), cp.float32) for w in ws]
    mv.mmvq_group(qt, ws, cp.asarray(x_h), outs, **kw)
    return outs


@pytest.mark.parametrize("name", xs.TYPES_XS)
@pytest.mark.parametrize("upl,r", xs.VARIANTS)
@pytest.mark.parametrize("rpc", [3, 8, 16])
def test_every_variant_is_the_reference(name, upl, r, rpc, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id * 100 + upl * 10 + r + rpc)
    K = 256 * 7  # 56 units: one warp short of whole with UPL 1 and 2
    raw = random_blocks(qt, 68, K, rng)
    x = rng.standard_normal((1, K)).astype(np.float32)
    for offset, sl in ((0, slice(0, 67)), (qt.block_bytes, slice(1, 68))):
        w = to_device(raw, offset)[sl]
        got = _run(qt, [w], x, stationary=True, config=(upl, r, rpc))[0]
        base = _run(qt, [w], x)[0]
        ref = reference(qt, raw[sl], x)
        assert rel_err(got, ref) < TOL, f"{name} {(upl, r, rpc)} offset={offset}"
        assert rel_err(got, cp.asnumpy(base).astype(np.float64)) < 1e-5, f"{name} {(upl, r, rpc)} offset={offset}"


@pytest.mark.parametrize("name", xs.TYPES_XS)
def test_group_bias_and_residual(name, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(7 + qt.ggml_id)
    K = 256 * 4
    raws = [random_blocks(qt, m, K, rng) for m in (100, 33, 33)]
    ws = [to_device(raw) for raw in raws]
    x = rng.standard_normal((1, K)).astype(np.float32)
    biases = [cp.asarray(rng.standard_normal(m).astype(np.float32)) for m in (100, 33, 33)]
    outs = _run(qt, ws, x, stationary=True, biases=biases)
    for raw, b, out in zip(raws, biases, outs):
        ref = reference(qt, raw, x) + cp.asnumpy(b)[None].astype(np.float64)
        assert rel_err(out, ref) < TOL
    res = cp.asarray(rng.standard_normal((1, 100)).astype(np.float32))
    out = poisoned((1, 100), cp.float32)
    mv.mmvq(qt, ws[0], cp.asarray(x), out, residual=res, stationary=True)
    assert rel_err(out, reference(qt, raws[0], x) + cp.asnumpy(res).astype(np.float64)) < TOL


SHAPES = [(512, 3584), (3584, 3584), (18944, 3584), (3584, 18944), (14336, 4096), (4096, 14336)]
CHECK_ROWS = 256


@pytest.mark.parametrize("name", xs.TYPES_XS)
@pytest.mark.parametrize("rows,K", SHAPES)
def test_real_shapes(name, rows, K, to_device):
    """Each shape class's config on the models' matrices (where CONFIGS leaves the class to mmvq,
    the first of (1, 2, 8), (2, 2, 8) that fits): every row written and finite, a sample against the
    reference, all of them within 1e-5 of mmvq."""
    qt = TYPES[name]
    rng = np.random.default_rng(rows + K)
    raw = random_blocks(qt, rows, K, rng)
    w = to_device(raw)
    x = rng.standard_normal((1, K)).astype(np.float32)
    config = None if xs.fits(qt, K, rows) else next(c for c in ((1, 2, 8), (2, 2, 8)) if xs.fits(qt, K, rows, c))
    got, base = _run(qt, [w], x, stationary=True, config=config)[0], _run(qt, [w], x)[0]
    assert bool(cp.isfinite(got).all())
    sel = np.unique(np.concatenate([[0, rows - 1], rng.integers(0, rows, CHECK_ROWS)]))
    assert rel_err(got[:, cp.asarray(sel)], reference(qt, raw[sel], x)) < TOL
    assert rel_err(got, cp.asnumpy(base).astype(np.float64)) < 1e-5


def test_refuses_what_it_cannot_run(to_device):
    rng = np.random.default_rng(3)
    x2 = cp.asarray(rng.standard_normal((2, 512)).astype(np.float32))
    w = to_device(random_blocks(TYPES["Q4_K"], 8, 512, rng))
    with pytest.raises(ValueError, match="x-stationary"):  # two columns
        mv.mmvq_group("Q4_K", [w], x2, [cp.empty((2, 8), cp.float32)], stationary=True)
    w5 = to_device(random_blocks(TYPES["Q5_0"], 8, 512, rng))
    with pytest.raises(ValueError, match="x-stationary"):  # a type it has no instance of
        mv.mmvq_group("Q5_0", [w5], x2[:1], [cp.empty((1, 8), cp.float32)], stationary=True)
    K = 32 * (xs.MAX_THREADS + 32)  # one warp more than its launch bound at one unit a thread
    wk = to_device(random_blocks(TYPES["Q4_K"], 2, K, rng))
    xk = cp.asarray(rng.standard_normal((1, K)).astype(np.float32))
    with pytest.raises(ValueError, match="x-stationary"):
        mv.mmvq_group("Q4_K", [wk], xk, [cp.empty((1, 2), cp.float32)], stationary=True, config=(1, 2, 4))


@pytest.mark.parametrize("arch,quant", [("qwen2", "q4_k_m"), ("llama", "q4_k_m"), ("qwen2", "q6_k")])
def test_decode_graphs_decode_the_same(synth_model, arch, quant, monkeypatch):
    """A one-sequence decode graph with the pending path on against off: the same products summed
    in another order, so the logits agree within the paths' tolerance and pick the same tokens."""
    from minferd.backend import cuda_matmul, pending
    from tests.cuda.test_engine_cuda import decode_step
    calls = []
    one = cuda_matmul.mmvq_group

    def spy(*a, stationary=False, **kw):
        calls.append(stationary)
        return one(*a, stationary=stationary, **kw)

    monkeypatch.setattr(cuda_matmul, "mmvq_group", spy)
    # every class on (a tiny model's matrices are all "few", which CONFIGS may leave to mmvq)
    monkeypatch.setattr(xs, "CONFIGS", {t: dict.fromkeys(c, (1, 2, 8)) for t, c in xs.CONFIGS.items()})
    outs = []
    for on in (False, True):
        monkeypatch.setattr(pending, "WAITING", pending.WAITING - {"mmvq_xs"} if on else pending.WAITING | {"mmvq_xs"})
        calls.clear()
        outs.append(decode_step(str(synth_model(arch, quant)), "mmq", 1))
        assert any(calls) == on, calls
    assert np.abs(outs[0] - outs[1]).max() <= 1e-3 * np.abs(outs[0]).max()
    assert np.array_equal(outs[0].argmax(-1), outs[1].argmax(-1))
