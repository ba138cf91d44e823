"""Prefill graphs (backend/cuda_graph.PrefillGraph): attn_prefill's PAGED kernel equals the
contiguous one bit for bit over a shuffled block table, its padding rows zeros; a one-sequence
prefill step of 257-1024 tokens through the graph of its bucket gives the eager pass's last-token
logits and K/V (a whole prompt, the rest of a prompt after a prefix hit, a longer one in pieces),
replays for another length without a new capture; an f16 copy dropped forgets the graphs that read it."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.backend.batch import Batch  # noqa: E402
from minferd.kernels.attn_prefill import attn_prefill, attn_prefill_paged  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402


@pytest.mark.parametrize("d,hq,hkv", [(64, 8, 2), (128, 28, 4), (256, 4, 1)])
@pytest.mark.parametrize("first,count,window", [(0, 300, 0), (96, 200, 0), (37, 450, 128)])
def test_paged_kernel_equals_contiguous(d, hq, hkv, first, count, window):
    rng = np.random.default_rng(d + first)
    bs, n = 32, 512
    L = first + count
    blocks = -(-L // bs)
    k = rng.standard_normal((L, hkv, d)).astype(np.float16)
    v = rng.standard_normal((L, hkv, d)).astype(np.float16)
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    # The paged cache: the sequence's blocks scattered over a larger pool.
    n_blocks = blocks + 7
    table = rng.permutation(n_blocks)[:blocks].astype(np.int32)
    Kp = rng.standard_normal((n_blocks * bs, hkv, d)).astype(np.float16)
    Vp = rng.standard_normal((n_blocks * bs, hkv, d)).astype(np.float16)
    pos = np.arange(L)
    slots = table[pos // bs] * bs + pos % bs
    Kp[slots], Vp[slots] = k, v
    want = cp.full((count, hq * d), np.nan, cp.float32)
    attn_prefill(cp.asarray(q[:count]), cp.asarray(k), cp.asarray(v), want, first=first, lo=0, window=window, scale=0.125)
    got = cp.full((n, hq * d), np.nan, cp.float32)
    attn_prefill_paged(cp.asarray(q), cp.asarray(Kp), cp.asarray(Vp), got, cp.asarray(table),
                       cp.asarray(np.array([first, count], np.int32)), block_size=bs, window=window, scale=0.125)
    got = cp.asnumpy(got)
    assert np.array_equal(got[:count], cp.asnumpy(want))
    assert not got[count:].any()  # padding rows: zeros, NaN poison overwritten


def test_paged_kernel_checks_its_arguments():
    q = cp.zeros((64, 4, 64), cp.float32)
    K = cp.zeros((128, 2, 64), cp.float16)
    out = cp.zeros((64, 256), cp.float32)
    dims = cp.zeros(2, cp.int32)
    with pytest.raises(ValueError, match="table"):
        attn_prefill_paged(q, K, K, out, cp.zeros(4, cp.int64), dims, block_size=32, window=0, scale=1.0)
    with pytest.raises(ValueError, match="dims"):
        attn_prefill_paged(q, K, K, out, cp.zeros(4, cp.int32), cp.zeros(1, cp.int32), block_size=32, window=0, scale=1.0)
    with pytest.raises(ValueError, match="whole blocks"):
        attn_prefill_paged(q, K, K, out, cp.zeros(4, cp.int32), dims, block_size=48, window=0, scale=1.0)


def close(a, b, tol=2e-3) -> bool:
    return float(np.abs(a - b).max()) <= tol * float(np.abs(b).max())


@pytest.mark.parametrize("path", ["w16", "mmq"])
@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_a_prefill_step_through_its_graph_equals_the_eager_pass(synth_model, arch, path):
    lm = load_local(str(synth_model(arch, "q4_k")), path, device="cuda", ctx=2048)
    m, be = lm.model, lm.model.be
    rng = np.random.default_rng(5)
    table = [int(b) for b in rng.permutation(60)[:50]]  # 1600 positions, blocks scattered; 60 of 61: not the pad block
    # 300 and 450 tokens: the 512 graph; 700 the 1024 one; 1500 in two pieces (1024, then 476).
    cases = [(rng.integers(0, 1000, 300).tolist(), 0), (rng.integers(0, 1000, 700).tolist(), 0),
             (rng.integers(0, 1000, 450).tolist(), 0), (rng.integers(0, 1000, 1500).tolist(), 0)]
    cases.append((cases[0][0][:64] + rng.integers(0, 1000, 380).tolist(), 64))  # a prefix hit: its first 64 cached
    slots = lambda n: [table[p // 32] * 32 + p % 32 for p in range(n)]  # noqa: E731
    for ids, first in cases:
        outs, kvs = [], []
        for how in ("eager", "graph"):
            cache = m.new_cache(be.untracked(), 61 * 32)
            if first:  # the cached prefix, written by an eager pass
                m.forward_batch(Batch.build([(ids[:first], 0, table)], 32, width=50), cache)
            step = Batch.build([(ids[first:], first, table)], 32, width=50)
            logits = m.forward_batch(step, cache) if how == "eager" else be.run(m, step, cache)
            outs.append(be.to_host(logits))
            kvs.append(cp.asnumpy(cache.k[1][cp.asarray(slots(len(ids)))]).astype(np.float32))
        assert outs[1].shape == (1, m.spec.n_vocab)
        assert close(outs[1], outs[0]) and close(kvs[1], kvs[0]), (np.abs(outs[1] - outs[0]).max(), np.abs(outs[0]).max())
    # A cache per case: each its own graphs; within one cache a second length reuses the bucket's.
    cache = m.new_cache(be.untracked(), 61 * 32)
    n = len(be.graphs)
    for k in (300, 480):
        be.run(m, Batch.build([(rng.integers(0, 1000, k).tolist(), 0, table)], 32, width=50), cache)
    assert len(be.graphs) == n + 1 and all(not g.eager for g in be.graphs.values())


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_an_moe_prefill_through_its_graph_equals_the_eager_pass(synth_model, arch, monkeypatch):
    """With its layout made on the device (moe.align) an MoE prefill reads nothing back on
    the host, so its 257-1024-token steps replay graphs too (backend graph_safe), padding rows
    routed with the rest and left out of the logits."""
    monkeypatch.setenv("MINFERD_DEVICE_MOE", "1")
    lm = load_local(str(synth_model(arch, "q8_0")), "mmq", device="cuda", ctx=1024)
    m, be = lm.model, lm.model.be
    assert be.graph_safe(m, 512) and be.graph_safe(m, 8) and not be.graph_safe(m, 64)  # 9-256 rows: eager
    rng = np.random.default_rng(3)
    table = list(range(30))
    ids = rng.integers(0, 1000, 300).tolist()
    outs = []
    for how in ("eager", "graph"):
        cache = m.new_cache(be.untracked(), 31 * 32)
        step = Batch.build([(ids, 0, table)], 32, width=30)
        logits = m.forward_batch(step, cache) if how == "eager" else be.run(m, step, cache)
        outs.append(be.to_host(logits))
    assert be.graphs and all(not g.eager for g in be.graphs.values())
    assert close(outs[1], outs[0]), (np.abs(outs[1] - outs[0]).max(), np.abs(outs[0]).max())


def test_dropping_the_f16_copy_forgets_the_graphs(synth_model):
    lm = load_local(str(synth_model("qwen2", "q4_k")), "w16", device="cuda", ctx=1024)
    m, be = lm.model, lm.model.be
    rng = np.random.default_rng(9)
    cache = m.new_cache(be.untracked(), 41 * 32)
    tables = [list(range(2 * i, 2 * i + 2)) for i in range(16)]
    m.forward_batch(Batch.build([(rng.integers(0, 1000, 20).tolist(), 0, t) for t in tables], 32), cache)
    step = Batch.build([([int(rng.integers(0, 1000))], 20, t) for t in tables], 32, width=32)
    before = be.to_host(be.decode(m, step, cache))  # the 16-row graph: cuBLAS on the f16 copy
    assert be.graphs
    for w in lm.model.w.values():
        be.drop_w16(w)
    be.weights_changed()
    assert not be.graphs
    after = be.to_host(be.decode(m, step, cache))  # captured again, on the quantized kernels
    assert close(after, before, 2e-2)
