"""The pool: admission (demote, evict, refuse, rollback), sharing, keep-alive, promotion, each
asserting byte figures (budget, planner and estimate: test_planning.py); after every step the ledger equals the allocator and
the device's own count, within the budget."""
import threading
import time

import pytest

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.config import KV_BLOCK_TOKENS
from minferd.devices import MatmulPath, cpu_traits
from minferd.errors import Conflict, InvalidRequest, NotFound
from minferd.host import Host, LoadOptions
from minferd.model.sampler import SamplingParams
from minferd.pool.ledger import PoolExhausted

MiB = 1 << 20
CTX = 256
# qwen2 tiny q4_k at ctx 256 on one CPU thread, as the estimator computes and the load measures:
WEIGHTS, W16, SCRATCH = 820224, 2359296, 1048576
def kv(ctx):  # a context's KV, and the block a padded decode batch writes to
    return 2048 * (ctx + KV_BLOCK_TOKENS)


KV = kv(CTX)
QUANT_TOTAL, W16_TOTAL = WEIGHTS + KV + SCRATCH, WEIGHTS + W16 + KV + SCRATCH


def make_host(capacity, w16_min=0):
    mem = HostMemory()
    return Host(lambda **kw: CpuBackend(1, mem, **kw), mem, cpu_traits(1), capacity, w16_min_bytes=w16_min,
                default_parallel=1)


def check(h):
    held = h.ledger.held()
    assert held == h.allocator.held_bytes() == h.allocator.device.used_bytes()
    assert held <= h.ledger.committed() <= h.ledger.capacity


def opts(**kw):
    kw.setdefault("ctx", CTX)
    return LoadOptions(**kw)


@pytest.fixture(scope="module")
def tiny(synth_model):
    return str(synth_model("qwen2", "q4_k"))


@pytest.fixture(scope="module")
def tiny2(synth_model):
    return str(synth_model("llama", "q4_k"))


# ---- load, estimate, unload -------------------------------------------------------------------
def test_load_measures_the_estimate_and_unload_returns_every_byte(tiny):
    h = make_host(64 * MiB)
    lm = h.load("a", tiny, opts(matmul_path=MatmulPath.W16))
    assert h.model_bytes(lm) == {"weights": WEIGHTS, "w16": W16, "kv": KV, "scratch": SCRATCH}
    assert lm.ws.plan.bytes == h.model_bytes(lm)
    check(h)
    assert h.unload("a") == W16_TOTAL
    assert h.ledger.held() == h.ledger.committed() == 0
    check(h)


def test_errors_name_the_problem(tiny, tiny2):
    h = make_host(64 * MiB)
    h.load("a", tiny, opts())
    assert h.load("a", tiny, opts()) is h.models["a"]  # idempotent
    with pytest.raises(Conflict, match="in use"):
        h.load("a", tiny2, opts())
    with pytest.raises(NotFound, match="no model named 'zz'"):
        h.unload("zz")
    with pytest.raises(InvalidRequest, match="ctx 99999"):
        h.load("b", tiny, opts(ctx=99999))
    check(h)


def test_shared_file_shares_weights(tiny):
    h = make_host(64 * MiB)
    a = h.load("a", tiny, opts())
    b = h.load("b", tiny, opts(ctx=128))
    assert a.ws is b.ws
    assert a.ws.plan.matmul_path == MatmulPath.W16
    assert h.ledger.held() == W16_TOTAL + kv(128) + SCRATCH  # one weight set, two KV caches
    check(h)
    assert h.unload("a") == KV + SCRATCH  # b still uses the weights
    assert h.models["b"].ws.weights["token_embd.weight"].data is not None
    assert h.unload("b") == WEIGHTS + W16 + kv(128) + SCRATCH
    assert h.ledger.held() == 0
    check(h)



def test_a_sharing_load_uploads_itself_when_the_loaded_file_goes_first(tiny, monkeypatch):
    """b opens the file while a holds it, so b takes a's parse; a unloads before b reserves, so b
    uploads after all. It read through a's closed descriptor: 'I/O operation on closed file'
    (seen in the chaos test)."""
    h = make_host(64 * MiB)
    h.load("a", tiny, opts())
    reserve = h._reserve

    def unload_a_first(*args):
        if "a" in h.models:
            h.unload("a")
        return reserve(*args)

    monkeypatch.setattr(h, "_reserve", unload_a_first)
    b = h.load("b", tiny, opts())
    assert list(h.models) == ["b"] and b.ws.weights
    assert h.ledger.held() == W16_TOTAL
    check(h)
    h.unload("b")
    assert h.ledger.held() == 0

def test_demoting_shared_weights_waits_for_every_user(tiny):
    """The f16 copy two models share is dropped only while neither is running a request: the
    drop waits for b's request in flight even though it runs through a."""
    h = make_host(64 * MiB)
    h.load("a", tiny, opts())
    h.load("b", tiny, opts())
    be = h.models["a"].model.be
    running, seen = threading.Event(), []

    def slow_request(job):
        running.set()
        time.sleep(0.3)
        running.clear()

    drop = be.drop_w16
    be.drop_w16 = lambda w: (seen.append(running.is_set()), drop(w))[1]
    h.models["b"].worker.submit(slow_request)
    assert running.wait(5)
    assert h.demote("a") == W16
    assert seen and not any(seen)  # no drop overlapped b's request
    assert h.generate("b", [300, 301], SamplingParams(temperature=0, max_tokens=3)).token_ids
    check(h)


# ---- admission ------------------------------------------------------------------------------
def test_demote_makes_room_and_the_model_keeps_serving(tiny, tiny2):
    h = make_host(W16_TOTAL + QUANT_TOTAL // 2)
    a = h.load("a", tiny, opts())
    assert a.ws.plan.matmul_path == MatmulPath.W16
    ids, greedy = [300, 301, 302], SamplingParams(temperature=0, max_tokens=6)
    before = h.generate("a", ids, greedy).token_ids
    h.load("b", tiny2, opts(matmul_path=MatmulPath.MMQ))  # fits only in a's f16 copy
    assert "demoted a" in h.events and h.ledger.by_kind(a.ws.tag)["w16"] == 0
    assert h.ledger.held() == QUANT_TOTAL + h.ledger.held("b") + h.ledger.held(h.models["b"].ws.tag)
    assert h.generate("a", ids, greedy).token_ids == before  # same tokens from the quantized path
    check(h)


def test_evict_idle_expired(tiny, tiny2):
    h = make_host(QUANT_TOTAL + MiB)
    h.load("a", tiny, opts(keep_alive=0.0))
    h.models["a"].last_used -= 1
    h.load("b", tiny2, opts())
    assert "a" not in h.models and "evicted a" in h.events
    check(h)


@pytest.mark.parametrize("why", ["pinned", "busy"])
def test_refuse_touches_nothing(tiny, tiny2, why):
    h = make_host(W16_TOTAL + MiB)
    a = h.load("a", tiny, opts(pinned=why == "pinned", keep_alive=0.0))
    a.last_used -= 1
    release = threading.Event()
    if why == "busy":
        a.worker.submit(lambda job: release.wait())  # a request in flight
    held, committed = h.ledger.held(), h.ledger.committed()
    with pytest.raises(PoolExhausted) as e:
        h.load("b", tiny2, opts(matmul_path=MatmulPath.MMQ, ctx=2048))
    err = e.value
    assert err.needed > err.free and err.free == h.ledger.free()
    assert err.freeable == 0
    assert "needs" in str(err) and "free" in str(err)
    assert (h.ledger.held(), h.ledger.committed()) == (held, committed)
    assert a.ws.w16_bytes() == W16
    release.set()
    check(h)


def test_an_idle_model_whose_keep_alive_has_not_passed_gives_way_to_a_load(tiny, tiny2):
    """Keep-alive is how long an idle model stays when nobody needs the room, as in Ollama."""
    h = make_host(QUANT_TOTAL + MiB)
    h.load("a", tiny, opts(keep_alive=300.0))
    h.load("b", tiny2, opts())
    assert "a" not in h.models and "evicted a" in h.events
    check(h)


def test_every_allocation_failure_rolls_back(tiny, tiny2):
    h = make_host(64 * MiB)
    h.load("a", tiny, opts(pinned=True))  # pinned: the retry after a device failure cannot demote it
    before = (h.ledger.held(), h.ledger.committed(), dict(h.ledger.by_kind("a")))
    n = 0
    while True:
        h.allocator.fail_at = n
        try:
            h.load("b", tiny2, opts(matmul_path=MatmulPath.W16))
        except PoolExhausted as e:
            assert "injected" in str(e)
        else:
            break
        # Checked outside the except block: its traceback keeps the failed load's frames alive.
        assert (h.ledger.held(), h.ledger.committed(), h.ledger.by_kind("a")) == before
        assert "b" not in h.models and len(h.weight_sets) == 1
        check(h)
        n += 1
    assert n > 30  # weights, f16 copies, KV layers and scratch were each made to fail
    check(h)


def test_keep_alive_zero_unloads_after_the_request(tiny):
    h = make_host(64 * MiB)
    h.load("a", tiny, opts(keep_alive=0.0))
    h.generate("a", [300], SamplingParams(temperature=0, max_tokens=2))
    assert "a" not in h.models and h.ledger.held() == 0


def test_reap_respects_pin_and_keep_alive(tiny, tiny2, synth_model):
    h = make_host(64 * MiB)
    h.load("pinned", tiny, opts(pinned=True, keep_alive=0.0))
    h.load("fresh", tiny2, opts(keep_alive=300.0))
    h.load("forever", str(synth_model("qwen3", "q4_k")), opts(keep_alive=-1.0))
    h.load("stale", str(synth_model("gemma3", "q4_k")), opts(keep_alive=60.0))
    for lm in h.models.values():
        lm.last_used -= 100
    assert h.reap() == ["stale"]
    assert sorted(h.models) == ["forever", "fresh", "pinned"]
    check(h)


def test_sharing_load_never_evicts_the_weights_it_shares(tiny):
    """Found by the soak: making room for a second model of the same file must not unload the
    first one, whose weights the second is about to use."""
    h = make_host(QUANT_TOTAL + KV // 2)  # room for one model, not two KV caches
    a = h.load("a", tiny, opts(keep_alive=0.0, matmul_path=MatmulPath.MMQ))
    a.last_used -= 1
    with pytest.raises(PoolExhausted):
        h.load("b", tiny, opts())
    assert "a" in h.models and a.ws.weights["token_embd.weight"].data is not None
    check(h)


def test_device_out_of_memory_is_pressure(tiny, tiny2):
    """The device refuses what the ledger allowed (another process took memory): the load demotes
    an idle f16 copy and tries once more; with nothing to demote it is refused, typed, and the
    ledger is as before."""
    h = make_host(64 * MiB)
    a = h.load("a", tiny, opts())
    assert a.ws.w16_bytes() == W16
    h.allocator.fail_at = 3  # the device fails the 4th allocation of the next load
    h.load("b", tiny2, opts(matmul_path=MatmulPath.MMQ))
    assert "demoted a" in h.events and a.ws.w16_bytes() == 0 and "b" in h.models
    check(h)
    held = h.ledger.held()
    h.allocator.fail_at = 3
    with pytest.raises(PoolExhausted, match="injected"):
        h.load("c", str(tiny), opts(ctx=128))
    assert h.ledger.held() == held and "c" not in h.models
    check(h)


def test_demote_waits_for_the_request_in_flight_without_blocking_status(tiny):
    h = make_host(64 * MiB)
    a = h.load("a", tiny, opts())
    release = threading.Event()
    a.worker.submit(lambda job: release.wait())  # a request that is reading the f16 copy
    done = []
    t = threading.Thread(target=lambda: done.append(h.demote("a")))
    t.start()
    time.sleep(0.2)
    assert not done and a.ws.w16_bytes() == W16  # the copy stays while the request runs
    t0 = time.monotonic()
    assert h.status()["models"][0]["name"] == "a"
    assert time.monotonic() - t0 < 1.0
    release.set()
    t.join(10)
    assert done == [W16] and a.ws.w16_bytes() == 0
    check(h)
