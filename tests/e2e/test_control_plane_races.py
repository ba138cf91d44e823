"""Issue 13, items 1 and 5, black-box against a real `minferd serve --device cpu`: the daemon never
dies of a keep-alive race, and never stalls its status behind an unload of a streaming model or
a large load. Each test starts its own daemon and collects every problem before failing."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc

from minferd._proto import pb2
from tests.e2e.control_plane import (  # noqa: F401 (fixtures)
    LONG_CTX,
    SERVING,
    STREAM_ENDS,
    C,
    big_model,
    dedup_bytes,
    drain_stream,
    gen_req,
    health_name,
    health_of,
    is_gone,
    load,
    log_tail,
    model_health,
    models,
    names,
    outcome,
    snapshot,
    start,
    status,
    stub_of,
    wait_gone,
)
from tests.e2e.daemon import ALONE


# ---- 1. the daemon dies ------------------------------------------------------------------------
def test_unload_racing_the_keep_alive_reaper_never_kills_the_daemon(start):
    """Issue 13 item 1: the reaper lists expired models without the lock and its unload of one a
    client unloaded first raised NotFound out of `minferd serve` (exit 2). Each round finds the
    reaper's phase (a keep-alive-0 probe vanishes at a pass), loads eight models that have
    expired by the next pass, and unloads them newest first from three clients right as that
    pass begins to unload them oldest first."""
    d = start("--budget", "256MiB")
    s = stub_of(d)
    files = ("f.gguf", "g.gguf", "h.gguf")
    racers = [f"r{i}" for i in range(8)]
    codes: Counter = Counter()
    problems = []
    rng = random.Random(13)

    def unload_all_newest_first():
        for n in reversed(racers):
            code, details = outcome(lambda n=n: s.UnloadModel(pb2.UnloadModelRequest(name=n), timeout=10))
            codes[code.name] += 1
            if code not in (C.OK, C.NOT_FOUND):
                problems.append(f"unload {n}: {code.name}: {details[:120]}")
                return  # a dead daemon answers nothing more

    with ThreadPoolExecutor(3) as pool:
        for rnd in range(10):
            if d.proc.poll() is not None:
                break
            try:
                load(s, "h.gguf", "probe", keep=0.0)
                t_pass = wait_gone(s, "probe", 5.0)  # the reaper just ran
                for i, n in enumerate(racers):
                    load(s, files[i % 3], n, keep=0.5)  # all expired before the next pass
                target = t_pass + 1.0 + rng.uniform(-0.003, 0.03)
                time.sleep(max(0.0, target - time.monotonic()))
                for f in [pool.submit(unload_all_newest_first) for _ in range(3)]:
                    f.result()
                for n in racers:
                    if n in names(s, timeout=5):
                        wait_gone(s, n, 5.0)
                status(s, timeout=5)
            except grpc.RpcError as e:
                problems.append(f"round {rnd}: {e.code().name}: {(e.details() or '')[:200]}")
                break
    # Alive means running and answering: today the process lingers in interpreter shutdown after
    # `minferd serve` raised, its socket gone and its server thread dead.
    code, _ = outcome(lambda: status(s, timeout=5))
    assert d.proc.poll() is None and code == C.OK, (
        f"the daemon died racing the reaper in round {rnd + 1} of 10 (exit status {d.proc.poll()}, "
        f"GetStatus {code.name}; unloads: {dict(codes)}):\n{log_tail(d)}")
    load(s, "f.gguf", "after", keep=-1)
    last = list(s.Generate(gen_req("after", 3), timeout=30))[-1]
    assert last.finish_reason in ("length", "stop"), last
    assert not problems, "\n".join(problems[:20])
    print(f"\nunloads racing the reaper: {dict(codes)}")


# ---- 5. stalls ---------------------------------------------------------------------------------
def test_unload_of_a_streaming_model_stalls_nothing(start):
    """Issue 13 item 5: UnloadModel of a model mid-stream held the host lock until the stream
    ended; GetStatus, ListModels and other loads timed out behind it."""
    d = start("--budget", "256MiB")
    s = stub_of(d)
    load(s, "f.gguf", "long", ctx=LONG_CTX, keep=-1)
    load(s, "g.gguf", "warm")  # the small load once, so the timed one below is warm
    s.UnloadModel(pb2.UnloadModelRequest(name="warm"), timeout=30)
    stream = s.Generate(gen_req("long", 2500), timeout=180)  # ~12 s of decode on one core
    next(stream)  # it is running
    pool = ThreadPoolExecutor(1)
    unload = pool.submit(lambda: s.UnloadModel(pb2.UnloadModelRequest(name="long"), timeout=180))
    problems, seen = [], []
    try:
        time.sleep(0.3)  # the unload has begun (today it sits in the lock, waiting for the stream)
        checks = (
            ("GetStatus", lambda t: s.GetStatus(pb2.GetStatusRequest(), timeout=t), 0.5),
            ("ListModels", lambda t: s.ListModels(pb2.ListModelsRequest(), timeout=t), 0.5),
            ("LoadModel of another model", lambda t: load(s, "g.gguf", "other", timeout=t), 1.0),
        )
        for what, call, limit in checks:
            t0 = time.monotonic()
            code, details = outcome(lambda call=call, limit=limit: call(3 * limit))
            took = time.monotonic() - t0
            seen.append(f"{what}: {code.name} in {took:.2f} s (unload done: {unload.done()})")
            if code != C.OK or took > limit:
                problems.append(f"{what} during the unload of a streaming model: {code.name} after {took:.2f} s "
                                f"(limit {limit} s) {details[:120]}")
    finally:
        if problems:
            stream.cancel()  # today: end the stream so the blocked unload can finish
    end = drain_stream(stream)
    if end[0] == "error" and end[1] not in STREAM_ENDS and not (problems and end[1] == C.CANCELLED):
        problems.append(f"the stream of the unloaded model ended {end[1].name}: {end[2][:200]} "
                        f"(expected a normal finish or one of {sorted(c.name for c in STREAM_ENDS)})")
    try:
        resp = unload.result(timeout=180)
        if resp.name != "long":
            problems.append(f"unload answered {resp}")
    except grpc.RpcError as e:
        problems.append(f"the unload of the streaming model answered {e.code().name}: {e.details()}")
    pool.shutdown()
    assert "long" not in names(s)
    assert not problems, "\n".join(problems + ["seen: " + "; ".join(seen), f"stream: {end}"])


# A load's GetStatus p99 alone on 2 cores sits far under 200 ms; beside another pytest worker
# 206 ms was seen once (session 28), where before the redesign every call waited out the whole
# load (2.4-3.2 s): 400 ms there still tells a stall, as in test_chaos.
LOAD_STATUS_P99 = 0.2 if ALONE else 0.4


def _percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def test_status_answers_while_a_large_file_loads(start, big_model):
    """Issue 13 item 5: GetStatus waited 2.4-3.2 s behind every large load (the upload and the
    tokenizer build ran under the host lock)."""
    d = start("--budget", "2GiB")
    s = stub_of(d)
    status(s)  # the channel is up
    call = s.LoadModel(pb2.LoadModelRequest(name="big", path=big_model, ctx=256), timeout=120)
    phases, done = [], threading.Event()

    def consume():
        try:
            for ev in call:
                phases.append((time.monotonic(), ev.phase))
        except grpc.RpcError as e:
            phases.append((time.monotonic(), f"error {e.code().name}: {e.details()}"))
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    t_end = time.monotonic() + 60
    while not phases and not done.is_set():  # "planning": the load has begun
        assert time.monotonic() < t_end, "no progress in 60 s"
        time.sleep(0.002)
    lat, bad, slowest = [], [], (0.0, "")
    while not done.is_set():
        t0 = time.monotonic()
        code, details = outcome(lambda: s.GetStatus(pb2.GetStatusRequest(), timeout=5))
        lat.append(time.monotonic() - t0)
        if code != C.OK:
            bad.append(f"{code.name}: {details[:120]}")
        slowest = max(slowest, (lat[-1], phases[-1][1]))
        time.sleep(0.01)
    assert phases[-1][1] == "ready", phases[-1]
    load_s = phases[-1][0] - phases[0][0]
    summary = (f"{len(lat)} GetStatus calls during a {load_s:.2f} s load: "
               f"p50 {_percentile(lat, 0.5) * 1e3:.0f} ms, p99 {_percentile(lat, 0.99) * 1e3:.0f} ms, "
               f"max {max(lat) * 1e3:.0f} ms (in phase {slowest[1]!r})" if lat else f"no GetStatus call during a {load_s:.2f} s load")
    print("\n" + summary)
    assert not bad, bad
    # p99, and the max against the load's length: building a large vocabulary's tokenizer
    # (tokenizers.models.BPE, in Rust) holds the GIL in one stretch, 0.25 s for this 152k-token
    # vocabulary on a quiet machine and 1.8 s beside other test workers, which one call waits
    # out. Before the redesign every call waited out the whole load.
    assert _percentile(lat, 0.99) <= LOAD_STATUS_P99 and max(lat) < max(1.0, 0.5 * load_s), summary
    assert len(lat) >= 10, summary  # the load took long enough for the check to mean something
