"""The serving engine on the CPU backend: batched sequences give each its solo greedy tokens,
prefix hits and preemption change no token, cancel frees blocks, and many clients on a small KV
all finish (minferd/engine/)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.devices import cpu_traits
from minferd.engine.blocks import BlockManager
from minferd.engine.sequence import Sequence
from minferd.host import Host, LoadOptions
from minferd.model.generate import generate
from minferd.model.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20)


def make_host():
    mem = HostMemory()
    return Host(lambda **kw: CpuBackend(2, mem, **kw), mem, cpu_traits(2), 1 << 30, w16_min_bytes=0)


def prompts(n_vocab, sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, size=n).tolist() for n in sizes]


def solo(lm, prompt, params=GREEDY):
    return generate(lm.model, lm.ws.tokenizer, prompt, params, lm.ctx).token_ids


def all_at_once(h, name, ps, params=GREEDY):
    out, errors = [None] * len(ps), []

    def go(i):
        try:
            out[i] = h.generate(name, ps[i], params)
        except Exception as e:  # noqa: BLE001 - collected and asserted on
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "llama", "qwen3moe", "gpt-oss"])
def test_batched_sequences_give_their_solo_tokens(synth_model, arch):
    h = make_host()
    lm = h.load("m", synth_model(arch), LoadOptions(ctx=256, parallel=8))
    ps = prompts(lm.model.spec.n_vocab, [3, 17, 31, 32, 33, 64, 90, 1])
    got = all_at_once(h, "m", ps)
    assert [r.token_ids for r in got] == [solo(lm, p) for p in ps]
    assert lm.worker.steps < sum(len(r.token_ids) for r in got)  # they did share passes
    h.unload("m")
    assert h.ledger.held() == 0 and h.allocator.held_bytes() == 0


def test_chunked_prefill_of_a_prompt_past_one_pass(synth_model):
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=1500))
    assert lm.model.max_batch == 512
    (p,) = prompts(lm.model.spec.n_vocab, [1200])
    assert h.generate("m", p, GREEDY).token_ids == solo(lm, p)


def test_a_prefix_hit_gives_the_tokens_of_a_cold_run(synth_model):
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=512))
    base, = prompts(lm.model.spec.n_vocab, [200])
    first = h.generate("m", base + [1, 2, 3], GREEDY)
    assert first.timings["cached_tokens"] == 0
    second = h.generate("m", base + [4, 5, 6], GREEDY)
    assert second.timings["cached_tokens"] == 192  # six whole blocks of the shared 200
    assert second.token_ids == solo(lm, base + [4, 5, 6])
    again = h.generate("m", base + [1, 2, 3], GREEDY)  # all of it cached but the last block
    assert again.timings["cached_tokens"] == 192 and again.token_ids == first.token_ids


def test_preemption_and_resume_give_the_same_tokens(synth_model):
    h = make_host()
    # KV for exactly one context: eight sequences growing at once must take turns.
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=128, kv_tokens=128))
    ps = prompts(lm.model.spec.n_vocab, [40, 50, 60, 33, 20, 70, 45, 64], seed=3)
    params = SamplingParams(temperature=0, max_tokens=40)
    got = all_at_once(h, "m", ps, params)
    assert sum(r.timings["preemptions"] for r in got) > 0
    assert [r.token_ids for r in got] == [solo(lm, p, params) for p in ps]
    assert lm.worker.counts()["blocks_used"] == 0


def test_a_seeded_sampled_request_is_the_same_batched_or_alone(synth_model):
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=256))
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7, max_tokens=16)
    ps = prompts(lm.model.spec.n_vocab, [10, 20, 30, 40])
    got = all_at_once(h, "m", ps, params)
    assert [r.token_ids for r in got] == [solo(lm, p, params) for p in ps]


def test_cancel_frees_the_sequences_blocks_at_once(synth_model):
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=1024))
    (p,) = prompts(lm.model.spec.n_vocab, [100])
    events = h.stream("m", p, SamplingParams(temperature=0, max_tokens=900))
    next(events)
    assert lm.worker.counts()["blocks_used"] > 0
    events.close()  # the client went away
    deadline = time.monotonic() + 5
    while lm.worker.counts()["blocks_used"] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert lm.worker.counts()["blocks_used"] == 0 and lm.worker.pending == 0


def test_a_request_leaves_the_counts_before_its_client_hears_the_end(synth_model, monkeypatch):
    """Status read the moment a request returns shows none of it: the counts published before the end is
    handed over (on a GPU a test suite saw 1 block still used right after a request returned)."""
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=256))
    seen, flush = [], Sequence.flush

    def spy(seq):
        if any(ev[0] == "end" for ev in seq.outbox):
            seen.append(dict(lm.worker.counts()))
        flush(seq)

    monkeypatch.setattr(Sequence, "flush", spy)
    for n, p in zip((1, 2, 9), prompts(lm.model.spec.n_vocab, [5, 40, 70], seed=4)):
        h.generate("m", p, SamplingParams(temperature=0, max_tokens=n))
    assert len(seen) == 3 and all(c["running"] == 0 and c["blocks_used"] == 0 for c in seen), seen


def test_64_clients_on_a_kv_of_8_contexts_all_finish(synth_model):
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=96, parallel=8))
    ps = prompts(lm.model.spec.n_vocab, [int(n) for n in np.random.default_rng(5).integers(20, 64, 64)])
    params = SamplingParams(temperature=0, max_tokens=32)
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append((lm.worker.counts()["blocks_used"], h.ledger.held(), h.allocator.held_bytes()))
            time.sleep(0.002)

    w = threading.Thread(target=watch)
    w.start()
    try:
        got = all_at_once(h, "m", ps, params)
    finally:
        stop.set()
        w.join()
    assert all(r.finish_reason in ("length", "stop", "ctx") for r in got)
    total = lm.worker.counts()["blocks_total"]
    assert max(u for u, _, _ in seen) <= total
    assert all(held == alloc for _, held, alloc in seen)  # nothing allocated outside the reservation
    assert [r.token_ids for r in got[:8]] == [solo(lm, p, params) for p in ps[:8]]


class _Seq:
    def __init__(self, tokens):
        self.tokens, self.block_table, self.block_hashes = list(tokens), [], []
        self.n_computed = self.n_cached = self.n_hashed = 0

    def __len__(self):
        return len(self.tokens)


def test_cached_blocks_are_reused_least_recently_released_first():
    bm = BlockManager(6, 2)
    a, b = _Seq([1, 2, 3, 4, 9]), _Seq([5, 6, 7, 8, 9])
    for s in (a, b):
        bm.admit(s, bm.plan(s, 16))
        bm.grow(s, len(s))
        s.n_computed = len(s)
        bm.register(s)  # two full blocks each; the tails [9] stay unnamed
    assert bm.counts() == {"total": 6, "used": 6, "cached": 0, "free": 0}
    bm.release(a)
    bm.release(b)
    assert bm.counts() == {"total": 6, "used": 0, "cached": 4, "free": 2}
    assert len(bm.plan(_Seq([1, 2, 3, 4, 0]), 16).cached) == 2
    d = _Seq([7, 7, 7])  # two new blocks: a's tail, then a's [3, 4], the least recently released
    bm.admit(d, bm.plan(d, 16))
    bm.grow(d, 3)
    assert len(bm.plan(_Seq([1, 2, 3, 4, 0]), 16).cached) == 1
    assert len(bm.plan(_Seq([5, 6, 7, 8, 0]), 16).cached) == 2


def test_the_block_of_the_last_token_is_never_a_hit():
    bm = BlockManager(8, 4)
    s = _Seq(range(8))
    bm.admit(s, bm.plan(s, 100))
    bm.grow(s, 8)
    s.n_computed = 8
    bm.register(s)
    bm.release(s)
    again = _Seq(range(8))
    assert len(bm.plan(again, 100).cached) == 1  # the second block holds the last token: recomputed


def test_a_sequence_counts_what_it_streamed(synth_model):
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=64))
    seq = Sequence([1, 2, 3], SamplingParams(temperature=0, max_tokens=5), 64, lm.ws.tokenizer)
    lm.worker.add(seq)
    kinds = []
    while True:
        kind, *_ = seq.events.get(timeout=30)
        kinds.append(kind)
        if kind == "end":
            break
    assert kinds.count("piece") >= len(seq.generated) and seq.finish_reason in ("length", "stop")


def test_a_request_whose_client_left_while_it_waited_never_runs(synth_model):
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=64))
    park, release = threading.Event(), threading.Event()
    lm.worker.submit(lambda job: (park.set(), release.wait()))  # the engine is busy between steps
    park.wait(5)
    seq = Sequence([1, 2, 3], GREEDY, 64, lm.ws.tokenizer)
    lm.worker.add(seq)
    seq.cancelled.set()
    release.set()
    assert seq.events.get(timeout=10)[0] == "end"
    assert seq.finish_reason == "cancelled" and not seq.admitted and lm.requests == 0


@pytest.mark.parametrize("opts, says", [
    (LoadOptions(ctx=64, kv_tokens=10), "below the context of 64"),
    (LoadOptions(ctx=64, parallel=1000), "past 256 contexts"),
    (LoadOptions(ctx=64, kv_tokens=64 * 257), "past 256 contexts"),
])
def test_a_kv_size_outside_its_bounds_is_refused_before_any_work(synth_model, opts, says):
    from minferd.errors import InvalidRequest
    h = make_host()
    with pytest.raises(InvalidRequest, match=says):
        h.load("m", synth_model("qwen2"), opts)
    assert not h.models and h.ledger.held() == 0


def test_a_step_as_rows_gives_the_mixed_steps_logits(synth_model):
    """Batch.as_rows (how the CUDA backend runs a short step through its decode graphs): each
    token a row over its own context gives, at every sequence's last token, the logits of the
    mixed pass (a prefix-hit chunk, a whole prompt, a decoding token)."""
    from minferd.backend.batch import Batch
    from minferd.model.loader import load_local
    lm = load_local(str(synth_model("qwen2")), "mmq", device="cpu", ctx=256)
    m = lm.model
    rng = np.random.default_rng(1)
    tables, ids = [[0, 1, 2], [3, 4], [5]], [rng.integers(0, 500, n).tolist() for n in (70, 33, 9)]
    outs = []
    for how in ("mixed", "rows"):
        cache = m.new_cache(m.be.untracked(), 8 * 32)
        m.forward_batch(Batch.build([(ids[0][:50], 0, tables[0]), (ids[2][:8], 0, tables[2])], 32), cache)
        step = Batch.build([(ids[0][50:], 50, tables[0]), (ids[1], 0, tables[1]), (ids[2][8:], 8, tables[2])], 32)
        rows = step.as_rows()
        assert rows.is_decode and rows.n_seqs == len(step.ids) == 54
        assert (rows.ctx_lens == step.positions + 1).all() and (rows.block_tables[20] == step.block_tables[1]).all()
        out = m.forward_batch(step, cache) if how == "mixed" else m.forward_batch(rows, cache)[step.last_rows()]
        outs.append(np.asarray(out))
    assert np.abs(outs[0] - outs[1]).max() <= 1e-4 * np.abs(outs[0]).max()


def test_a_prompt_in_chunks_gives_the_whole_passs_logits(synth_model):
    """Batch.chunk (how the CUDA backend runs a prompt past its largest prefill graph): the pieces
    one after another give the whole pass's last-token logits and its keys."""
    from minferd.backend.batch import Batch
    from minferd.model.loader import load_local
    lm = load_local(str(synth_model("qwen2")), "mmq", device="cpu", ctx=256)
    m = lm.model
    ids = np.random.default_rng(2).integers(0, 500, 150).tolist()
    table = [5, 0, 3, 6, 1]
    whole = Batch.build([(ids[10:], 10, table)], 32)
    outs, keys = [], []
    for how in ("whole", "chunks"):
        cache = m.new_cache(m.be.untracked(), 8 * 32)
        m.forward_batch(Batch.build([(ids[:10], 0, table)], 32), cache)
        if how == "whole":
            out = m.forward_batch(whole, cache)
        else:
            parts = [whole.chunk(a, min(140, a + 64)) for a in range(0, 140, 64)]
            assert [len(p.ids) for p in parts] == [64, 64, 12] and parts[1].positions[0] == 74
            assert parts[1].ctx_lens.tolist() == [138] and parts[2].ctx_lens.tolist() == [150]
            for p in parts:
                out = m.forward_batch(p, cache)
        outs.append(np.asarray(out))
        keys.append(np.asarray(cache.k[1][whole.slots]).copy())
    assert np.abs(outs[0] - outs[1]).max() <= 1e-4 * np.abs(outs[0]).max()
    assert np.abs(keys[0] - keys[1]).max() <= 1e-4 * np.abs(keys[0]).max()


def test_a_decode_batch_is_built_as_the_general_path_builds_it():
    """Batch.build's decode fast path (one token per sequence) against the general path's arrays
    for the same step: the first sequence given a second token takes the general path."""
    from minferd.backend.batch import Batch
    rng = np.random.default_rng(4)
    seqs = [([int(rng.integers(0, 999))], int(p), [int(b) for b in rng.permutation(40)[:n]])
            for p, n in zip(rng.integers(1, 60, 9), rng.integers(4, 9, 9))]
    fast = Batch.build(seqs, 16, width=10)
    general = Batch.build([([7] + seqs[0][0], seqs[0][1] - 1, seqs[0][2])] + seqs[1:], 16, width=10)
    assert fast.is_decode and not general.is_decode
    for name in ("ids", "positions", "slots"):
        assert (getattr(fast, name) == getattr(general, name)[1:]).all(), name
    assert (fast.ctx_lens == general.ctx_lens).all() and (fast.block_tables == general.block_tables).all()
    assert fast.q_starts.tolist() == list(range(10)) and all(a.dtype == np.int32 for a in (
        fast.ids, fast.positions, fast.slots, fast.q_starts, fast.ctx_lens, fast.block_tables))


@pytest.mark.skipif(not hasattr(os, "getpriority") or os.getpriority(os.PRIO_PROCESS, 0) >= 19,
                    reason="no per-thread priorities here, or the process is at the lowest already")
def test_a_host_backends_engine_thread_runs_below_the_daemon(synth_model):
    """The CPU backend's passes compute on the engine's thread: it runs niced, so that status and
    health answer first (a device backend's does not: tests/cuda/test_local_resources.py)."""
    h = make_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=64))
    h.generate("m", [1, 2, 3], GREEDY)  # the thread has started and set its priority
    assert os.getpriority(os.PRIO_PROCESS, lm.worker._thread.native_id) > os.getpriority(os.PRIO_PROCESS, 0)
    h.unload("m")


def test_engine_nice_takes_an_integer_and_names_itself_otherwise():
    from minferd.priority import engine_nice
    assert engine_nice(None) == 0 and engine_nice("-5") == -5 and engine_nice("5") == 5
    with pytest.raises(ValueError, match="MINFERD_ENGINE_NICE='fast': expected an integer"):
        engine_nice("fast")
