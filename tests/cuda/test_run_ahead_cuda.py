"""Decode run ahead on the CUDA backend (engine.py; on by default there): the next step's graph
reads its token ids from the step before's sampled ids on the device, copied in behind the host's
input buffer. A sequence alone gets the tokens of steps in turn (MINFERD_RUN_AHEAD=0) bit for bit:
greedy, seeded, and ended a step late by an end-of-generation id; a batch keeps its solo tokens
within the paths' agreement; the ledger equals CuPy's pool and every block comes back."""
from __future__ import annotations

import pytest

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except cp.cuda.runtime.CUDARuntimeError:
    pytest.skip("no CUDA device", allow_module_level=True)

from minferd.backend.cuda import CudaBackend  # noqa: E402
from minferd.devices import MatmulPath, cuda_traits  # noqa: E402
from minferd.host import Host, LoadOptions  # noqa: E402
from minferd.model.sampler import SamplingParams  # noqa: E402
from tests.unit.test_engine import all_at_once, prompts  # noqa: E402 (the CPU tests' helpers)

GREEDY = SamplingParams(temperature=0, max_tokens=40)
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=1.0, min_p=0, seed=5, max_tokens=40)


def host(device_memory):
    mem = device_memory(limit=8 << 30)
    return Host(lambda **kw: CudaBackend(mem, **kw), mem, cuda_traits(), 8 << 30, w16_min_bytes=0, device="cuda:0")


@pytest.mark.parametrize("path", ["w16", "mmq"])
def test_a_sequence_alone_gets_the_tokens_of_steps_in_turn(synth_model, device_memory, path, monkeypatch):
    h = host(device_memory)
    model = str(synth_model("llama", "q4_k"))  # the synthetic llama's streams vary (qwen2's repeat one id)
    ps = prompts(900, [3, 17, 60], seed=2)
    got, eog = {}, None
    for ahead in ("0", "1", None):  # None: the backend's default
        monkeypatch.delenv("MINFERD_RUN_AHEAD", raising=False)
        if ahead:
            monkeypatch.setenv("MINFERD_RUN_AHEAD", ahead)
        lm = h.load("m", model, LoadOptions(MatmulPath(path), ctx=256))
        assert lm.worker.runs_ahead == (ahead != "0")
        out = []
        for p in ps:
            for params in (GREEDY, SEEDED):
                out.append(h.generate("m", p, params).token_ids)
        if eog is None:  # an id the first greedy stream meets first past its 5th token: it ends there
            eog = next(t for i, t in enumerate(out[0]) if i >= 5 and t not in out[0][:i])
        tok, ids = lm.ws.tokenizer, lm.ws.tokenizer.eog_ids
        tok.eog_ids = frozenset({eog})
        ended = h.generate("m", ps[0], GREEDY)
        tok.eog_ids = ids
        out.append((ended.token_ids, ended.finish_reason))
        got[ahead] = out
        assert (lm.worker.steps_ahead > 0) == (ahead != "0")
        assert lm.worker.counts()["blocks_used"] == 0 and lm.worker.pending == 0
        assert h.ledger.held() == h.allocator.held_bytes()
        h.unload("m")
        assert h.ledger.held() == 0
    assert got["1"] == got["0"] and got[None] == got["0"]
    assert got["1"][-1][1] == "stop" and 5 <= len(got["1"][-1][0]) < 40


def test_a_batch_run_ahead_keeps_its_solo_tokens(synth_model, device_memory):
    h = host(device_memory)
    lm = h.load("m", str(synth_model("llama", "q4_k")), LoadOptions(ctx=256, parallel=16))
    ps = prompts(900, [5, 31, 33, 64, 90, 17, 3, 120, 44, 70, 12, 8], seed=3)
    out = [r.token_ids for r in all_at_once(h, "m", ps, GREEDY)]
    assert lm.worker.steps_ahead > 0
    solo = [h.generate("m", p, GREEDY).token_ids for p in ps]
    # A batch takes other kernels than a lone sequence (cuBLAS past 8 rows): a near-tie of a random
    # model's logits may go the other way, after which a sequence diverges. Most agree wholly.
    assert sum(a == b for a, b in zip(out, solo)) >= 3 * len(ps) // 4, [(len(a), len(b)) for a, b in zip(out, solo)]
    assert lm.worker.counts()["blocks_used"] == 0 and h.ledger.held() == h.allocator.held_bytes()
    h.unload("m")
    assert h.ledger.held() == 0
