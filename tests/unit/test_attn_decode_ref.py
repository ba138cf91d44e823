"""attn_decode_ref (the NumPy reference the CUDA kernel is held to) against the plainest
attention there is: per sequence and query head, walk the positions one at a time through the
block table, softmax, weighted sum. NumPy only: runs in CI without a GPU."""
from __future__ import annotations

import math

import numpy as np
import pytest

from minferd.kernels.attn_decode import attn_decode_ref


def plain(q, K, V, bt, lens, bs, window, scale):
    B, hq, d = q.shape
    hkv = K.shape[1]
    out = np.zeros((B, hq * d))
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        first = max(0, n - window) if window else 0
        rows = [int(bt[b][t // bs]) * bs + t % bs for t in range(first, n)]
        for h in range(hq):
            kvh = h // (hq // hkv)
            s = [scale * float(np.dot(q[b, h].astype(np.float64), K[r, kvh].astype(np.float64))) for r in rows]
            mx = max(s)
            w = [math.exp(x - mx) for x in s]
            tot = sum(w)
            o = sum(wi * V[r, kvh].astype(np.float64) for wi, r in zip(w, rows)) / tot
            out[b, h * d:(h + 1) * d] = o
    return out


def make(rng, lens, hq, hkv, d, bs):
    need = [-(-n // bs) for n in lens]
    n_blocks = sum(need) + 3
    perm = rng.permutation(n_blocks).astype(np.int32)
    bt = np.full((len(lens), max(max(need), 1) + 1), -7, np.int32)  # unused entries: garbage
    at = 0
    for b, k in enumerate(need):
        bt[b, :k] = perm[at:at + k]
        at += k
    K = rng.standard_normal((n_blocks * bs, hkv, d)).astype(np.float16)
    V = rng.standard_normal((n_blocks * bs, hkv, d)).astype(np.float16)
    q = (rng.standard_normal((len(lens), hq, d)) * 2).astype(np.float32)
    return q, K, V, bt, np.asarray(lens, np.int32)


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 1), (7, 1), (6, 2)])
@pytest.mark.parametrize("window", [0, 5, 40])
def test_ref_matches_plain_attention(hq, hkv, window):
    rng = np.random.default_rng(hq * 100 + hkv * 10 + window)
    bs, d = 16, 32
    lens = [1, bs - 1, bs, bs + 1, 0, 70]
    q, K, V, bt, lens = make(rng, lens, hq, hkv, d, bs)
    got = attn_decode_ref(q, K, V, bt, lens, block_size=bs, window=window, scale=d ** -0.5)
    want = plain(q, K, V, bt, lens, bs, window, d ** -0.5)
    assert got.shape == (len(lens), hq * d)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert (got[4] == 0).all()  # the padding row


def test_ref_is_independent_of_physical_placement():
    """The same logical sequence in other physical blocks gives the same output; a single key
    gives exactly its value row."""
    rng = np.random.default_rng(1)
    bs, d = 16, 64
    q, K, V, bt, lens = make(rng, [37, 1], 4, 2, d, bs)
    a = attn_decode_ref(q, K, V, bt, lens, block_size=bs, window=0, scale=0.1)
    # move every used block to a new place, permuting the table to match
    n_blocks = K.shape[0] // bs
    moved = rng.permutation(n_blocks)
    K2, V2 = np.empty_like(K), np.empty_like(V)
    for old, new in enumerate(moved):
        K2[new * bs:(new + 1) * bs] = K[old * bs:(old + 1) * bs]
        V2[new * bs:(new + 1) * bs] = V[old * bs:(old + 1) * bs]
    bt2 = np.where(bt >= 0, moved[np.clip(bt, 0, None)], bt).astype(np.int32)
    b = attn_decode_ref(q, K2, V2, bt2, lens, block_size=bs, window=0, scale=0.1)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    slot = int(bt[1, 0]) * bs
    np.testing.assert_allclose(a[1].reshape(4, d)[0], V[slot, 0].astype(np.float64), rtol=1e-12)
