"""mmq_small.cu against an f64 reference: out = x @ dequant(W).T (+ bias) (+ residual) within
1e-3 relative (||out - ref|| / ||ref||), for every supported type, every token tile (M 9, 16,
17, 32, 33, 64), a row count that is no multiple of the 64-row tile, K with an odd number of
blocks, tensors starting on odd blocks, K split over many CTAs and not at all, and the 7B's
decode shapes. Outputs are poisoned with NaN first, so an element never written fails.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import mmq_small as ms  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402

TOL = 1e-3  # mmq.cu's: the two-plane x with one scale per token row lands near 1e-4
NAMES = sorted(ms.SUPPORTED)


def run(qt, w, x_h, bias=None, res=None, **kw):
    out = poisoned((x_h.shape[0], w.shape[0]), cp.float32)
    ms.mmq_small(qt, w, ms.quantize(cp.asarray(x_h)), out, bias=bias, residual=res, **kw)
    return out


def n_blocks(qt, steps: int = 1) -> int:
    # an odd number of blocks; 32-element types: a partial last K step of 128
    return (3 if qt.block_elems == 256 else 13) * steps


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [9, 16, 17, 33, 64])
def test_matches_reference(name, M, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id * 100 + M)
    K = qt.block_elems * n_blocks(qt, 5)
    raw = random_blocks(qt, 132, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    # 131 rows (two full tiles and a partial one), the tensor starting one block in
    for offset, sl in ((0, slice(0, 131)), (qt.block_bytes, slice(1, 132))):
        w = to_device(raw, offset)[sl]
        err = rel_err(run(qt, w, x), reference(qt, raw[sl], x))
        assert err < TOL, f"{name} M={M} offset={offset}: rel err {err:.2e}"


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("split", [True, False])
def test_bias_residual_and_splits(name, split, to_device, monkeypatch):
    """The epilogue adds bias and residual the same with K split (the partials' sum launch) and
    whole (the GEMM's own); splits forced both ways."""
    qt = TYPES[name]
    if not split:
        monkeypatch.setattr(ms, "CTAS_PER_SM", 0)
    rng = np.random.default_rng(7 + qt.ggml_id)
    M, N, K = 24, 200, qt.block_elems * n_blocks(qt, 8)
    s = ms._split_for(M, N, K, ms.sm_count(cp.cuda.Device().id))
    assert (s > 1) == split
    raw = random_blocks(qt, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    ref = reference(qt, raw, x) + bias + res
    err = rel_err(run(qt, to_device(raw), x, cp.asarray(bias), cp.asarray(res)), ref)
    assert err < TOL, f"{name} split={split}: rel err {err:.2e}"


@pytest.mark.parametrize("name,N,K", [("Q4_K", 3584, 3584), ("Q4_K", 18944, 3584), ("Q6_K", 3584, 18944),
                                       ("Q4_K", 512, 3584)])
def test_7b_decode_shapes(name, N, K, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(N + K)
    raw = random_blocks(qt, N, K, rng)
    x = rng.standard_normal((16, K)).astype(np.float32)
    err = rel_err(run(qt, to_device(raw), x), reference(qt, raw, x))
    assert err < TOL, f"{name} {N}x{K}: rel err {err:.2e}"


def test_deterministic_with_callers_buffers(to_device):
    """Two runs agree bit for bit (no atomics, a fixed split order), with the caller's x buffer
    and partials, on a stream; nothing is allocated when both are given."""
    qt = TYPES["Q4_K"]
    rng = np.random.default_rng(5)
    M, N, K = 40, 700, 4096
    raw = random_blocks(qt, N, K, rng)
    w = to_device(raw)
    x = cp.asarray(rng.standard_normal((M, K)).astype(np.float32))
    sms = ms.sm_count(cp.cuda.Device().id)
    part = cp.empty(max(ms.part_bytes(M, N, K, sms), 4) // 4, cp.float32)
    xbuf = cp.empty(ms.x_bytes(M, K), cp.uint8)
    outs = []
    stream = cp.cuda.Stream(non_blocking=True)
    for _ in range(2):
        out = poisoned((M, N), cp.float32)
        before = cp.get_default_memory_pool().used_bytes()
        ms.mmq_small(qt, w, ms.quantize(x, xbuf, stream=stream), out, part=part, stream=stream)
        assert cp.get_default_memory_pool().used_bytes() == before
        stream.synchronize()
        outs.append(out.get())
    assert np.array_equal(outs[0], outs[1])
    assert rel_err(cp.asarray(outs[0]), reference(qt, raw, x.get())) < TOL


def test_checks_arguments(to_device):
    qt = TYPES["Q4_K"]
    w = to_device(random_blocks(qt, 64, 256, np.random.default_rng(0)))
    xq = ms.quantize(cp.zeros((16, 256), cp.float32))
    with pytest.raises(ValueError, match="out must be"):
        ms.mmq_small(qt, w, xq, cp.zeros((16, 63), cp.float32))
    with pytest.raises(ValueError, match="not supported"):
        ms.mmq_small(TYPES["F16"], w, xq, cp.zeros((16, 64), cp.float32))
    with pytest.raises(ValueError, match="bias must be"):
        ms.mmq_small(qt, w, xq, cp.zeros((16, 64), cp.float32), bias=cp.zeros(63, cp.float32))
    with pytest.raises(ValueError, match="outside"):
        ms.quantize(cp.zeros((65, 256), cp.float32))


@pytest.mark.parametrize("name", ms.SWEPT)
@pytest.mark.parametrize("config", sorted(ms.CONFIGS))
@pytest.mark.parametrize("M", [16, 40, 64])
def test_every_config(name, config, M, to_device):
    """Each config bench/mmq_small.py times (deeper register prefetch, more CTAs per SM) gives
    the reference's products, with K split and over a partial row tile."""
    qt = TYPES[name]
    rng = np.random.default_rng(M + len(config))
    K = qt.block_elems * n_blocks(qt, 7)
    raw = random_blocks(qt, 100, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    err = rel_err(run(qt, to_device(raw), x, config=config), reference(qt, raw, x))
    assert err < TOL, f"{name} {config} M={M}: rel err {err:.2e}"
