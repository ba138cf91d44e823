"""The pending path qkv_rope (kernels/mmvq_rope_kv.py): a decode step's q / k / v mat-vecs ending in
rope_kv's work. The launch against mmvq_group then ops.cu's rope_kv bit for bit (q and both caches),
and whole models with the path on (q / k rows reordered, normal rope, no rope_kv node) against the
same files with it off, step by step."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.backend import cuda_matmul, pending  # noqa: E402
from minferd.backend.base import Weight  # noqa: E402
from minferd.backend.batch import Batch  # noqa: E402
from minferd.backend.cuda import CudaBackend, DeviceMemory  # noqa: E402
from minferd.kernels.mmvq import mmvq_group  # noqa: E402
from minferd.kernels.mmvq_rope_kv import ROPE, ROPE_K, V, shape  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from minferd.model.generate import decode_one, prefill  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402

rng = np.random.default_rng(11)


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(pending, "WAITING", pending.WAITING - {"qkv_rope"})


@pytest.fixture
def be():
    b = CudaBackend(DeviceMemory())
    b.stream = cp.cuda.Stream.null  # where the inputs are made (test_fused_ops says why)
    return b


def weight(name: str, rows: int, K: int) -> Weight:
    qt = TYPES[name]
    return Weight("w", qt, (K, rows), cp.asarray(random_blocks(qt, rows, K, rng)), None)


def vec(n: int) -> Weight:
    return Weight("b", TYPES["F32"], (n,), cp.asarray(rng.standard_normal(n).astype(np.float32)), None)


# (q / k type, v type, K, heads, kv heads, head size): the 7B's layer with v in Q4_K and in Q6_K (a
# launch of its own, wide at one column), and the 0.5B's Q5_0 whose few-rows shape has odd rows
# per group (the mid shape then: mmvq_rope_kv.shape).
CASES = [("Q4_K", "Q4_K", 1024, 8, 2, 128), ("Q4_K", "Q6_K", 1024, 8, 2, 128), ("Q5_0", "Q8_0", 896, 14, 2, 64)]


@pytest.mark.parametrize("qk,vt,K,hq,hkv,d", CASES)
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("extras", [False, True])  # biases and llama3's frequency factors
def test_the_launch_is_mmvq_then_rope_kv_bit_for_bit(be, on, qk, vt, K, hq, hkv, d, n, extras):
    ws = [weight(qk, hq * d, K), weight(qk, hkv * d, K), weight(vt, hkv * d, K)]
    biases = [vec(w.n_rows) for w in ws] if extras else [None] * 3
    ff = rng.uniform(1, 4, d // 2).astype(np.float32) if extras else None
    x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
    batch = Batch.build([([5], 7 + 40 * b, [2 * b + 1, 2 * b]) for b in range(n)], 32)  # positions 7, 47
    caches = [be.alloc_kv(be.untracked(), 1, 2 * n + 1, 32, hkv, d) for _ in range(2)]
    for c in caches:
        c.k[0].fill(0)
        c.v[0].fill(0)
    with be.scope():
        be.prepare(batch)
        fused = be.qkv_rope_kv(x, ws, biases, caches[0], 0, batch, 1e4, 0.5, ff)
        assert fused is not None
        # the same products, each run of one type in mmvq_group with the shape the fused launch took
        outs, modes = [], (ROPE, ROPE_K, V)
        for run in ([[0, 1, 2]] if qk == vt else [[0, 1], [2]]):
            part = [ws[i] for i in run]
            cfg = shape(part[0].qtype, n, [w.n_rows for w in part], K, [modes[i] for i in run])
            group = [cp.empty((n, w.n_rows), cp.float32) for w in part]
            mmvq_group(part[0].qtype, [w.data for w in part], x, group, config=cfg,
                       biases=[None if biases[i] is None else biases[i].data for i in run],
                       wide=cuda_matmul.wide_unit(part[0].qtype, K, n))
            outs += group
        q, k, v = (o.reshape(n, -1, d) for o in outs)
        ref = be.rope_kv(q, k, v, caches[1], 0, batch, 1e4, 0.5, False, ff)
    assert np.array_equal(cp.asnumpy(fused), cp.asnumpy(ref).reshape(n, -1))
    assert np.array_equal(cp.asnumpy(caches[0].k[0]), cp.asnumpy(caches[1].k[0]))
    assert np.array_equal(cp.asnumpy(caches[0].v[0]), cp.asnumpy(caches[1].v[0]))
    assert np.abs(cp.asnumpy(caches[0].k[0])).max() > 0  # the slots were written


def test_off_or_past_the_matvec_rows_it_declines(be, monkeypatch):
    ws = [weight("Q4_K", 1024, 1024), weight("Q4_K", 256, 1024), weight("Q4_K", 256, 1024)]
    cache = be.alloc_kv(be.untracked(), 1, 3, 32, 2, 128)
    batch = Batch.build([([5], 3, [0])], 32)
    with be.scope():
        be.prepare(batch)
        x = cp.ones((1, 1024), cp.float32)
        assert be.qkv_rope_kv(x, ws, [None] * 3, cache, 0, batch, 1e4, 1.0) is None  # pending: off
        monkeypatch.setattr(pending, "WAITING", pending.WAITING - {"qkv_rope"})
        wide = Batch.build([(list(range(4)), 3, [0])], 32)
        be.prepare(wide)
        assert be.qkv_rope_kv(cp.ones((4, 1024), cp.float32), ws, [None] * 3, cache, 0, wide, 1e4, 1.0) is None


def logits_by_step(path: str, steps: int = 12):
    """A prompt's prefill, then `steps` decode steps (eager, one token) teacher-forced with fixed
    tokens: each step's logits."""
    lm = load_local(path, "mmq", device="cuda", ctx=128)
    try:
        m = lm.model
        cache = m.new_cache(m.be.untracked(), 128)
        prefill(m, np.arange(300, 320), cache)
        out = [m.be.to_host(decode_one(m, 400 + t, cache))[0] for t in range(steps)]
        assert m.be.graphs and not any(g.eager for g in m.be.graphs.values())  # captured, the fused launch too
        return np.array(out), m.spec.rope_type
    finally:
        lm.close()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # neox (rows reordered) and normal rope
@pytest.mark.parametrize("quant", ["q4_k", "q8_0"])
def test_a_model_decodes_the_same_with_the_path_on(synth_model, arch, quant, monkeypatch):
    path = str(synth_model(arch, quant))
    off, rope_off = logits_by_step(path)
    monkeypatch.setattr(pending, "WAITING", pending.WAITING - {"qkv_rope"})
    calls, real = [], CudaBackend.qkv_rope_kv

    def counted(self, *a, **k):
        calls.append(real(self, *a, **k))
        return calls[-1]

    monkeypatch.setattr(CudaBackend, "qkv_rope_kv", counted)
    got, rope_on = logits_by_step(path)
    assert rope_on == "normal" and (rope_off == "neox") == (arch == "qwen2")
    assert calls and calls[-1] is not None  # the decode steps took the fused launch (their graph's capture)
    # the same products; attention's dot products meet in another order where the rows were reordered
    assert np.abs(got - off).max() <= 1e-4 * np.abs(off).max()
    assert (got.argmax(-1) == off.argmax(-1)).all()


def test_the_launcher_refuses_bad_arguments(be):
    """Checked before anything is launched: each names the argument."""
    from minferd.kernels.mmvq_rope_kv import OUT, RopeCache, mmvq_rope_kv
    from minferd.kernels.mmvq import scratch_bytes
    w = weight("Q4_K", 256, 256).data
    x = cp.ones((1, 256), cp.float32)
    out = cp.empty((1, 256), cp.float32)
    scratch = cp.empty(scratch_bytes(1, 256), cp.uint8)
    k = cp.zeros((64, 2, 128), cp.float16)
    pos = slots = cp.zeros(1, cp.int32)
    rc = RopeCache(pos, slots, k, k, 128, 1e4, 1.0)
    cases = [
        (dict(modes=[ROPE, ROPE_K], outs=[out]), "a mode and an out slot each"),
        (dict(modes=[7], outs=[out]), "modes are OUT, ROPE, ROPE_K or V"),
        (dict(modes=[ROPE], outs=[None]), "needs its out"),
        (dict(modes=[OUT], outs=[cp.empty((1, 256), cp.float16)]), "out must be C-contiguous float32"),
        (dict(modes=[ROPE_K], outs=[None], rc=RopeCache(pos, slots, k.astype(cp.float32), k, 128, 1e4, 1.0)),
         "K cache must be C-contiguous float16"),
        (dict(modes=[ROPE], outs=[out], rc=RopeCache(pos, slots, k, k, 96, 1e4, 1.0)), "heads of 96"),
        (dict(modes=[ROPE], outs=[out], rc=RopeCache(pos.astype(cp.int64), slots, k, k, 128, 1e4, 1.0)),
         "positions must be contiguous int32"),
        (dict(modes=[OUT], outs=[out], wide=True), "no wide unit for Q4_K"),
    ]
    for kw, match in cases:
        args = dict(modes=kw.pop("modes"), outs=kw.pop("outs"), rc=kw.pop("rc", rc))
        ws = [w] * len(args["modes"]) if len(args["modes"]) == len(args["outs"]) else [w, w]
        with pytest.raises(ValueError, match=match):
            mmvq_rope_kv("Q4_K", ws, x, args["modes"], args["outs"], args["rc"], scratch=scratch, **kw)
