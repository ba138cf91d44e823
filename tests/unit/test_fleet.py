"""Several devices in one daemon (issue 18), with CPU devices standing in for GPUs: placement,
per-device admission, refusals naming every device, one name on one device, and a soak of random
operations after each of which every device's ledger equals its allocator."""
from __future__ import annotations

import random

import numpy as np
import pytest

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.devices import MatmulPath, cpu_traits
from minferd.errors import Conflict, InvalidRequest, MinferdError, NotFound
from minferd.fleet import Fleet
from minferd.host import Host
from minferd.model.sampler import SamplingParams
from minferd.pool.ledger import PoolExhausted
from tests.unit.test_pool import KV, QUANT_TOTAL, SCRATCH, W16_TOTAL, check, opts, tiny, tiny2  # noqa: F401 (fixtures)

MiB = 1 << 20


def make_fleet(*capacities: int) -> Fleet:
    hosts = {}
    for i, cap in enumerate(capacities):
        mem = HostMemory()
        hosts[f"cpu:{i}"] = Host(lambda mem=mem, **kw: CpuBackend(1, mem, **kw), mem, cpu_traits(1), cap,
                                 w16_min_bytes=0, device=f"cpu:{i}", default_parallel=1)
    return Fleet(hosts)




def where(f: Fleet) -> dict[str, str]:
    return {m["name"]: m["device"] for m in f.status()["models"]}


def test_placement_prefers_shared_weights_then_the_f16_copy_then_free_room(tiny, tiny2):
    f = make_fleet(W16_TOTAL + 2 * MiB, 64 * MiB)
    f.load("a", tiny, opts())
    assert where(f) == {"a": "cpu:1"} and f.get("a").ws.plan.matmul_path == MatmulPath.W16  # the most room
    f.load("b", tiny, opts(ctx=128))  # the same file: on the device holding its weights
    assert where(f)["b"] == "cpu:1" and f.get("b").ws is f.get("a").ws
    f.load("c", tiny2, opts(), device="cpu:0")
    assert where(f)["c"] == "cpu:0"
    st = f.status()
    assert [p["device"] for p in st["pools"]] == ["cpu:0", "cpu:1"]
    assert st["pool"]["used_bytes"] == sum(p["used_bytes"] for p in st["pools"])
    assert st["pool"]["device"] == "cpu:0,cpu:1"
    for h in f.hosts.values():
        check(h)
    for n in ("a", "b", "c"):
        f.unload(n)
    assert all(h.ledger.held() == 0 for h in f.hosts.values())


def test_a_load_goes_where_it_fits_and_a_refusal_names_every_device(tiny, tiny2):
    f = make_fleet(QUANT_TOTAL + MiB, QUANT_TOTAL + MiB)
    f.load("a", tiny, opts(pinned=True))
    f.load("b", tiny2, opts(pinned=True))
    assert sorted(where(f).values()) == ["cpu:0", "cpu:1"]  # the second went where the first was not
    with pytest.raises(PoolExhausted) as e:
        f.load("c", str(tiny2), opts(ctx=1024))
    assert "cpu:0:" in str(e.value) and "cpu:1:" in str(e.value), str(e.value)
    assert sorted(where(f)) == ["a", "b"]  # nothing changed
    with pytest.raises(InvalidRequest, match="this daemon has cpu:0, cpu:1"):
        f.load("d", tiny, opts(), device="cuda:7")


def test_admission_runs_on_the_device_the_load_goes_to(tiny, tiny2):
    f = make_fleet(QUANT_TOTAL + MiB, 64 * MiB)
    f.load("idle", tiny, opts(), device="cpu:0")  # unpinned, idle: may give way
    f.load("other", tiny, opts(), device="cpu:1")
    f.load("new", tiny2, opts(), device="cpu:0")  # no room on cpu:0 until "idle" goes
    assert where(f) == {"other": "cpu:1", "new": "cpu:0"}
    assert "evicted idle" in f.hosts["cpu:0"].events[-1] and not any("evicted" in e for e in f.hosts["cpu:1"].events)


def test_a_name_lives_on_one_device(tiny, tiny2):
    f = make_fleet(64 * MiB, 64 * MiB)
    a = f.load("a", tiny, opts(), device="cpu:0")
    assert f.load("a", tiny, opts()) is a  # the same load again: a no-op on its device
    with pytest.raises(Conflict, match="in use"):
        f.load("a", tiny2, opts())
    with pytest.raises(InvalidRequest, match="is on cpu:0"):
        f.load("a", tiny, opts(), device="cpu:1")
    with pytest.raises(NotFound, match="loaded: a"):
        f.get("b")
    assert f.device_of("a") == "cpu:0" and f.model_info(a)["device"] == "cpu:0"
    f.unload("a")


def test_a_soak_of_random_operations_keeps_every_device_s_books(tiny, tiny2):
    """1000 operations across 2 devices: ledger == allocator == memory on each after every step."""
    f = make_fleet(3 * W16_TOTAL, 2 * QUANT_TOTAL + KV + SCRATCH)
    rng, files, names = random.Random(18), (tiny, tiny2), [f"m{i}" for i in range(5)]
    outcomes = {}
    for step in range(1000):
        op, name = rng.choice(("load", "load", "unload", "generate", "demote", "promote", "pin")), rng.choice(names)
        try:
            if op == "load":
                f.load(name, rng.choice(files), opts(ctx=rng.choice((128, 256)), pinned=rng.random() < 0.2),
                       device=rng.choice((None, None, "cpu:0", "cpu:1")))
            elif op == "unload":
                f.unload(name)
            elif op == "generate":
                f.generate(name, np.array([5, 6, 7]), SamplingParams(temperature=0, max_tokens=2))
            elif op == "demote":
                f.demote(name)
            elif op == "promote":
                f.promote(name)
            else:
                f.set_pinned(name, rng.random() < 0.5)
            outcomes[op, "ok"] = outcomes.get((op, "ok"), 0) + 1
        except MinferdError as e:
            outcomes[op, type(e).__name__] = outcomes.get((op, type(e).__name__), 0) + 1
        for h in f.hosts.values():
            check(h)
        assert len(where(f)) == len(set(where(f)))
    assert outcomes.get(("load", "ok"), 0) > 50 and outcomes.get(("load", "PoolExhausted"), 0) > 0, outcomes
    f.unload_all()
    assert all(h.ledger.held() == 0 and h.allocator.device.used_bytes() == 0 for h in f.hosts.values())


def test_metrics_have_a_pool_series_per_device_that_sum_to_the_daemon(tiny, tiny2):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from minferd.metrics import PoolCollector
    f = make_fleet(64 * MiB, 64 * MiB)
    f.load("a", tiny, opts(), device="cpu:0")
    f.load("b", tiny, opts(), device="cpu:1")  # the same file on two devices: two weight sets
    reg = CollectorRegistry()
    reg.register(PoolCollector(f))
    fams = {m.name: m for m in text_string_to_metric_families(generate_latest(reg).decode())}
    used = {s.labels["device"]: s.value for s in fams["minferd_pool_bytes"].samples if s.labels["state"] == "used"}
    assert used == {d: h.ledger.held() for d, h in f.hosts.items()}
    sets = [s for s in fams["minferd_weight_set_bytes"].samples if s.labels["kind"] == "weights"]
    assert len(sets) == 2 and len({s.labels["weight_set"] for s in sets}) == 2
    own = sum(s.value for s in fams["minferd_model_bytes"].samples)
    assert sum(s.value for s in fams["minferd_weight_set_bytes"].samples) + own == sum(used.values())
