"""The engine's overlapping steps (the CUDA backend's order: a step's tokens go out after the next
pass is launched), run on the CPU backend told it launches asynchronously: every token still
arrives, and a sequence's first token does not wait for the next pass."""
from __future__ import annotations

import queue
import threading

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.devices import cpu_traits
from minferd.engine.sequence import Sequence
from minferd.host import Host, LoadOptions
from tests.unit.test_engine import GREEDY, all_at_once, prompts, solo


def overlapping_host() -> Host:
    """A CPU host whose backend claims the CUDA backend's order: a step's tokens go out after the
    next pass is launched (the engine's overlap)."""
    mem = HostMemory()

    def backend(**kw):
        be = CpuBackend(2, mem, **kw)
        be.launches_async = True
        return be

    return Host(backend, mem, cpu_traits(2), 1 << 30, w16_min_bytes=0)


def test_tokens_sent_while_the_next_step_runs_all_arrive(synth_model):
    """The CUDA backend's order (a step's tokens go out after the next pass is launched), run on
    the CPU: every sequence still gets all its tokens, the last ones included, and its end."""
    h = overlapping_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=128, parallel=4))
    assert lm.worker._overlap
    ps = prompts(lm.model.spec.n_vocab, [5, 40, 12, 33])
    got = all_at_once(h, "m", ps)
    assert [r.token_ids for r in got] == [solo(lm, p) for p in ps]
    one = h.generate("m", ps[0], GREEDY)  # alone: its last tokens go out once no work is left
    assert one.token_ids == got[0].token_ids


def test_a_first_token_goes_out_before_the_next_step_where_steps_overlap(synth_model):
    """With overlap (the CUDA backend's order, here on the CPU) a step's tokens wait for the next
    pass's launch, except a sequence's first: its time to first token is not held a step. The next
    pass is held until the test has the first token."""
    from dataclasses import replace
    lm = overlapping_host().load("m", synth_model("qwen2"), LoadOptions(ctx=64))
    be, release, calls = lm.model.be, threading.Event(), []
    run = be.run

    def held_run(*a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the decode step after the prefill that sampled the first token
            release.wait(10)
        return run(*a, **kw)

    be.run = held_run
    seq = Sequence(prompts(lm.model.spec.n_vocab, [6])[0], replace(GREEDY, max_tokens=4), 64, lm.ws.tokenizer)
    lm.worker.add(seq)
    try:
        first = seq.events.get(timeout=5)  # without the early flush: only once the held pass returns
        assert not release.is_set()
    finally:
        release.set()
    kinds = [first[0]]
    while kinds[-1] != "end":
        kinds.append(seq.events.get(timeout=10)[0])
    assert kinds[0] == "piece" and kinds.count("piece") >= len(seq.generated) >= 1


def test_a_one_token_request_gets_its_token_before_its_bookkeeping_then_its_end(synth_model):
    """With overlap, a first token that also ends its sequence (max_tokens 1) is handed to the
    client before the engine ends the sequence (its blocks given back, its end queued): the
    client's thread wakes while the engine goes on. Its end still follows, in order."""
    from dataclasses import replace
    lm = overlapping_host().load("m", synth_model("qwen2"), LoadOptions(ctx=64))
    seq = Sequence(prompts(lm.model.spec.n_vocab, [6])[0], replace(GREEDY, max_tokens=1), 64, lm.ws.tokenizer)
    finish, queued_at_finish, put = lm.worker.scheduler.finish, [], []

    class Recorded(queue.SimpleQueue):  # what was handed to the client, whether or not it took it yet
        def put(self, item, *a, **kw):
            put.append(item)
            super().put(item, *a, **kw)

    seq.events = Recorded()

    def finish_seen(s):
        queued_at_finish.append(len(put))
        return finish(s)

    lm.worker.scheduler.finish = finish_seen
    lm.worker.add(seq)
    events = [seq.events.get(timeout=10)]
    while events[-1][0] != "end":
        events.append(seq.events.get(timeout=10))
    assert queued_at_finish and queued_at_finish[0] >= 1  # the token was out before the sequence ended
    assert [e[0] for e in events][0] == "piece" and events[-1] == ("end", None, None)
    assert [e[1] for e in events if e[0] == "piece" and e[1] >= 0] == seq.generated
