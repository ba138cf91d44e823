"""The CPU backend's ops against naive loop implementations of their definitions."""
import math

import numpy as np
import pytest

from minferd.backend.batch import Batch
from minferd.backend.cpu import CpuBackend
from minferd.kernels.quant import TYPES
from minferd.kernels.quantize_ref import quantize

be = CpuBackend(threads=2)
rng = np.random.default_rng(0)


def naive_attention(q, k, v, positions, window, scale):
    n, hq, d = q.shape
    group = hq // k.shape[1]
    out = np.zeros((n, hq, d))
    for i, p in enumerate(positions):
        for h in range(hq):
            keys = [j for j in range(p + 1) if not window or p - j < window]
            s = np.array([q[i, h] @ k[j, h // group] * scale for j in keys])
            w = np.exp(s - s.max())
            w /= w.sum()
            out[i, h] = sum(wj * v[j, h // group] for wj, j in zip(w, keys))
    return out.reshape(n, hq * d)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_gqa_causal_window(window):
    n_ctx, n, hq, hkv, d = 12, 5, 4, 2, 8
    cache = be.alloc_kv(be.untracked(), 1, 3, 4, hkv, d)
    k = rng.standard_normal((n_ctx, hkv, d)).astype(np.float32)
    v = rng.standard_normal((n_ctx, hkv, d)).astype(np.float32)
    be.kv_write(cache, 0, Batch.solo(range(n_ctx), 0, cache), k, v)
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    got = be.attention(q, cache, 0, Batch.solo(range(n), n_ctx - n, cache), window, 0.3)
    positions = np.arange(n_ctx - n, n_ctx)
    np.testing.assert_allclose(got, naive_attention(q, k, v, positions, window, 0.3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
def test_rope(neox):
    n, h, d, base = 3, 2, 8, 10000.0
    x = rng.standard_normal((n, h, d)).astype(np.float32)
    positions = np.array([0, 5, 17])
    got = be.rope(x, positions, base, 0.5, neox)
    want = np.empty_like(x)
    for i, p in enumerate(positions):
        for j in range(d // 2):
            theta = p * 0.5 * base ** (-2 * j / d)
            a, b = (j, j + d // 2) if neox else (2 * j, 2 * j + 1)
            want[i, :, a] = x[i, :, a] * math.cos(theta) - x[i, :, b] * math.sin(theta)
            want[i, :, b] = x[i, :, a] * math.sin(theta) + x[i, :, b] * math.cos(theta)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(be.rope(x, np.zeros(3, int), base, 1.0, neox), x)


def test_rmsnorm_and_gates():
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = be.upload(be.untracked(), "n", TYPES["F32"], (16,), (rng.standard_normal(16).astype(np.float32)).view(np.uint8))
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w.data
    np.testing.assert_allclose(be.rmsnorm(x, w, 1e-6), want, rtol=1e-5)
    g, u = x, x[::-1]
    np.testing.assert_allclose(be.swiglu(g, u), g / (1 + np.exp(-g)) * u, rtol=1e-5)
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    np.testing.assert_allclose(be.gelu_gate(g, u), gelu * u, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_0", "Q8_0", "Q6_K", "F16", "IQ4_NL", "IQ4_XS", "MXFP4"])
def test_matmul_and_embed_row_blocks(name):
    """Row blocks (and W16) give the dense product of the dequantized matrix, rows in order."""
    from minferd.kernels.dequant_ref import dequantize
    qt = TYPES[name]
    rows, k = 3000, 512  # several row blocks, the last one partial
    raw = quantize(qt, rng.standard_normal((rows, k)).astype(np.float32))
    w = be.upload(be.untracked(), "w", qt, (k, rows), raw)
    dense = dequantize(qt, raw, rows, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    np.testing.assert_allclose(be.matmul(x, w), x @ dense.T, rtol=1e-4, atol=1e-3)
    ids = np.array([0, 2999, 17, 17])
    assert np.array_equal(be.embed(ids, w), dense[ids])
    assert be.make_w16(w) == rows * k * 2
    np.testing.assert_allclose(be.matmul(x, w), x @ dense.astype(np.float16).astype(np.float32).T, rtol=1e-4, atol=1e-3)
    assert be.drop_w16(w) == rows * k * 2 and w.w16 is None


def test_paged_sequences_in_one_batch_attend_as_each_alone():
    """Two sequences over shuffled blocks of one cache, in one batch (a chunk of one, the decode
    step of the other), attend exactly as each does over a cache of its own."""
    bs, hkv, hq, d, window = 4, 1, 2, 4, 5
    paged = be.alloc_kv(be.untracked(), 1, 8, bs, hkv, d)
    tables, lens = [[5, 2, 7], [0, 6]], [10, 7]
    own = [be.alloc_kv(be.untracked(), 1, 3, bs, hkv, d) for _ in tables]
    for t, n, c in zip(tables, lens, own):
        k, v = (rng.standard_normal((n, hkv, d)).astype(np.float32) for _ in range(2))
        be.kv_write(paged, 0, Batch.build([(list(range(n)), 0, t)], bs), k, v)
        be.kv_write(c, 0, Batch.solo(range(n), 0, c), k, v)
    q = rng.standard_normal((4, hq, d)).astype(np.float32)  # three queries of the first, one of the second
    batch = Batch.build([([0, 0, 0], 7, tables[0]), ([0], 6, tables[1])], bs)
    got = be.attention(q, paged, 0, batch, window, 0.5)
    want0 = be.attention(q[:3], own[0], 0, Batch.solo([0, 0, 0], 7, own[0]), window, 0.5)
    want1 = be.attention(q[3:], own[1], 0, Batch.solo([0], 6, own[1]), window, 0.5)
    np.testing.assert_array_equal(got, np.concatenate([want0, want1]))
    assert list(batch.slots) == [2 * 4 + 3, 7 * 4 + 0, 7 * 4 + 1, 6 * 4 + 2]  # block * size + offset