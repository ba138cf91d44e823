"""The decode step's fused kernels against the unfused ones they replace: the same values
(bit for bit where the arithmetic is the same), so a fusion can never change what a model says.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.backend import cuda_matmul  # noqa: E402
from minferd.backend.batch import Batch  # noqa: E402
from minferd.backend.base import Weight  # noqa: E402
from minferd.backend.cuda import CudaBackend, DeviceMemory  # noqa: E402
from minferd.kernels.cublas import gemm_f32  # noqa: E402
from minferd.kernels.mmvq import mmvq, quantize_x, scratch_bytes, xq_layout  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402

rng = np.random.default_rng(5)


def vec(a) -> Weight:
    return Weight("v", TYPES["F32"], (a.shape[-1],), cp.asarray(a, cp.float32), None)


def written(s, n: int, K: int) -> np.ndarray:
    """The bytes of an (n, K) mat-vec scratch that a kernel writes: both int8 planes and each
    row's K / 32 (d, sum) pairs, not the pairs that pad a row to kbp (never written: an arena's
    scratch holds whatever its memory held before, s24's flaky K = 2880 case)."""
    s = np.asarray(s)
    off, kbp, _ = xq_layout(n, K)
    rows = [s[off + c * kbp * 8: off + c * kbp * 8 + K // 32 * 8] for c in range(n)]
    return np.concatenate([s[:2 * n * K]] + rows)


def quantized(x):
    s = cp.zeros(scratch_bytes(*x.shape), cp.uint8)
    quantize_x(cp.ascontiguousarray(x), s)
    return written(cp.asnumpy(s), *x.shape)


@pytest.fixture
def be(monkeypatch):
    # On the null stream, where these tests make their inputs: the backend's own stream is
    # non-blocking and would not wait for those uploads (s14: rope_kv once read a stale buffer).
    # The fused kernels take up to 8 rows; the backend hands them cuda_matmul.MATVEC_ROWS (2:
    # past it tcgemv reads the f16 copy), so these tests raise it to hold every row count to the format.
    monkeypatch.setattr(cuda_matmul, "MATVEC_ROWS", cuda_matmul.MMVQ_MAX_BATCH)
    b = CudaBackend(DeviceMemory())
    b.stream = cp.cuda.Stream.null
    return b


def test_past_matvec_rows_a_norm_leaves_no_matvec_format():
    """3 rows: the matmuls after the norm run tcgemv on the f16 copy, so no int8 copy is made."""
    b = CudaBackend(DeviceMemory())
    b.stream = cp.cuda.Stream.null
    x = cp.asarray(rng.standard_normal((cuda_matmul.MATVEC_ROWS + 1, 512)).astype(np.float32))
    with b.scope():
        b.rmsnorm(x, vec(np.ones(512, np.float32)), 1e-6)
        assert b._xq is None
        b.rmsnorm(x[:cuda_matmul.MATVEC_ROWS], vec(np.ones(512, np.float32)), 1e-6)
        assert b._xq is not None


# Widths where rmsnorm_q's norm_ctas(d) CTAs leave warps idle (256, 896), give each one block (3584,
# 8192) or more (18944: 2.3 a warp).
@pytest.mark.parametrize("n,d", [(1, 3584), (3, 640), (8, 1024), (1, 2048), (2, 2880), (1, 256), (1, 896),
                                 (2, 4096), (1, 8192), (1, 18944)])
def test_rmsnorm_leaves_quantize_x_format(be, n, d):
    x = cp.asarray(rng.standard_normal((n, d)).astype(np.float32))
    w = vec(rng.standard_normal(d).astype(np.float32))
    with be.scope():
        out = be.rmsnorm(x, w, 1e-6)
        assert be._xq[1] is out
        fused = written(cp.asnumpy(be._quantized(out)), n, d)  # the scratch rmsnorm_q wrote (a hit)
    ref = cp.asnumpy(x) / np.sqrt(np.mean(cp.asnumpy(x) ** 2, axis=-1, keepdims=True) + 1e-6) * cp.asnumpy(w.data)
    np.testing.assert_allclose(cp.asnumpy(out), ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(fused, quantized(out))


@pytest.mark.parametrize("n,d", [(3, 896), (16, 3584), (64, 4096), (9, 18944), (5, 2880)])
def test_short_rows_norm_as_rmsnorm_f32(n, d):
    """3-64 rows (a short prefill, a batch of 3-64 sequences) take rmsnorm_h over norm_ctas(d) CTAs:
    rmsnorm_f32's values but for the order of the sum of squares, and the f16 the next matmul
    reads (be._as_f16 finds it, no cast launch) equal to the cast of them."""
    from minferd.backend.cuda_ops import RMSNORM_CTAS, _norm
    be = CudaBackend(DeviceMemory())  # the backend's own MATVEC_ROWS: past it, 3-8 rows take this norm too
    be.stream = cp.cuda.Stream.null
    x = cp.asarray(rng.standard_normal((n, d)).astype(np.float32))
    w = vec(rng.standard_normal(d).astype(np.float32))
    want, want16 = cp.empty_like(x), cp.empty(x.shape, cp.float16)
    _norm("rmsnorm_f32")((n, RMSNORM_CTAS), (256,), (x, w.data, want, np.int32(d), np.float32(1e-6), want16))
    with be.scope():
        out = be.rmsnorm(x, w, 1e-6)
        assert be._x16[1] is out
        out16 = cp.asnumpy(be._as_f16(out))
    np.testing.assert_allclose(cp.asnumpy(out), cp.asnumpy(want), rtol=2e-6, atol=1e-7)
    assert np.array_equal(out16, cp.asnumpy(out).astype(np.float16))


@pytest.mark.parametrize("n", [1, 8])  # rows of a decode step's picks (tokens x k)
def test_act_gate_oai_is_swiglu_oai(be, n):
    """act_gate_q's act 2 (gpt-oss's clamped SwiGLU) equals the elementwise swiglu_oai bit for bit,
    and leaves quantize_x's format of it (gpt-oss's MoE decode)."""
    g, u = (cp.asarray((rng.standard_normal((n, 2880)) * 6).astype(np.float32)) for _ in range(2))
    with be.scope():
        y = be._act_gate(g, u, 2, 1.702, 7.0)
        fused = written(cp.asnumpy(be._quantized(y)), n, 2880)
        want = be.swiglu_oai(g, u, 1.702, 7.0)
    assert cp.array_equal(y, want)
    assert np.array_equal(fused, quantized(y))


def test_swiglu_oai_leaves_its_f16(be):
    """A prefill's swiglu_oai: y bit for bit the f32-only kernel's, and the f16 the next matmul
    reads (be._as_f16 finds it, no cast launch) equal to the cast of it."""
    from minferd.backend.cuda_ops import _swiglu_oai
    g, u = (cp.asarray((rng.standard_normal((300, 2880)) * 6).astype(np.float32)) for _ in range(2))
    want = cp.empty_like(g)
    _swiglu_oai(g, u, np.float32(1.702), np.float32(7.0), want)
    with be.scope():
        y = be.swiglu_oai(g, u, 1.702, 7.0)
        assert be._x16[1] is y
        y16 = be._as_f16(y)
        assert y16 is be._x16[2]
        assert cp.array_equal(y, want) and cp.array_equal(y16.view(cp.uint16), want.astype(cp.float16).view(cp.uint16))


@pytest.mark.parametrize("n", [1, 5, 40])  # rows of both: <= 64 share RMSNORM_CTAS CTAs a row, more take one
def test_rmsnorm_pair_is_two_rmsnorms(be, n):
    """q's and k's head norms in one launch (rmsnorm_pair) equal the two rmsnorm launches bit for
    bit."""
    q, k = (cp.asarray(rng.standard_normal((n, h, 128)).astype(np.float32) * 3) for h in (16, 4))
    wq, wk = (vec(rng.standard_normal(128).astype(np.float32)) for _ in range(2))
    with be.scope():
        got_q, got_k = be.rmsnorm_pair(q, wq, k, wk, 1e-6)
        want_q, want_k = be.rmsnorm(q, wq, 1e-6), be.rmsnorm(k, wk, 1e-6)
        assert cp.array_equal(got_q, want_q) and cp.array_equal(got_k, want_k)


@pytest.mark.parametrize("n,k,H", [(1, 8, 2048), (5, 4, 2880), (8, 2, 64)])
def test_combine_norm_is_combine_then_rmsnorm(be, n, k, H):
    """combine_rmsnorm_q's sum equals moe.combine's and the next rmsnorm of it (handed over, not
    launched) rmsnorm_q's, with its mat-vec format, bit for bit."""
    from minferd.kernels import moe as moe_kernels
    y = cp.asarray(rng.standard_normal((n * k, H)).astype(np.float32))
    wts = cp.asarray(rng.random(n * k).astype(np.float32))
    res = cp.asarray(rng.standard_normal((n, H)).astype(np.float32) * 4)
    w = vec(rng.standard_normal(H).astype(np.float32))
    with be.scope():
        total = be.combine_norm(y, wts, k, res, w, 1e-6)
        got = be.rmsnorm(total, w, 1e-6)
        assert be._normed_ahead is None and be._xq[1] is got
        fused = written(cp.asnumpy(be._quantized(got)), n, H)
        want_total = moe_kernels.combine(y, wts, k, res)
        want = be.rmsnorm(want_total, w, 1e-6)
        assert be._xq[1] is want
        assert cp.array_equal(total, want_total) and cp.array_equal(got, want)
        assert np.array_equal(fused, written(cp.asnumpy(be._quantized(want)), n, H))


@pytest.mark.parametrize("act", ["swiglu", "gelu_gate"])
def test_act_gate_leaves_quantize_x_format(be, act):
    g, u = (cp.asarray(rng.standard_normal((2, 1024)).astype(np.float32)) for _ in range(2))
    with be.scope():
        y = getattr(be, act)(g, u)
        fused = written(cp.asnumpy(be._quantized(y)), 2, 1024)
    big_g, big_u = cp.concatenate([g] * 8), cp.concatenate([u] * 8)  # 16 rows: the elementwise path
    with be.scope():
        ref = getattr(be, act)(big_g, big_u)[:2]
    np.testing.assert_allclose(cp.asnumpy(y), cp.asnumpy(ref), rtol=1e-6, atol=1e-7)
    assert np.array_equal(fused, quantized(y))


@pytest.mark.parametrize("neox", [True, False])
def test_rope_kv_equals_rope_then_kv_write(be, neox):
    n, hq, hkv, d = 5, 8, 2, 128
    q, k, v = (rng.standard_normal((n, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
    ff = cp.asarray(rng.uniform(1, 4, d // 2).astype(np.float32))
    batch = Batch.build([(list(range(n)), 3, [2, 0])], 4)  # positions 3..7 over blocks 2, 0: slots 11, 0..3
    caches = [be.alloc_kv(be.untracked(), 1, 3, 4, hkv, d) for _ in range(2)]
    for c in caches:
        c.k[0].fill(0)
        c.v[0].fill(0)
    with be.scope():
        be.prepare(batch)
        pos = batch.dev["positions"]
        fused_q = be.rope_kv(cp.asarray(q), cp.asarray(k), cp.asarray(v), caches[0], 0, batch, 1e4, 0.5, neox, ff)
        ref_q = be.rope(cp.asarray(q), pos, 1e4, 0.5, neox, ff)
        be.kv_write(caches[1], 0, batch, be.rope(cp.asarray(k), pos, 1e4, 0.5, neox, ff), cp.asarray(v))
    assert list(batch.slots) == [11, 0, 1, 2, 3]
    assert np.array_equal(cp.asnumpy(fused_q), cp.asnumpy(ref_q))
    for a, b in ((caches[0].k[0], caches[1].k[0]), (caches[0].v[0], caches[1].v[0])):
        assert np.array_equal(cp.asnumpy(a), cp.asnumpy(b))


@pytest.mark.parametrize("n,hq,hkv,d", [(128, 32, 4, 128), (130, 8, 2, 256), (300, 4, 1, 64), (129, 6, 2, 96)])
@pytest.mark.parametrize("neox", [True, False])
def test_norm_rope_kv_is_rmsnorm_pair_then_rope_kv(be, n, hq, hkv, d, neox):
    """A prefill's rope_kv with qk_norm (ops.cu norm_rope_kv, one warp a head, from
    NORM_ROPE_MIN_ROWS tokens) equals rmsnorm_pair then rope_kv: q and the cache's k and v bit for
    bit (s16 ran it at 1-40 tokens on the H200 with the same result)."""
    from minferd.backend.cuda_ops import NORM_ROPE_MIN_ROWS
    assert n >= NORM_ROPE_MIN_ROWS
    q, k, v = (rng.standard_normal((n, h, d)).astype(np.float32) * 3 for h in (hq, hkv, hkv))
    wq, wk = (vec(rng.standard_normal(d).astype(np.float32)) for _ in range(2))
    ff = cp.asarray(rng.uniform(1, 4, d // 2).astype(np.float32))
    batch = Batch.build([(list(range(n)), 3, list(range(n // 4 + 2)))], 4)
    caches = [be.alloc_kv(be.untracked(), 1, n // 4 + 2, 4, hkv, d) for _ in range(2)]
    for c in caches:
        c.k[0].fill(0)
        c.v[0].fill(0)
    with be.scope():
        be.prepare(batch)
        fused = be.rope_kv(cp.asarray(q), cp.asarray(k), cp.asarray(v), caches[0], 0, batch, 1e4, 0.5, neox, ff,
                           qk_norm=(wq, wk, 1e-6))
        nq, nk = be.rmsnorm_pair(cp.asarray(q), wq, cp.asarray(k), wk, 1e-6)
        two = be.rope_kv(nq, nk, cp.asarray(v), caches[1], 0, batch, 1e4, 0.5, neox, ff)
        assert cp.array_equal(fused, two)
    for a, b in ((caches[0].k[0], caches[1].k[0]), (caches[0].v[0], caches[1].v[0])):
        assert np.array_equal(cp.asnumpy(a), cp.asnumpy(b))
    assert np.abs(cp.asnumpy(caches[0].k[0])).max() > 0


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "F16"])
def test_mmvq_bias_and_residual(name):
    qt = TYPES[name]
    n, rows, K = 3, 77, 512
    w = cp.asarray(random_blocks(qt, rows, K, rng))
    x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(rows).astype(np.float32))
    res = cp.asarray(rng.standard_normal((n, rows)).astype(np.float32))
    plain, fused = cp.empty((n, rows), cp.float32), cp.empty((n, rows), cp.float32)
    mmvq(qt, w, x, plain)
    mmvq(qt, w, x, fused, bias=bias, residual=res)
    np.testing.assert_allclose(cp.asnumpy(fused), cp.asnumpy(plain + bias + res), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="bias"):
        mmvq(qt, w, x, fused, bias=bias[:5])


def test_gemm_f32_matches_f64_and_writes_column_slices():
    a = rng.standard_normal((300, 256)).astype(np.float16)
    b = rng.standard_normal((200, 256)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    out = cp.full((300, 450), np.nan, cp.float32)
    gemm_f32(cp.asarray(a), cp.asarray(b), out[:, 100:300])
    got = cp.asnumpy(out)
    assert np.linalg.norm(got[:, 100:300] - ref) / np.linalg.norm(ref) < 1e-6
    assert np.isnan(got[:, :100]).all() and np.isnan(got[:, 300:]).all()


def test_small_batch_quantizes_a_shared_input_once(be):
    """q/k/v read one normalised input: one int8 copy serves all three, made by rmsnorm_q."""
    x = cp.asarray(rng.standard_normal((1, 512)).astype(np.float32))
    ws = [Weight(f"w{i}", TYPES["Q4_K"], (512, 64), cp.asarray(random_blocks(TYPES["Q4_K"], 64, 512, rng)), None)
          for i in range(3)]
    with be.scope():
        h = be.rmsnorm(x, vec(np.ones(512, np.float32)), 1e-6)
        scratch = be._xq[2]
        outs = [be.matmul(h, w) for w in ws]
        assert be._xq[2] is scratch
    assert be._xq is None  # the pass's scope let it go
    for w, o in zip(ws, outs):
        ref = cp.empty_like(o)
        mmvq(w.qtype, w.data, h, ref)
        assert np.array_equal(cp.asnumpy(o), cp.asnumpy(ref))


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0"])
@pytest.mark.parametrize("n", [1, 3])
def test_mmvq_group_equals_separate_launches(name, n):
    """q/k/v-shaped matrices (and biases) in one launch == three launches, to f32 rounding
    (the group runs the largest matrix's kernel shape, so sums may be ordered differently)."""
    from minferd.kernels.mmvq import mmvq_group
    qt = TYPES[name]
    K = 1024
    ws = [cp.asarray(random_blocks(qt, rows, K, rng)) for rows in (640, 128, 128)]
    bs = [cp.asarray(rng.standard_normal(w.shape[0]).astype(np.float32)) for w in ws]
    x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
    outs = [cp.full((n, w.shape[0]), np.nan, cp.float32) for w in ws]
    mmvq_group(qt, ws, x, outs, biases=[bs[0], None, bs[2]])
    for w, b, o in zip(ws, [bs[0], None, bs[2]], outs):
        ref = cp.empty_like(o)
        mmvq(qt, w, x, ref, bias=b)
        np.testing.assert_allclose(cp.asnumpy(o), cp.asnumpy(ref), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="residual"):
        mmvq_group(qt, ws[:2], x, outs[:2], residual=outs[0])


def test_prefill_producers_write_the_f16_the_gemms_read(be):
    """rmsnorm and the gated activations of a prefill batch also write x's f16 rounding, bit for
    bit what x.astype(f16) gives, and the matmul that follows reads it instead of casting."""
    x = cp.asarray(rng.standard_normal((40, 512)).astype(np.float32))
    w = vec(rng.standard_normal(512).astype(np.float32))
    with be.scope():
        h = be.rmsnorm(x, w, 1e-6)
        assert be._x16[1] is h
        assert np.array_equal(cp.asnumpy(be._x16[2]).view(np.uint16), cp.asnumpy(h.astype(cp.float16)).view(np.uint16))
        assert be._as_f16(h) is be._x16[2]
        for act in ("swiglu", "gelu_gate"):
            y = getattr(be, act)(x, h)
            assert be._x16[1] is y
            assert np.array_equal(cp.asnumpy(be._x16[2]).view(np.uint16),
                                  cp.asnumpy(y.astype(cp.float16)).view(np.uint16))


@pytest.mark.parametrize("name,tile_rows", [("Q4_K", 4096), ("Q5_0", 1000), ("Q6_K", 7)])
def test_gemm_tiles_equals_cublas_on_the_copy(name, tile_rows):
    """The no-copy prefill (dequantized row tiles + cuBLAS) against cuBLAS on the whole f16 copy:
    the same f16 operands, so equal up to cuBLAS's summation order (its algorithm per tile shape)."""
    from minferd.kernels.dequant import dequant_f16
    from minferd.kernels.tiles import gemm_tiles
    qt = TYPES[name]
    w = cp.asarray(random_blocks(qt, 4500, 512, rng))
    w16 = cp.empty((4500, 512), cp.float16)
    dequant_f16(qt, w, w16)
    x16 = cp.asarray(rng.standard_normal((40, 512)).astype(np.float16))
    out = cp.full((40, 4500), np.nan, cp.float32)
    gemm_tiles(qt, w, x16, out, tile_rows)
    got, ref = cp.asnumpy(out), cp.asnumpy(gemm_f32(x16, w16))
    assert np.isfinite(got).all() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-6
