"""A request that finds its engine idle runs its first step on its own thread (engine.py: the
turn), with the same tokens as through the engine's thread; where the backend cannot run the
step there, where the engine is busy, or where it closes meanwhile, the engine's thread takes it.

The CPU backend never lets a step leave the engine's thread (its passes compute there, at a lower
priority); these tests tell it to, as the CUDA backend does for replays of captured graphs, so
the engine's side runs on the CPU."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.devices import cpu_traits
from minferd.engine import engine
from minferd.engine.sequence import Sequence
from minferd.host import Host, LoadOptions
from tests.unit.test_engine import GREEDY, all_at_once, prompts


def cpu_host() -> Host:
    mem = HostMemory()

    def backend(**kw):
        be = CpuBackend(2, mem, **kw)
        be.caller_steps = True
        be.runs_anywhere = lambda *a: True  # the CUDA backend's answer for a captured graph
        return be

    return Host(backend, mem, cpu_traits(2), 1 << 30, w16_min_bytes=0)


def threads_of_runs(lm) -> list[str]:
    """The names of the threads that run each of the model's passes from now on."""
    be, names, run = lm.model.be, [], lm.model.be.run

    def recorded(*a, **kw):
        names.append(threading.current_thread().name)
        return run(*a, **kw)

    be.run = recorded
    return names


@pytest.fixture(autouse=True)
def patient_turn(monkeypatch):
    """A request waits as long as it takes for an engine thread that is ending its last step (a
    loaded CI machine may hold a niced thread off its core past the 5 ms a daemon waits)."""
    monkeypatch.setattr(engine, "TURN_WAIT_S", 10.0)


def test_a_request_at_an_idle_engine_runs_its_first_step_on_its_own_thread(synth_model):
    h = cpu_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=128))
    ps = prompts(lm.model.spec.n_vocab, [7, 40])
    lm.worker.caller_steps = False
    want = [h.generate("m", p, GREEDY).token_ids for p in ps]
    lm.worker.caller_steps = True
    names = threads_of_runs(lm)
    got = [h.generate("m", p, GREEDY).token_ids for p in ps]
    assert got == want
    me = threading.current_thread().name
    # Each request's first pass ran here; its decode on the engine's thread.
    firsts = [i for i, n in enumerate(names) if n == me]
    assert len(firsts) == 2 and firsts[0] == 0 and all(n.startswith("minferd-model-") for n in names[1:firsts[1]])
    assert lm.worker.pending == 0 and lm.worker.counts()["blocks_used"] == 0


def test_a_one_token_request_never_wakes_the_engine(synth_model):
    h = cpu_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=128))
    names = threads_of_runs(lm)
    one = replace(GREEDY, max_tokens=1)
    for p in prompts(lm.model.spec.n_vocab, [5, 16, 31]):
        assert len(h.generate("m", p, one).token_ids) <= 1
    assert names == [threading.current_thread().name] * 3


def test_a_step_the_backend_will_not_run_here_stays_the_engines(synth_model):
    h = cpu_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=128))
    p = prompts(lm.model.spec.n_vocab, [12])[0]
    want = h.generate("m", p, GREEDY).token_ids
    lm.model.be.runs_anywhere = lambda *a: False  # the CPU backend's, and CUDA's before a graph is captured
    names = threads_of_runs(lm)
    assert h.generate("m", p, GREEDY).token_ids == want
    assert names and all(n.startswith("minferd-model-") for n in names)
    assert lm.worker.pending == 0 and lm.worker.counts()["blocks_used"] == 0


def test_requests_at_once_keep_their_tokens(synth_model):
    """Several clients at once: whichever finds the engine idle steps there, the rest queue; each
    keeps the tokens it gets alone."""
    h = cpu_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=128, parallel=4))
    ps = prompts(lm.model.spec.n_vocab, [5, 40, 12, 33, 9, 21])
    want = [h.generate("m", p, GREEDY).token_ids for p in ps]
    for _ in range(3):
        assert [r.token_ids for r in all_at_once(h, "m", ps)] == want
    assert lm.worker.pending == 0 and lm.worker.counts()["blocks_used"] == 0


def test_an_unload_during_a_requests_own_step_ends_it_and_the_engine(synth_model):
    h = cpu_host()
    lm = h.load("m", synth_model("qwen2"), LoadOptions(ctx=128))
    be, entered, release, run = lm.model.be, threading.Event(), threading.Event(), lm.model.be.run

    def held(*a, **kw):
        if threading.current_thread().name.startswith("request"):
            entered.set()
            release.wait(10)
        return run(*a, **kw)

    be.run = held
    seq = Sequence(prompts(lm.model.spec.n_vocab, [9])[0], replace(GREEDY, max_tokens=8), 128, lm.ws.tokenizer)
    t = threading.Thread(target=lm.worker.add, args=(seq,), name="request")
    t.start()
    assert entered.wait(10)
    closer = threading.Thread(target=lm.worker.close)
    closer.start()
    closer.join(10)
    release.set()
    t.join(10)
    events = []
    while not events or events[-1][0] != "end":
        events.append(seq.events.get(timeout=10))
    assert events[-1][1] is not None  # ended by the unload (Aborted), after the token its step made
    lm.worker.join(10)
    assert not lm.worker._thread.is_alive() and lm.worker.pending == 0
