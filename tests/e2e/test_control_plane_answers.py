"""Issue 13, items 6, 10 and 11, black-box against a real `minferd serve --device cpu`: weight sets
kept apart by file identity, a refused load that touches nothing, per-model health in step with
the table, truthful answers to promote, demote and explicit plans, and no threads left behind."""
from __future__ import annotations

import math
import time

import grpc
import psutil

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


# ---- 6. a refused load changes things -----------------------------------------------------------
def test_weight_sets_are_files_and_a_refused_load_touches_nothing(start):
    """Issue 13 item 6: a weight set was tagged by its first loader's name, so after "F as x, F as
    y, unload x, G as x" F's and G's weights merged under one tag, per-model bytes double-counted
    and admission evicted x for a load it then refused."""
    d = start("--budget", "12MiB")
    s = stub_of(d)
    problems = []
    f_w = load(s, "f.gguf", "x").bytes.weights
    load(s, "f.gguf", "y")
    s.UnloadModel(pb2.UnloadModelRequest(name="x"), timeout=30)
    u3 = status(s).pool.used_bytes
    load(s, "g.gguf", "x")
    st = status(s)
    u4 = st.pool.used_bytes
    x, y = ({m.name: m for m in st.models}[n] for n in ("x", "y"))
    g_w = u4 - u3 - x.bytes.kv - x.bytes.scratch  # what loading G as x added, less its own KV and scratch
    if x.bytes.weights != g_w or y.bytes.weights != f_w:
        problems.append(f"weights by model: x (G) shows {x.bytes.weights}, y (F) {y.bytes.weights}; "
                        f"loading G added {g_w}, F holds {f_w}")
    if not (x.weight_set and y.weight_set and x.weight_set != y.weight_set):
        problems.append(f"weight_set: x {x.weight_set!r}, y {y.weight_set!r} (two files: two non-empty, different)")
    naive = sum(m.bytes.weights + m.bytes.w16 + m.bytes.kv + m.bytes.scratch for m in st.models)
    if dedup_bytes(st) != u4:
        problems.append(f"per-model bytes deduplicated by weight_set sum to {dedup_bytes(st)} "
                        f"(without dedup {naive}), used_bytes {u4}")
    if st.pool.allocated_bytes != u4:
        problems.append(f"allocated_bytes {st.pool.allocated_bytes} != used_bytes {u4}")

    # A load that cannot fit: F again as z (sharing F's weights, so it needs only KV and scratch)
    # with a KV that needs more than what is free plus everything x could give back, but less than
    # that plus F's weights (what x's footprint counted twice).
    # KV is whole blocks, and one more that padded decode batches write to.
    kv_per_token, scratch = y.bytes.kv / (y.engine.kv_tokens + y.engine.block_size), y.bytes.scratch
    free = st.pool.free_bytes
    true_x = x.bytes.kv + x.bytes.scratch + g_w
    ctx_z = math.ceil((free + true_x + f_w // 2 - scratch) / kv_per_token) - y.engine.block_size
    assert ctx_z <= 16384, ctx_z
    before = snapshot(st)
    code, msg = outcome(lambda: load(s, "f.gguf", "z", ctx=ctx_z))
    after_st = status(s)
    if code != C.RESOURCE_EXHAUSTED:
        problems.append(f"a load that cannot fit answered {code.name}: {msg[:200]}")
    if snapshot(after_st) != before:
        problems.append(f"the refused load changed the pool:\n  before {before}\n  after  {snapshot(after_st)}")
    print(f"\nrefused (x idle, not expired): {code.name}: {msg[:300]}")

    # The same with x idle and expired, so that it may be evicted: the refusal must still be made
    # before anything is evicted (the reaper may take x meanwhile: that is an expiry, not an eviction).
    n_events = len(after_st.events)
    s.SetModelOptions(pb2.SetModelOptionsRequest(name="x", keep_alive_seconds=0.05), timeout=10)
    time.sleep(0.1)  # x has expired (the reaper, once a second, may or may not have taken it yet)
    code, msg = outcome(lambda: load(s, "f.gguf", "z", ctx=ctx_z))
    st2 = status(s)
    new_events = list(st2.events[n_events:]) if len(after_st.events) < 50 else list(st2.events)
    if code != C.RESOURCE_EXHAUSTED:
        problems.append(f"a load that cannot fit (x expired) answered {code.name}: {msg[:200]}")
    left = {m.name: m for m in st2.models}
    y_after = left["y"].bytes if "y" in left else None
    if y_after != y.bytes:
        problems.append(f"the refused load changed y's bytes: {'y is gone' if y_after is None else y_after} "
                        f"(were {y.bytes})".replace("\n", " "))
    about_x = [e for e in new_events if "x" in e.split()]
    if any("evict" in e or "unload" in e or "demot" in e for e in about_x):
        problems.append(f"the refused load evicted or demoted x: events {new_events}")
    elif "x" not in left and not any("expir" in e for e in about_x):
        problems.append(f"x is gone and no expiry says why: events {new_events}")
    print(f"refused (x expired): {code.name}: {msg[:300]}; events since: {new_events}")
    assert not problems, "\n".join(problems)


# ---- 10. health ----------------------------------------------------------------------------------
def test_model_health_follows_keep_alive_and_unload_when_idle(start):
    """Issue 13 item 10: `model/<name>` stayed SERVING after the model expired or was unloaded
    for keep-alive 0."""
    d = start("--budget", "256MiB")
    s, h = stub_of(d), health_of(d)
    problems = []
    load(s, "g.gguf", "ka", keep=1.0)
    assert model_health(h, "ka") == SERVING
    wait_gone(s, "ka", 5.0)
    if not is_gone(v := model_health(h, "ka")):
        problems.append(f"model/ka after its keep-alive expired: {health_name(v)}")

    load(s, "h.gguf", "zero", keep=0.0)  # unloaded once idle: after this request, or by the reaper
    code, details = outcome(lambda: list(s.Generate(gen_req("zero", 2), timeout=30)))
    assert code in (C.OK, C.NOT_FOUND), (code, details)
    wait_gone(s, "zero", 5.0)
    if not is_gone(v := model_health(h, "zero")):
        problems.append(f"model/zero after keep-alive 0 unloaded it: {health_name(v)}")

    load(s, "f.gguf", "plain", keep=-1)
    assert model_health(h, "plain") == SERVING
    s.UnloadModel(pb2.UnloadModelRequest(name="plain"), timeout=30)
    if not is_gone(v := model_health(h, "plain")):
        problems.append(f"model/plain after UnloadModel: {health_name(v)}")
    assert not problems, "\n".join(problems)


def test_load_whose_client_went_away_agrees_with_health(start, big_model):
    """Issue 13 item 10: a LoadModel whose client died still loaded, and health said NOT_FOUND."""
    d = start("--budget", "2GiB")
    s, h = stub_of(d), health_of(d)
    call = s.LoadModel(pb2.LoadModelRequest(name="gone", path=big_model, ctx=256), timeout=120)
    phases = []
    for ev in call:
        phases.append(ev.phase)
        if ev.phase == "weights":  # the load is under way
            break
    call.cancel()
    # Let it settle: no reservation outstanding (a load in progress holds one), twice in a row.
    end, quiet = time.monotonic() + 60, 0
    while quiet < 2:
        assert time.monotonic() < end, "a reservation is still outstanding 60 s after the cancel"
        quiet = quiet + 1 if status(s, timeout=30).pool.reserved_bytes == 0 else 0
        time.sleep(0.3)
    listed = "gone" in names(s)
    v = model_health(h, "gone")
    assert (listed and v == SERVING) or (not listed and is_gone(v)), \
        f"after a load whose client went away (phases {phases}): ListModels has it: {listed}, health {health_name(v)}"
    print(f"\nload cancelled after {phases}: listed {listed}, health {health_name(v)}")


# ---- 11. wrong answers -----------------------------------------------------------------------------
def test_promote_of_a_busy_demoted_model_is_not_resource_exhausted(start):
    """Issue 13 item 11: Promote of a demoted W16 model that was generating answered
    RESOURCE_EXHAUSTED with more memory free than the copy needs."""
    d = start("--budget", "256MiB", "--w16-min-bytes", "0")
    s = stub_of(d)
    info = load(s, "f.gguf", "hot", ctx=LONG_CTX, keep=-1)
    assert info.matmul_path == "w16", info.reason
    w16 = info.bytes.w16
    dem = s.Demote(pb2.DemoteRequest(name="hot"), timeout=30)
    assert dem.matmul_path != "w16" and dem.bytes.w16 == 0, dem
    stream = s.Generate(gen_req("hot", 1000), timeout=120)
    try:
        next(stream)  # busy now
        st = status(s)
        (m,) = [m for m in st.models if m.name == "hot"]
        assert m.busy and st.pool.free_bytes > w16, (m.busy, st.pool.free_bytes, w16)
        code, details = outcome(lambda: s.Promote(pb2.PromoteRequest(name="hot"), timeout=60))
    finally:
        stream.cancel()
    if code == C.OK:  # promoted, now or once the request finished
        end = time.monotonic() + 10
        while (m := next(m for m in status(s).models if m.name == "hot")).matmul_path != "w16":
            assert time.monotonic() < end, f"Promote answered OK but hot stays {m.matmul_path}"
            time.sleep(0.05)
        assert m.bytes.w16 == w16
    else:
        assert code == C.FAILED_PRECONDITION and "busy" in details.lower(), \
            f"Promote of a busy demoted model with {st.pool.free_bytes} bytes free ({w16} needed): {code.name}: {details}"


def test_demote_of_a_model_without_an_f16_copy_says_so(start):
    """Issue 13 item 11: Demote of an MMQ model reported success for a no-op."""
    d = start("--budget", "256MiB", "--w16-min-bytes", "0")
    s = stub_of(d)
    info = load(s, "g.gguf", "q", matmul_path=pb2.MMQ)
    assert info.matmul_path == "mmq" and info.bytes.w16 == 0, info
    code, details = outcome(lambda: s.Demote(pb2.DemoteRequest(name="q"), timeout=30))
    assert code == C.FAILED_PRECONDITION and "holds no f16 copy" in details, (code.name, details)


def test_explicit_matmul_path_on_a_loaded_file(start):
    """Issue 13 item 11: an explicit matmul_path on a second load of a loaded file was ignored
    (it shared the first load's plan) and its reason misreported."""
    d = start("--budget", "256MiB", "--w16-min-bytes", "0")
    s = stub_of(d)
    problems = []
    first = load(s, "h.gguf", "c1")
    assert first.matmul_path == "w16", first.reason
    for path in (pb2.MMQ, pb2.FUSED_B):
        label = pb2.MatmulPath.Name(path)
        try:
            m = load(s, "h.gguf", "c2", matmul_path=path)
            problems.append(f"{label} on a file loaded as c1 (w16): loaded, running {m.matmul_path} ({m.reason!r})")
            s.UnloadModel(pb2.UnloadModelRequest(name="c2"), timeout=30)
        except grpc.RpcError as e:
            details = e.details() or ""
            if e.code() != C.FAILED_PRECONDITION or "c1" not in details or "w16" not in details:
                problems.append(f"{label} on a file loaded as c1 (w16): {e.code().name}: {details[:200]}")
    used = status(s).pool.used_bytes
    for name, path in (("c3", pb2.W16), ("c4", pb2.MATMUL_PATH_AUTO)):
        m = load(s, "h.gguf", name, matmul_path=path)
        if "c1" not in m.shared_with or m.matmul_path != "w16" or m.weight_set != first.weight_set:
            problems.append(f"{pb2.MatmulPath.Name(path)} on a file loaded as c1: {m.matmul_path}, "
                            f"shared with {list(m.shared_with)}, weight_set {m.weight_set!r} vs {first.weight_set!r}")
        st = status(s)
        grew = st.pool.used_bytes - used
        if grew != m.bytes.kv + m.bytes.scratch:
            problems.append(f"{name} added {grew} bytes, not only its KV and scratch ({m.bytes.kv + m.bytes.scratch})")
        used = st.pool.used_bytes
    assert not problems, "\n".join(problems)


def test_unloaded_models_leave_no_threads_behind(start):
    """Issue 13 item 11: each unloaded CPU model left its thread pool behind (60-110 threads after
    unload-all of 150 models)."""
    d = start("--budget", "256MiB", "--threads", "2")
    s = stub_of(d)
    proc = psutil.Process(d.proc.pid)
    files = ("f.gguf", "g.gguf", "h.gguf")

    def load_all(names_):
        for i, n in enumerate(names_):
            load(s, files[i % 3], n)
            list(s.Generate(gen_req(n, 2), timeout=30))  # the model's thread pool does work

    def unload_all(names_):
        for n in names_:
            s.UnloadModel(pb2.UnloadModelRequest(name=n), timeout=30)

    warm = [f"w{i}" for i in range(3)]  # the gRPC pool and the first imports settle
    load_all(warm)
    unload_all(warm)
    time.sleep(0.5)
    base = proc.num_threads()
    many = [f"t{i}" for i in range(50)]
    load_all(many)
    loaded = proc.num_threads()
    unload_all(many)
    time.sleep(0.5)
    after = proc.num_threads()
    assert after <= base + 10, (f"{after} threads after loading and unloading 50 models, "
                                f"{base} before, {loaded} with all 50 loaded")
