"""Decode run ahead (engine.py): the next step launched with its ids read from this step's
sampled ids before the host reads them. On the CPU backend (MINFERD_RUN_AHEAD=1: it gains
nothing there, but the engine's side is the CUDA backend's) every request gets the tokens it
gets with run ahead off: greedy and seeded, batched, ended by length, by an end-of-generation
id or a stop string a step late, cancelled, and blocks named in the prefix cache while running
ahead give a later prompt the tokens of a cold run."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from minferd.model.sampler import SamplingParams
from tests.unit.test_engine import GREEDY, all_at_once, make_host, prompts, solo

SEEDED = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0, seed=11, max_tokens=24)  # a varied stream of the synthetic llama


def loaded(synth_model, monkeypatch, ahead: str, **opts):
    from minferd.host import LoadOptions
    monkeypatch.setenv("MINFERD_RUN_AHEAD", ahead)
    h = make_host()
    lm = h.load("m", synth_model("llama"), LoadOptions(**{"ctx": 256, "parallel": 4, **opts}))
    assert lm.worker.runs_ahead == (ahead == "1")
    return h, lm


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_run_ahead_gives_the_tokens_of_steps_in_turn(synth_model, monkeypatch, params):
    ps = prompts(900, [5, 40, 12, 33], seed=4)
    got = {}
    for ahead in ("0", "1"):
        h, lm = loaded(synth_model, monkeypatch, ahead)
        got[ahead] = [r.token_ids for r in all_at_once(h, "m", ps, params)]
        got[ahead, "solo"] = h.generate("m", ps[1], params).token_ids
        assert (lm.worker.steps_ahead > 0) == (ahead == "1"), lm.worker.steps_ahead
        assert lm.worker.counts()["blocks_used"] == 0 and lm.worker.pending == 0
        h.unload("m")
        assert h.ledger.held() == 0
    assert got["1"] == got["0"] and got["1", "solo"] == got["0", "solo"]
    assert sum(map(len, got["1"])) > 8 * len(ps)  # long enough to run ahead (the llama's end id may come)


def test_an_end_found_a_step_late_throws_that_step_away(synth_model, monkeypatch):
    """An end-of-generation id and a stop string end their sequence where they do with run ahead
    off (found a step late, that step's row thrown away); the others in its batch go on alike."""
    ps = prompts(900, [7, 20, 9], seed=5)
    params = replace(SEEDED, max_tokens=30)
    h, lm = loaded(synth_model, monkeypatch, "0")
    free = [r.token_ids for r in all_at_once(h, "m", ps, params)]
    h.unload("m")
    # the end-of-generation id: sequence 0's first token not seen before its 6th; the stop string:
    # the text of sequence 1's 12th token
    eog = next(t for i, t in enumerate(free[0]) if i >= 5 and t not in free[0][:i])
    stop = lm.ws.tokenizer.token_piece(free[1][11]).decode("utf-8", "replace")
    got = {}
    for ahead in ("0", "1"):
        h, lm = loaded(synth_model, monkeypatch, ahead)
        lm.ws.tokenizer.eog_ids = frozenset({eog})
        rs = all_at_once(h, "m", ps, replace(params, stop=(stop,)))
        got[ahead] = [(r.token_ids, r.text, r.finish_reason) for r in rs]
        assert (lm.worker.steps_ahead > 0) == (ahead == "1")
        assert lm.worker.counts()["blocks_used"] == 0 and lm.worker.pending == 0
        h.unload("m")
    assert got["1"] == got["0"]
    ends = [len(t) for t, _, _ in got["1"]]
    assert got["1"][0][2] == "stop" and ends[0] < 30 and got["1"][1][2] == "stop" and ends[1] <= 12, got["1"]


def test_blocks_named_while_running_ahead_are_a_correct_prefix(synth_model, monkeypatch):
    """A block filled by decode steps run ahead is named by its tokens once they are on the host:
    a prompt that continues the generated text hits it and gets a cold run's tokens."""
    h, lm = loaded(synth_model, monkeypatch, "1", ctx=512)
    base, = prompts(lm.model.spec.n_vocab, [200], seed=6)
    first = h.generate("m", base, replace(GREEDY, max_tokens=40)).token_ids  # 240 tokens: 7 full blocks
    assert lm.worker.steps_ahead > 0
    follow = base + first[:30]
    again = h.generate("m", follow, GREEDY)
    assert again.timings["cached_tokens"] == 224
    assert again.token_ids == solo(lm, follow)


def test_a_client_gone_while_a_step_runs_ahead_frees_its_blocks(synth_model, monkeypatch):
    h, lm = loaded(synth_model, monkeypatch, "1", ctx=1024)
    (p,) = prompts(lm.model.spec.n_vocab, [100])
    events = h.stream("m", p, SamplingParams(temperature=0, max_tokens=900))
    for _ in range(5):
        next(events)
    assert lm.worker.steps_ahead > 0
    events.close()
    deadline = time.monotonic() + 5
    while (lm.worker.counts()["blocks_used"] or lm.worker.pending) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert lm.worker.counts()["blocks_used"] == 0 and lm.worker.pending == 0
    assert h.generate("m", p, replace(GREEDY, max_tokens=8)).token_ids == solo(lm, p, replace(GREEDY, max_tokens=8))


def test_a_sampler_that_reads_the_history_never_runs_ahead(synth_model, monkeypatch):
    h, lm = loaded(synth_model, monkeypatch, "1")
    (p,) = prompts(lm.model.spec.n_vocab, [12])
    params = replace(GREEDY, repeat_penalty=1.3, repeat_last_n=16)
    assert h.generate("m", p, params).token_ids == solo(lm, p, params)
    assert lm.worker.steps_ahead == 0


def test_the_valve_names_what_it_takes(synth_model, monkeypatch):
    with pytest.raises(ValueError, match="MINFERD_RUN_AHEAD must be 0 or 1"):
        loaded(synth_model, monkeypatch, "yes")
