"""gemm_f16.cu: the f16 tensor-core GEMM with its two B loaders.

(a) bit-parity: fused_b (raw GGUF rows, dequantized inside the GEMM) must equal, bit for
    bit, gemm_w16 on dequant_f16's f16 copy of the same rows: every type, two row lengths
    (2 and 3 super-blocks of 256 / 8 and 9 blocks of 32 / for float types 40 and 264
    elements, i.e. partial k-steps), rows sliced to start on an odd block (Q5_0: both block
    parities), M in {1, 17, 128}, every tile config;
(b) both within 1e-2 relative (||out - ref|| / ||ref||) of an f64 reference for every type;
(c) a real 7B prefill shape (M = 512, N = 18944, K = 3584) for Q4_K and Q6_K.
Outputs are poisoned with NaN first, so an element never written fails.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels.dequant import dequant_f16  # noqa: E402
from minferd.kernels.dequant_ref import dequantize  # noqa: E402
from minferd.kernels.gemm_f16 import CONFIGS, SUPPORTED, fused_b, gemm_w16, pick_config  # noqa: E402
from minferd.kernels.quant import CUDA_TYPES, TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402

TOL = 1e-2  # the contract; f16 operands with f32 accumulation land near 3e-4
NAMES = CUDA_TYPES
ROWS = 67   # not a multiple of any tile's BN, odd (the scalar-store epilogue)


def k_pair(qt) -> tuple[int, int]:
    if qt.block_elems == 256:
        return 512, 768
    if qt.block_elems == 32:
        return 256, 288   # 288: a second raw chunk of one block
    return 40, 264        # float types: K % 32 != 0, a partial last k-step


def layouts(qt):
    """(tensor offset, row slice): first block even; odd (row 1); odd (tensor one block in)."""
    return ((0, slice(0, ROWS)), (0, slice(1, ROWS + 1)), (qt.block_bytes, slice(0, ROWS)))


def x16_of(rng, M: int, K: int):
    return cp.asarray(rng.standard_normal((M, K)).astype(np.float16))


def w16_of(qt, w, K: int):
    out = cp.empty((w.shape[0], K), cp.float16)
    dequant_f16(qt, w, out)
    return out


def run_w16(x16, w16, config=None):
    out = cp.full((x16.shape[0], w16.shape[0]), np.nan, cp.float32)
    gemm_w16(x16, w16, out, config=config)
    return out


def run_fused(qt, w, x16, config=None):
    out = cp.full((x16.shape[0], w.shape[0]), np.nan, cp.float32)
    fused_b(qt, w, x16, out, config=config)
    return out


def assert_bits_equal(got, want, what: str) -> None:
    g, w = cp.asnumpy(got), cp.asnumpy(want)
    assert np.isfinite(w).all(), f"{what}: gemm_w16 left non-finite outputs"
    assert np.isfinite(g).all(), f"{what}: fused_b left non-finite outputs"
    bad = np.argwhere(g.view(np.uint32) != w.view(np.uint32))
    assert bad.size == 0, (f"{what}: {len(bad)} of {g.size} outputs differ, first at {bad[0].tolist()}: "
                           f"fused {g[tuple(bad[0])]!r} w16 {w[tuple(bad[0])]!r}")


def rel_err(out, ref: np.ndarray) -> float:
    got = cp.asnumpy(out).astype(np.float64)
    assert np.isfinite(got).all(), "non-finite output (an element not written?)"
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def reference(qt, raw: np.ndarray, x16) -> np.ndarray:
    W = dequantize(qt, np.ascontiguousarray(raw), raw.shape[0], cp.asnumpy(x16).shape[1]).astype(np.float64)
    return cp.asnumpy(x16).astype(np.float64) @ W.T


def test_supported_is_every_cuda_type():
    assert SUPPORTED == frozenset(CUDA_TYPES)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("kind", [0, 1])
@pytest.mark.parametrize("name", NAMES)
def test_fused_bit_parity(name, kind, config, to_device):
    qt = TYPES[name]
    K = k_pair(qt)[kind]
    rng = np.random.default_rng(1000 * qt.ggml_id + 10 * kind + len(config))
    raw = random_blocks(qt, ROWS + 1, K, rng)
    for offset, sl in layouts(qt):
        w = to_device(raw, offset)[sl]
        w16 = w16_of(qt, w, K)
        for M in (1, 17, 128):
            x16 = x16_of(rng, M, K)
            assert_bits_equal(run_fused(qt, w, x16, config), run_w16(x16, w16, config),
                              f"{name} K={K} M={M} offset={offset} rows={sl.start}.. config {config}")


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0", "Q8_0", "F16"])
def test_fused_bit_parity_many_tiles(name, to_device):
    """Several CTA tiles in both directions with partial last tiles, every config, and the
    default config pick; the 8-byte-store epilogue (N even)."""
    qt = TYPES[name]
    rng = np.random.default_rng(77 + qt.ggml_id)
    M, N = 300, 390
    K = 1024 if qt.is_quantized else 1000
    raw = random_blocks(qt, N + 1, K, rng)
    w = to_device(raw)[1:]
    w16 = w16_of(qt, w, K)
    x16 = x16_of(rng, M, K)
    ref = reference(qt, raw[1:], x16)
    outs = []
    for config in sorted(CONFIGS) + [None]:
        a, b = run_fused(qt, w, x16, config), run_w16(x16, w16, config)
        assert_bits_equal(a, b, f"{name} {M}x{N}x{K} config {config}")
        err = rel_err(a, ref)
        assert err < TOL, f"{name} config {config}: rel err {err:.2e}"
        outs.append(cp.asnumpy(a))
    # the k order is the same in every config: all configs agree bit for bit too
    for o in outs[1:]:
        assert np.array_equal(o.view(np.uint32), outs[0].view(np.uint32))


@pytest.mark.parametrize("name", NAMES)
def test_against_f64_reference(name, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(500 + qt.ggml_id)
    K = k_pair(qt)[1]
    raw = random_blocks(qt, ROWS + 1, K, rng)
    w = to_device(raw, qt.block_bytes)[1:]
    w16 = w16_of(qt, w, K)
    for M in (17, 128):
        x16 = x16_of(rng, M, K)
        ref = reference(qt, raw[1:], x16)
        for what, out in (("fused_b", run_fused(qt, w, x16)), ("gemm_w16", run_w16(x16, w16))):
            err = rel_err(out, ref)
            assert err < TOL, f"{name} {what} M={M}: rel err {err:.2e}"


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_real_7b_shape(name, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(7 + qt.ggml_id)
    M, N, K = 512, 18944, 3584
    raw = random_blocks(qt, N, K, rng)
    w = to_device(raw)
    w16 = w16_of(qt, w, K)
    x16 = x16_of(rng, M, K)
    a = run_fused(qt, w, x16)
    b = run_w16(x16, w16)
    assert_bits_equal(a, b, f"{name} {M}x{N}x{K} (config {pick_config(M, N, qt)})")
    cols = np.unique(np.concatenate([[0, N - 1], rng.integers(0, N, 256)]))
    ref = reference(qt, raw[cols], x16)
    err = rel_err(a[:, cp.asarray(cols)], ref)
    assert err < TOL, f"{name} {M}x{N}x{K}: rel err {err:.2e}"


def test_rejects_bad_arguments(to_device):
    qt = TYPES["Q4_K"]
    raw = random_blocks(qt, 8, 256, np.random.default_rng(3))
    w = to_device(raw)
    x16 = cp.zeros((4, 256), cp.float16)
    out = cp.empty((4, 8), cp.float32)
    with pytest.raises(ValueError):
        fused_b(qt, w, x16.astype(cp.float32), out)                    # x not f16
    with pytest.raises(ValueError):
        fused_b(qt, w, cp.zeros((4, 512), cp.float16), out)            # K vs row bytes
    with pytest.raises(ValueError):
        fused_b(qt, w, x16, cp.empty((4, 9), cp.float32))               # out shape
    with pytest.raises(ValueError):
        fused_b(qt, w, cp.zeros((4, 512), cp.float16)[:, :256], out)   # x not contiguous
    with pytest.raises(ValueError):
        gemm_w16(x16, cp.zeros((8, 128), cp.float16), out)             # w16 K
    with pytest.raises(ValueError):
        gemm_w16(x16, cp.zeros((8, 256), cp.float32), out)             # w16 dtype
