"""The serving engine on the CUDA backend: batched decode graphs per bucket equal the eager
pass, batched sequences keep their solo greedy tokens within the paths' agreement, and the
ledger equals CuPy's pool through a batch of clients."""
from __future__ import annotations

import threading

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except cp.cuda.runtime.CUDARuntimeError:
    pytest.skip("no CUDA device", allow_module_level=True)

from minferd.backend.batch import Batch  # noqa: E402
from minferd.backend.cuda import CudaBackend  # noqa: E402
from minferd.devices import cuda_traits  # noqa: E402
from minferd.host import Host, LoadOptions  # noqa: E402
from minferd.model.generate import generate  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402
from minferd.model.sampler import SamplingParams  # noqa: E402
from tests.unit.test_engine import all_at_once, prompts  # noqa: E402 (the CPU tests' helpers)
from tests.unit.test_engine_caller_steps import threads_of_runs  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=24)


_loaded: list = []  # this test's local models, closed after it (a dropped one keeps its arena: LocalModel.close)


@pytest.fixture(autouse=True)
def _close_local_models():
    yield
    while _loaded:
        _loaded.pop().close()


def prefilled(model_file, path: str, B: int):
    """(model, backend, cache, step): B sequences of two distinct blocks each, their keys filled by a
    prefill of their own tokens, and the next decode step of each (one token)."""
    lm = load_local(model_file, path, device="cuda", ctx=256)
    _loaded.append(lm)
    m, be = lm.model, lm.model.be
    cache = m.new_cache(be.untracked(), (2 * B + 1) * 32)  # two blocks a sequence, and the padding block
    rng = np.random.default_rng(B)
    tables = [list(range(i * 2, i * 2 + 2)) for i in range(B)]
    lens = rng.integers(1, 60, B)
    m.forward_batch(Batch.build([(rng.integers(0, 1000, int(n)).tolist(), 0, t) for n, t in zip(lens, tables)], 32), cache)
    step = [([int(rng.integers(0, 1000))], int(n), t) for n, t in zip(lens, tables)]
    return m, be, cache, step


@pytest.mark.parametrize("path", ["w16", "mmq"])
@pytest.mark.parametrize("B", [1, 3, 8, 13, 40])
def test_decode_graph_of_a_bucket_equals_the_eager_pass(synth_model, B, path):
    m, be, cache, step = prefilled(str(synth_model("qwen2", "q4_k")), path, B)
    eager = be.to_host(m.forward_batch(Batch.build(step, 32, width=8), cache))
    graph = be.to_host(be.decode(m, Batch.build(step, 32, width=8), cache))
    again = be.to_host(be.decode(m, Batch.build(step, 32, width=8), cache))  # a replay
    assert graph.shape == (B, m.spec.n_vocab)
    # The eager pass of B rows and the graph of B's bucket may choose different matmul kernels
    # (the gate table is by row count: 40 rows against the 64-row bucket), so they agree within
    # the path tolerance, not bit for bit.
    assert np.abs(eager - graph).max() <= 2e-3 * np.abs(eager).max(), np.abs(eager - graph).max() / np.abs(eager).max()
    assert np.array_equal(graph, again)
    assert not any(g.eager for g in be.graphs.values())  # captured (cuBLAS too, for W16 past 8 rows)


def decode_step(model_file, path: str, B: int):
    """The logits of one decode step of B sequences (after a prefill of each) through a fresh
    backend's decode graph: a graph captured under the environment as it is now."""
    m, be, cache, step = prefilled(model_file, path, B)
    out = be.to_host(be.decode(m, Batch.build(step, 32, width=8), cache))
    assert not any(g.eager for g in be.graphs.values())
    return out


@pytest.mark.parametrize("path", ["w16", "mmq"])
@pytest.mark.parametrize("B", [1, 16, 128])
def test_programmatic_launch_changes_no_bit(synth_model, B, path, monkeypatch):
    """A decode graph captured with every node launched programmatically (kernels/launch.py:
    each kernel waits for the node before it in pdl_enter) replays to the same bits as the same
    bucket captured the ordinary way: the same kernels in the same order, only launched sooner."""
    outs = []
    for rows in ("0", "256"):
        monkeypatch.setenv("MINFERD_PDL", rows)
        outs.append(decode_step(str(synth_model("qwen2", "q4_k")), path, B))
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("quant", ["q4_k", "q8_0"])
@pytest.mark.parametrize("B", [13, 16, 32])
def test_tc_groups_decode_the_same(synth_model, quant, B, monkeypatch):
    """A decode graph of 9-32 rows whose q/k/v and gate/up share one tcgemv launch each gives the
    logits of the same graph launching them one by one, within the path tolerance (a group's K
    splits are counted over all its rows, so its sums may meet in another order)."""
    from minferd.kernels import tcgemv
    monkeypatch.setenv("MINFERD_PREFILL_KERNEL", "tc")
    grouped = []
    one_by_one, groups_at = tcgemv.tcgemv_group, tcgemv.groups_at

    def spy(qt, ws, *a, **kw):
        grouped.append(len(ws))
        return one_by_one(qt, ws, *a, **kw)

    monkeypatch.setattr(tcgemv, "tcgemv_group", spy)
    outs = []
    for on in (False, True):
        monkeypatch.setattr(tcgemv, "groups_at", groups_at if on else lambda *a, **kw: False)
        grouped.clear()
        outs.append(decode_step(str(synth_model("qwen2", quant)), "mmq", B))
        assert (max(grouped, default=1) > 1) == on, grouped
    assert np.abs(outs[0] - outs[1]).max() <= 2e-3 * np.abs(outs[0]).max()


@pytest.mark.parametrize("path", ["w16", "mmq"])
@pytest.mark.parametrize("arch,quant", [("qwen2", "q4_k"), ("llama", "q6_k"), ("gemma3", "q8_0")])
def test_one_row_prompts_the_same(synth_model, arch, quant, path, monkeypatch):
    """A prompt of 2-32 tokens through a graph of its rows that computes the last row's logits
    alone gives the logits of the graph that computes every row's, within the path tolerance
    (one row's output matmul is a mat-vec, the other's a 2-32-row kernel), the same greedy token
    where one wins clearly, and the same keys and values bit for bit (off: PROMPT_GRAPH_ROWS 0)."""
    from minferd.backend import cuda as cuda_backend
    rows = cuda_backend.PROMPT_GRAPH_ROWS
    rng = np.random.default_rng(len(arch) + len(quant))
    for n in (2, 5, 16, 32):
        ids = rng.integers(0, 1000, n).tolist()
        outs, kvs = [], []
        for on in (False, True):
            monkeypatch.setattr(cuda_backend, "PROMPT_GRAPH_ROWS", rows if on else 0)
            lm = load_local(str(synth_model(arch, quant)), path, device="cuda", ctx=256)
            _loaded.append(lm)
            m, be = lm.model, lm.model.be
            cache = m.new_cache(be.untracked(), 3 * 32)
            outs.append(be.to_host(be.run(m, Batch.build([(ids, 0, [0, 1])], 32, width=2), cache)))
            kvs.append([cp.asnumpy(t[:n]) for t in (cache.k[0], cache.v[-1])])
            assert be.graphs and all(not g.eager for g in be.graphs.values())
            assert any(len(k) == 4 and k[-1] == "one_row" for k in be.graphs) == on
        assert outs[1].shape == outs[0].shape == (1, m.spec.n_vocab)
        assert np.abs(outs[1] - outs[0]).max() <= 2e-3 * np.abs(outs[0]).max(), (arch, n)
        top2 = np.sort(outs[0][0])[-2:]
        if top2[1] - top2[0] > 4e-3 * np.abs(outs[0]).max():  # a clear winner: the same greedy token
            assert outs[1].argmax() == outs[0].argmax()
        assert all(np.array_equal(a, b) for a, b in zip(kvs[0], kvs[1]))


def tcgemv_rows(monkeypatch, fn: str) -> list[int]:
    """The rows (x16's) of every call of kernels/tcgemv.py's fn from now on, in a list that
    the caller may clear."""
    from minferd.kernels import tcgemv
    runs, one = [], getattr(tcgemv, fn)

    def spy(qt, w, x16, *a, **kw):
        runs.append(x16.shape[0])
        return one(qt, w, x16, *a, **kw)

    monkeypatch.setattr(tcgemv, fn, spy)
    return runs


@pytest.mark.parametrize("arch,quant", [("qwen2", "q4_k"), ("llama", "q6_k"), ("gemma3", "q8_0"),
                                        ("qwen3moe", "q4_k"), ("qwen2", "q3_k")])
@pytest.mark.parametrize("B", [3, 4, 8])
def test_tc_small_decodes_the_same(synth_model, arch, quant, B, monkeypatch):
    """A decode graph of 3-8 rows whose matmuls run tcgemv (where it decodes the type: not Q3_K,
    which keeps the mat-vec kernel, now reading x it quantizes itself; an MoE's experts keep their
    own kernels) gives the logits of the graph on the mat-vec kernels (MATVEC_ROWS = MMVQ_MAX_BATCH)
    within the path tolerance."""
    from minferd.backend import cuda_matmul
    runs = tcgemv_rows(monkeypatch, "tcgemv_group")
    outs = []
    for on in (False, True):
        monkeypatch.setattr(cuda_matmul, "MATVEC_ROWS", 2 if on else cuda_matmul.MMVQ_MAX_BATCH)
        runs.clear()
        outs.append(decode_step(str(synth_model(arch, quant)), "mmq", B))
        assert any(m <= 8 for m in runs) == (on and quant != "q3_k"), runs
    assert np.abs(outs[0] - outs[1]).max() <= 2e-3 * np.abs(outs[0]).max()


@pytest.mark.parametrize("arch,quant", [("qwen2", "q5_0"), ("qwen2", "q4_k"), ("gemma3", "q8_0"), ("llama", "q3_k")])
@pytest.mark.parametrize("B", [16, 128])
def test_graph_tiles_decode_the_same(synth_model, arch, quant, B, monkeypatch):
    """A decode graph of a quantized plan whose matmuls run dequantized tiles through cuBLAS
    (MINFERD_PREFILL_KERNEL makes it every matmul past 8 rows), in tiles of a few rows
    (GRAPH_UNPACK_BYTES shrunk: several tiles a matrix, each kept by the graph), gives the logits
    of the graph on fused_b, within the path tolerance."""
    from minferd.backend import cuda_matmul
    tiles, one = [], cuda_matmul.gemm_tiles

    def spy(qt, w, x16, out, tile_rows, *a):
        if tile_rows != cuda_matmul.DEQUANT_ROWS:  # inside a graph (eager prefills keep DEQUANT_ROWS)
            tiles.append((w.shape[0], tile_rows, x16.shape[1]))
        return one(qt, w, x16, out, tile_rows, *a)

    monkeypatch.setattr(cuda_matmul, "gemm_tiles", spy)
    monkeypatch.setattr(cuda_matmul, "GRAPH_UNPACK_BYTES", 16 << 10)
    monkeypatch.setattr(cuda_matmul, "GRAPH_TILE_MIN_ROWS", 1)
    outs = []
    for on in (False, True):
        monkeypatch.setenv("MINFERD_PREFILL_KERNEL", "tiles" if on else "fused_b")
        tiles.clear()
        outs.append(decode_step(str(synth_model(arch, quant)), "mmq", B))
        assert bool(tiles) == on, tiles
        assert all(rows * 2 * K <= (16 << 10) or rows == 1 for _, rows, K in tiles), tiles
        assert not on or any(n > rows for n, rows, _ in tiles), tiles  # some matrix took several tiles
    assert np.abs(outs[0] - outs[1]).max() <= 2e-3 * np.abs(outs[0]).max()


@pytest.mark.parametrize("quant,B", [("q6_k", 1), ("q6_k", 4), ("q4_k_m", 1)])
def test_wide_units_decode_the_same(synth_model, quant, B, monkeypatch):
    """A decode graph whose one-column Q6_K mat-vecs run in the wide unit (cuda_matmul's
    WIDE_MAX_K) against the default unit: the same products summed in another order, so the
    logits agree within the paths' tolerance and pick the same greedy tokens."""
    from minferd.backend import cuda_matmul
    outs = []
    for max_k in ({}, cuda_matmul.WIDE_MAX_K):
        monkeypatch.setattr(cuda_matmul, "WIDE_MAX_K", max_k)
        outs.append(decode_step(str(synth_model("llama", quant)), "mmq", B))
    assert np.abs(outs[0] - outs[1]).max() <= 1e-3 * np.abs(outs[0]).max()
    assert np.array_equal(outs[0].argmax(-1), outs[1].argmax(-1))


@pytest.mark.parametrize("path", ["w16", "mmq"])
def test_a_short_step_with_prefill_runs_as_decode_rows(synth_model, path):
    """A step of a prefill chunk after cached keys (a prefix hit), a whole short prompt and a
    decoding sequence, 54 tokens in all, replays the 64-row decode graph with each token a row:
    its last-token logits equal the eager mixed pass's, and its K/V land where that pass's do."""
    lm = load_local(str(synth_model("qwen2", "q4_k")), path, device="cuda", ctx=256)
    _loaded.append(lm)
    m, be = lm.model, lm.model.be
    rng = np.random.default_rng(3)
    tables = [[0, 1, 2], [3, 4], [5]]
    ids = [rng.integers(0, 1000, n).tolist() for n in (70, 33, 9)]
    written = [32 * blk + i for table, n in zip(tables, (70, 33, 9)) for j, blk in enumerate(table)
               for i in range(32) if 32 * j + i < n]
    outs, kvs = [], []
    for how in ("eager", "rows"):
        cache = m.new_cache(be.untracked(), 8 * 32)
        m.forward_batch(Batch.build([(ids[0][:50], 0, tables[0]), (ids[2][:8], 0, tables[2])], 32), cache)
        step = Batch.build([(ids[0][50:], 50, tables[0]), (ids[1], 0, tables[1]), (ids[2][8:], 8, tables[2])], 32,
                           width=8)
        assert len(step.ids) == 20 + 33 + 1 and not step.is_decode
        logits = m.forward_batch(step, cache) if how == "eager" else be.run(m, step, cache)
        outs.append(be.to_host(logits))
        # Only the slots the tokens wrote: a fresh cache is not cleared, and the rest holds
        # whatever the allocation held before.
        kvs.append(cp.asnumpy(cache.k[1][cp.asarray(written)]).astype(np.float32))
    assert outs[1].shape == (3, m.spec.n_vocab)
    for a, b in ((outs[0], outs[1]), (kvs[0], kvs[1])):
        assert np.abs(a - b).max() <= 2e-3 * np.abs(a).max(), np.abs(a - b).max() / np.abs(a).max()
    assert any(k[1] == 64 and not g.eager for k, g in be.graphs.items())


def test_batched_sequences_keep_their_solo_tokens(synth_model, device_memory):
    path = str(synth_model("qwen2", "q4_k"))
    mem = device_memory(limit=8 << 30)
    h = Host(lambda **kw: CudaBackend(mem, **kw), mem, cuda_traits(), 8 << 30, w16_min_bytes=0, device="cuda:0")
    lm = h.load("m", path, LoadOptions(ctx=256, parallel=16))
    ps = prompts(lm.model.spec.n_vocab, [5, 31, 33, 64, 90, 17, 3, 120, 44, 70, 12, 8])
    out = [r.token_ids for r in all_at_once(h, "m", ps, GREEDY)]
    solo = [generate(lm.model, lm.ws.tokenizer, p, GREEDY, 256).token_ids for p in ps]
    # Batched matmuls take other kernels than a lone sequence's (cuBLAS on the f16 copy past 8
    # rows, the quantized mat-vec below): a near-tie of a random model's logits may go the other
    # way, after which a sequence diverges. Most of them agree wholly.
    agree = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(out, solo)]
    assert sum(a == len(o) for a, o in zip(agree, out)) >= 3 * len(ps) // 4, agree
    assert h.ledger.held() == h.allocator.held_bytes()
    assert lm.worker.counts()["blocks_used"] == 0
    h.unload("m")
    assert h.ledger.held() == 0


def test_a_mixed_step_attends_as_each_sequence_alone():
    """Decoding sequences (one new token) go through the block-table kernel together, a prefilling
    one over its gathered keys; each row equals the NumPy attention of its own sequence."""
    from minferd.backend.cpu import CpuBackend
    from minferd.backend.cuda import DeviceMemory
    rng = np.random.default_rng(0)
    hq, hkv, d, bs = 8, 2, 128, 16
    cpu, gpu = CpuBackend(2), CudaBackend(DeviceMemory())
    cc, gc = (b.alloc_kv(b.untracked(), 1, 12, bs, hkv, d) for b in (cpu, gpu))
    tables, lens = [[3, 9], [0, 5, 7], [11]], [20, 40, 9]
    for t, n in zip(tables, lens):
        k, v = (rng.standard_normal((n, hkv, d)).astype(np.float16).astype(np.float32) for _ in range(2))
        fill = Batch.build([(list(range(n)), 0, t)], bs)
        cpu.kv_write(cc, 0, fill, k, v)
        with gpu.scope():
            gpu.prepare(fill)
            gpu.kv_write(gc, 0, fill, cp.asarray(k), cp.asarray(v))
    # The first sequence runs its last 5 tokens again, the other two their last one.
    step = Batch.build([([0] * 5, 15, tables[0]), ([0], 39, tables[1]), ([0], 8, tables[2])], bs)
    q = rng.standard_normal((7, hq, d)).astype(np.float32)
    want = cpu.attention(q, cc, 0, step, 0, 0.1)
    with gpu.scope():
        gpu.prepare(step)
        got = cp.asnumpy(gpu.attention(cp.asarray(q), gc, 0, step, 0, 0.1))
    assert np.abs(got - want).max() / np.abs(want).max() < 2e-3


@pytest.mark.parametrize("path", ["w16", "mmq"])
def test_caller_steps_replay_on_the_requests_thread(synth_model, device_memory, path, monkeypatch):
    """caller_steps (engine.py's turn): a request that finds its engine idle runs its first step
    on its own thread where that step replays a graph captured already, with the tokens the
    engine's thread gives the same prompt (a load of its own: no prefix-cache hit); a step whose
    graph is not captured yet (its capture would make the request thread's own cuBLAS handle)
    stays the engine thread's. Prompts of 1 (the decode graph), 16 (a one_row graph), 100 (a
    graph of decode rows) and 300 tokens (a prefill graph)."""
    from minferd.devices import MatmulPath
    from minferd.engine import engine
    monkeypatch.setattr(engine, "TURN_WAIT_S", 10.0)  # a request right after one ended waits for the engine's step end
    mem = device_memory(limit=8 << 30)
    h = Host(lambda **kw: CudaBackend(mem, **kw), mem, cuda_traits(), 8 << 30, w16_min_bytes=0, device="cuda:0")
    me = threading.current_thread().name

    def run(caller: bool) -> dict:
        lm = h.load("m", str(synth_model("qwen2", "q4_k")), LoadOptions(MatmulPath(path), ctx=512))
        be, names, got = lm.model.be, threads_of_runs(lm), {}
        for n in (1, 16, 100, 300):
            first, second = prompts(lm.model.spec.n_vocab, [n, n], seed=n)
            names.clear()
            h.generate("m", first, GREEDY)  # its shapes' graphs captured, on the engine's thread
            assert me not in names, (n, names[:4])
            lm.worker.caller_steps = caller
            names.clear()
            got[n] = (h.generate("m", second, GREEDY).token_ids, list(names))
            lm.worker.caller_steps = True
        assert not any(g.eager for g in be.graphs.values())
        assert h.ledger.held() == h.allocator.held_bytes()
        h.unload("m")
        assert h.ledger.held() == 0
        return got

    want, got = run(False), run(True)
    for n, (tokens, names) in got.items():
        assert tokens == want[n][0], n
        assert me not in want[n][1], (n, want[n][1][:4])
        assert names[0] == me and me not in names[1:], (n, names[:4])
