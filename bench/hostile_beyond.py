"""The attack classes beyond issue 13's list (bench/hostile_sweep.py runs them): docstring "what was
tried | what is expected"."""
from hostile_harness import *  # noqa: F401,F403


def streams_abandoned(d, k):
    """2000 Generate streams opened on one model and cancelled at once | GetStatus answers within 2 s, the model
    idle again within 15 s"""
    calls = [d.stub.Generate(pb2.GenerateRequest(model="q", text="hi", sampling=SP(max_tokens=64)), metadata=d.md,
                             timeout=60) for _ in range(2000)]
    for c in calls:
        c.cancel()
    t0 = time.monotonic()
    while attempt(lambda: d.status(timeout=1))[0] != "OK" and time.monotonic() - t0 < 20:
        pass
    k.check(time.monotonic() - t0 < 2.0, f"GetStatus answered {time.monotonic() - t0:.1f} s after the cancels")
    while any(m.busy for m in d.status().models) and time.monotonic() - t0 < 15:
        time.sleep(0.2)
    k.check(not any(m.busy for m in d.status().models), "the model still busy 15 s after 2000 cancelled streams")


def streams_pending(d, k):
    """300 Generate streams (64 tokens each) held open on one model for 3 s, then cancelled | GetStatus and health
    Check answer within 0.5 s while they wait; all idle again after the cancel"""
    calls = [d.stub.Generate(pb2.GenerateRequest(model="q", text="hi", sampling=SP(max_tokens=64)), metadata=d.md,
                             timeout=60) for _ in range(300)]
    time.sleep(1.5)
    for i in range(3):
        k.expect("GetStatus behind 300 streams", attempt(lambda: d.status(timeout=2)), OK, within=STALL)
    k.expect("health Check behind 300 streams", attempt(lambda: d.health.Check(
        health_pb2.HealthCheckRequest(service=""), timeout=2)), OK, within=STALL)
    for c in calls:
        c.cancel()
    t0 = time.monotonic()
    while attempt(lambda: d.status(timeout=1))[0] != "OK" and time.monotonic() - t0 < 20:
        pass
    k.check(attempt(lambda: d.status(timeout=1))[0] == "OK", "GetStatus not back 20 s after the cancel")


def never_reading(d, k):
    """a Generate stream (400 tokens) on a 1 KB flow-control window whose client reads one event and stops (its
    handler then waits in grpc's _send_response) |
    the model's worker is not blocked (it goes idle, serves another Generate); UnloadModel returns within 2 s;
    threads back after the client goes"""
    d.load("nr", "q.gguf", ctx=1024)
    t0 = d.threads()
    slow = grpc.insecure_channel(d.address, options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0),
                                                     ("grpc.use_local_subchannel_pool", 1)])
    its = [pb2_grpc.MinferdStub(slow).Generate(pb2.GenerateRequest(model="nr", text="hi", sampling=SP(
        max_tokens=400, temperature=1.5)), metadata=d.md, timeout=60)]
    next(its[0])
    k.expect("Generate beside the non-reader", attempt(lambda: d.gen("nr", n=4)), OK, within=20)
    end = time.monotonic() + 15
    while next(m for m in d.status().models if m.name == "nr").busy and time.monotonic() < end:
        time.sleep(0.2)
    k.check(not next(m for m in d.status().models if m.name == "nr").busy, "nr's worker still busy: blocked on its client")
    k.expect("UnloadModel, its client not reading", attempt(lambda: d.rpc("UnloadModel", name="nr")), OK, within=2.0)
    for it in its:
        it.cancel()
    slow.close()
    time.sleep(1.0)
    k.check(d.threads() <= t0 + 2, f"threads {t0} -> {d.threads()} after the non-reading client left")


def deadlines_1ms(d, k):
    """every Minferd RPC, health and reflection with a 1 ms deadline, 5 times each (loads of q.gguf and of a 150 MB
    file included) | OK/DEADLINE_EXCEEDED or the call's own typed refusal; afterwards health == table for every
    name, nothing reserved, ledger exact"""
    hi = [pb2.ChatMessage(role="user", content="hi")]
    reqs = {"LoadModel": lambda i: dict(name=f"dl{i}", path="q.gguf", ctx=64),
            "LoadBig": lambda i: dict(name=f"db{i}", path="big.gguf", ctx=64),
            "UnloadModel": lambda i: dict(name=f"dl{i}"), "ListModels": lambda i: {}, "GetStatus": lambda i: {},
            "Generate": lambda i: dict(model="q", text="hi", sampling=SP(max_tokens=8)),
            "Chat": lambda i: dict(model="q", messages=hi, sampling=SP(max_tokens=8)),
            "Tokenize": lambda i: dict(model="q", text="hello"), "Detokenize": lambda i: dict(model="q", ids=[1, 2]),
            "SetModelOptions": lambda i: dict(name="q", keep_alive_seconds=-1), "Demote": lambda i: dict(name="q"),
            "Promote": lambda i: dict(name="q")}
    for method, req in reqs.items():
        for i in range(5):
            m = "LoadModel" if method == "LoadBig" else method
            k.expect(f"{method} 1 ms", attempt(lambda: d.rpc(m, 0.001, **req(i))), TYPED)
    refl = reflection_pb2_grpc.ServerReflectionStub(d.ch)
    for i in range(5):
        k.expect("health 1 ms", attempt(lambda: d.health.Check(health_pb2.HealthCheckRequest(service="model/q"),
                                                               metadata=d.md, timeout=0.001)), TYPED)
        k.expect("reflection 1 ms", attempt(lambda: list(refl.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=d.md, timeout=0.001))), TYPED)
    time.sleep(2.0)
    names = d.names()
    for n in [f"dl{i}" for i in range(5)] + [f"db{i}" for i in range(5)]:
        k.check((n in names) == (d.served(n) == "OK"), f"{n}: in the table {n in names}, health {d.served(n)}")
    d.unload_all(keep=BASE)


def keep_alive_values(d, k):
    """SetModelOptions keep_alive NaN, inf, -inf, -1e308, 1e308 (then 1.2 s idle), 0 (then 2.5 s); LoadModel with
    NaN; an unknown name | NaN INVALID_ARGUMENT; the others OK; 1e308 keeps it, 0 lets the reaper unload it
    (no reaper error in the log); NOT_FOUND"""
    d.load("ka", "q.gguf", ctx=64)
    for v, want in ((math.nan, INV), (math.inf, OK), (-math.inf, OK), (-1e308, OK), (1e308, OK)):
        k.expect(f"keep_alive {v}", attempt(lambda: d.rpc("SetModelOptions", name="ka", keep_alive_seconds=v)), want)
    k.expect("LoadModel keep_alive NaN", attempt(lambda: d.load("kn", "q.gguf", keep_alive_seconds=math.nan)), INV)
    k.expect("unknown name", attempt(lambda: d.rpc("SetModelOptions", name="nope", pinned=True)), {"NOT_FOUND"})
    time.sleep(1.2)
    k.check("ka" in d.names(), "keep_alive 1e308 unloaded the model")
    k.expect("keep_alive 0", attempt(lambda: d.rpc("SetModelOptions", name="ka", keep_alive_seconds=0.0)), OK)
    time.sleep(2.5)
    k.check("ka" not in d.names(), "keep_alive 0: an idle model still loaded after 2.5 s")


SAMPLING = (  # (field values, the code they must get)
    (dict(temperature=-1), INV), (dict(temperature=math.nan), INV), (dict(temperature=math.inf), INV),
    (dict(temperature=1e308), OK), (dict(temperature=1e-300), OK), (dict(top_k=-1), INV), (dict(top_k=2**31 - 1), OK),
    (dict(top_p=0), INV), (dict(top_p=math.nan), INV), (dict(top_p=2), INV), (dict(top_p=5e-324), OK),
    (dict(min_p=-1), INV), (dict(min_p=math.nan), INV), (dict(min_p=1.0), OK), (dict(repeat_penalty=0), INV),
    (dict(repeat_penalty=-1), INV), (dict(repeat_penalty=math.inf), INV), (dict(repeat_penalty=1e-300), OK),
    (dict(repeat_penalty=1e300), OK), (dict(repeat_last_n=-2), INV), (dict(repeat_last_n=2**31 - 1), OK),
    (dict(repeat_last_n=-2**31), INV), (dict(seed=2**64 - 1), OK), (dict(max_tokens=0), INV),
    (dict(max_tokens=2**32 - 1), INV), (dict(max_tokens=5000), INV))


def sampling_extremes(d, k):
    """Generate with each sampling field negative, zero, NaN, inf, tiny and huge (26 cases) | INVALID_ARGUMENT for
    values outside the field's range, OK for valid extremes, within 5 s"""
    for kw, want in SAMPLING:
        sp = {"max_tokens": 3, **kw}
        k.expect(f"{kw}", attempt(lambda: d.rpc("Generate", model="q", text="hi", sampling=SP(**sp))), want, within=5)


def load_unload_storm(d, k):
    """8 threads x 12 rounds of LoadModel + UnloadModel of one name (half at ctx 64, half at ctx 96) | OK,
    NOT_FOUND, FAILED_PRECONDITION or ABORTED; all done within 60 s; nothing reserved after, ledger exact"""
    t0 = time.monotonic()
    results = hold(lambda i: [attempt(fn) for _ in range(12) for fn in (
        lambda: d.load("race", "q.gguf", ctx=64 + 32 * (i % 2)), lambda: d.rpc("UnloadModel", name="race"))], 8)
    for rs in results:
        for r in rs or [("HUNG", "a thread did not finish", 0)]:
            k.expect("load/unload race", r, {"OK", "NOT_FOUND", "FAILED_PRECONDITION", "ABORTED"})
    k.check(time.monotonic() - t0 < 60, f"the storm took {time.monotonic() - t0:.0f} s")
    attempt(lambda: d.rpc("UnloadModel", name="race"))


def reflection_token(d, k):
    """server reflection (list services, a file by symbol) without, with a wrong, and with the token | 
    UNAUTHENTICATED without the token, OK with it"""
    refl = reflection_pb2_grpc.ServerReflectionStub(d.ch)
    for req in (reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="minferd.v1.Minferd")):
        for what, md, want in (("none", (), "UNAUTHENTICATED"), ("wrong", (("authorization", "Bearer " + "0" * 32),),
                               "UNAUTHENTICATED"), ("token", d.md, "OK")):
            k.expect(f"reflection {what}", attempt(lambda: list(refl.ServerReflectionInfo(iter([req]), metadata=md,
                                                                                         timeout=5))), {want})


def metadata_16k(d, k):
    """GetStatus with a 16 KB and a 20 KB extra header, a 16 KB bogus token, 500 headers, an 8 KB binary header |
    OK or RESOURCE_EXHAUSTED (UNAUTHENTICATED for the bogus token); the daemon unaffected"""
    for what, md, want in (("16 KB header", d.md + (("x-pad", "a" * 16000),), {"OK", "RESOURCE_EXHAUSTED"}),
                           ("20 KB header", d.md + (("x-pad", "a" * 20000),), {"RESOURCE_EXHAUSTED"}),
                           ("16 KB token", (("authorization", "Bearer " + "z" * 16000),), {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED"}),
                           ("500 headers", d.md + tuple((f"x-h{i}", "v" * 20) for i in range(500)), {"OK", "RESOURCE_EXHAUSTED"}),
                           ("binary header", d.md + (("x-b-bin", b"\x00\xff" * 4000),), {"OK", "RESOURCE_EXHAUSTED"})):
        k.expect(what, attempt(lambda: d.stub.GetStatus(pb2.GetStatusRequest(), metadata=md, timeout=5)), want)


def special_files(d, k):
    """LoadModel of a FIFO, a directory, a character device (1,5 = /dev/zero), a symlink to /dev/zero inside the
    models dir, /dev/zero, /proc/self/environ | NOT_FOUND/INVALID_ARGUMENT/PERMISSION_DENIED within 2 s, no hang"""
    for p in ("fifo.gguf", "dir.gguf", "chr.gguf", "zero.gguf", "/dev/zero", "/proc/self/environ"):
        k.expect(p, attempt(lambda: d.load("sp", p)), {"NOT_FOUND", "INVALID_ARGUMENT", "PERMISSION_DENIED"}, within=2.0)


def hard_link(d, k):
    """a hard link of q.gguf inside the models dir, loaded beside q | OK, the same weight set as q (one identity)"""
    ws = next(m.weight_set for m in d.status().models if m.name == "q")
    k.check(k.expect("load hard.gguf", attempt(lambda: d.load("hl", "hard.gguf")), OK) == "OK" and
            next(m.weight_set for m in d.status().models if m.name == "hl") == ws, "a hard link is another weight set")
    attempt(lambda: d.rpc("UnloadModel", name="hl"))



def utf8_edges(d, k):
    """invalid UTF-8 on the wire (an encoded surrogate, an overlong NUL, a cut sequence) in Tokenize.text,
    Generate.model, LoadModel.name; NUL, U+202E, U+200D in names; NUL in paths; NUL, BOM, U+FFFF, U+10FFFF in
    prompts; an emoji name | INVALID_ARGUMENT for the bad ones (never INTERNAL); OK for valid text"""
    for what, fn, want in (
            ("Tokenize text ED A0 80", raw(d, "Tokenize", b"\x0a\x01q\x12\x03\xed\xa0\x80"), INV),
            ("Generate model C0 80", raw(d, "Generate", b"\x0a\x02\xc0\x80\x12\x02hi", True), INV),
            ("LoadModel name E2 82", raw(d, "LoadModel", b"\x0a\x02\xe2\x82\x12\x06q.gguf", True), INV),
            ("name with NUL", lambda: d.load("a\x00b", "q.gguf"), INV), ("name U+202E", lambda: d.load("a\u202eb", "q.gguf"), INV),
            ("name U+200D", lambda: d.load("a\u200db", "q.gguf"), INV), ("path with NUL", lambda: d.load("p", "q\x00.gguf"), INV),
            ("prompt NUL/BOM/U+FFFF", lambda: d.gen("q", "a\x00\ufeff\uffff\U0010ffff"), OK),
            ("Tokenize NUL", lambda: d.rpc("Tokenize", model="q", text="\x00" * 100), OK),
            ("emoji name", lambda: d.load("\U0001f999x", "q.gguf"), OK)):
        k.expect(what, attempt(fn), want)
    attempt(lambda: d.rpc("UnloadModel", name="\U0001f999x"))


def bad_token_ids(d, k):
    """Detokenize of -1, -2^31, 2^31-1, the vocab size; Generate with ids -1, the vocab size, none | INVALID_ARGUMENT"""
    for ids in ([-1], [-2**31], [2**31 - 1], [1024], [1, -5, 2]):
        k.expect(f"Detokenize {ids}", attempt(lambda: d.rpc("Detokenize", model="q", ids=ids)), INV)
    for ids in ([-1], [1024], []):
        k.expect(f"Generate ids {ids}", attempt(lambda: d.rpc("Generate", model="q", ids=pb2.TokenIds(ids=ids),
                                                              sampling=SP(max_tokens=2))), INV)


def health_watch_storm(d, k):
    """(a daemon of its own, no token) up to 8 rounds of 40 health Watch streams on model/q, opened then cancelled |
    GetStatus answers within 0.5 s afterwards; SIGTERM still stops the daemon"""
    w = Daemon(W.TMP / "watch", ["--models-dir", W.M, "--budget", "256MiB", "--drain-seconds", "2"], token=None)
    try:
        w.load("q", "q.gguf", ctx=64)
        for rnd in range(8):
            ws = [w.health.Watch(health_pb2.HealthCheckRequest(service="model/q"), timeout=30) for _ in range(40)]
            for x in ws:
                x.cancel()
            if k.expect(f"GetStatus after round {rnd}", attempt(lambda: w.status(timeout=2)), OK, within=STALL) != "OK":
                spy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))  # where each thread waits
                dump = subprocess.run([spy, "dump", "--pid", str(w.pid)], capture_output=True, text=True, timeout=30)
                k.bad += [f"py-spy: {ln.strip()}" for ln in dump.stdout.splitlines() if "auth.py" in ln][:3]
                break
        os.kill(w.pid, signal.SIGTERM)
        end = time.monotonic() + 10
        while w.alive() and time.monotonic() < end:
            time.sleep(0.1)
        k.check(not w.alive(), "SIGTERM did not stop it within 10 s (drain 2 s)")
    finally:
        stop_daemon(w.pid, timeout=1)


def metrics_idle_connections(d, k):
    """100 idle TCP connections to the metrics port (any local user may open them: no token is needed to
    connect), a scrape with the token while they open and once they are open | daemon threads grow by at most
    32; each scrape answers within 2 s"""
    t0, conns = d.threads(), []
    flood = threading.Thread(target=lambda: conns.extend(sum(hold(lambda i: [socket.create_connection(
        ("127.0.0.1", W.METRICS), timeout=30) for _ in range(25)], 4), [])))
    flood.start()
    for when in ("while they open", "once they are open"):
        time.sleep(1.0)
        t1 = time.monotonic()
        code, _ = http_get(f"http://127.0.0.1:{W.METRICS}/metrics", {"Authorization": f"Bearer {TOKEN}"})
        k.check(code == 200 and time.monotonic() - t1 < 2, f"a scrape {when}: HTTP {code} in {time.monotonic() - t1:.1f} s")
        flood.join()
    mid = d.threads()
    for c in conns:
        c.close()
    time.sleep(1.0)
    k.check(mid - t0 <= 32, f"100 idle /metrics connections -> {mid - t0} more daemon threads ({d.threads()} after)")


def metrics_series_of_unloaded(d, k):
    """100 names each loaded, used by one Generate and unloaded; then /metrics with the token | no series left for
    the unloaded names (what /metrics holds stays bounded by what is loaded)"""
    for i in range(100):
        d.load(f"m{i:03d}", "q.gguf", ctx=32)
        d.gen(f"m{i:03d}", n=1)
        d.rpc("UnloadModel", name=f"m{i:03d}")
    code, body = http_get(f"http://127.0.0.1:{W.METRICS}/metrics", {"Authorization": f"Bearer {TOKEN}"})
    left = sum(f'model="m{i:03d}"'.encode() in body for i in range(100))
    k.check(code == 200 and left == 0, f"/metrics (HTTP {code}, {len(body)} bytes) keeps series of {left} of the 100 "
            "unloaded names")


def socket_garbage(d, k):
    """HTTP/1.1, an HTTP/2 preface + 4 KB of noise, 64 KB of noise written to the gRPC unix socket; 300 idle
    connections held open | GetStatus within 0.5 s throughout, threads not +300"""
    path = d.address.removeprefix("unix://")
    for payload in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(4096),
                    os.urandom(65536)):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(path)
            with contextlib.suppress(OSError):
                s.sendall(payload)
                s.recv(100)
    t0, idle = d.threads(), []
    for _ in range(300):
        idle.append(socket.socket(socket.AF_UNIX))
        idle[-1].connect(path)
    k.expect("GetStatus beside 300 idle connections", attempt(lambda: d.status(timeout=2)), OK, within=STALL)
    k.check(d.threads() - t0 < 100, f"300 idle connections -> {d.threads() - t0} more threads")
    for s in idle:
        s.close()


def odd_fields(d, k):
    """matmul_path 99, ctx 2^32-1, an empty path, a directory path with a trailing slash, Chat with no messages /
    an empty role / 'system\\n' / 'tool', Generate with no prompt, Tokenize of an unknown model | INVALID_ARGUMENT
    (NOT_FOUND for the unknown model), OK for the valid ones"""
    hi = lambda role: [pb2.ChatMessage(role=role, content="hi")]  # noqa: E731
    for what, fn, want in (
            ("matmul_path 99", lambda: d.load("o", "q.gguf", matmul_path=99), INV),
            ("ctx 2^32-1", lambda: d.load("o", "q.gguf", ctx=2**32 - 1), INV),
            ("empty path", lambda: d.load("o", ""), INV),
            ("dir path /", lambda: d.load("o", f"{W.M}/"), {"NOT_FOUND", "INVALID_ARGUMENT"}),
            ("Chat no messages", lambda: d.rpc("Chat", model="q", sampling=SP(max_tokens=2)), INV),
            ("Chat role ''", lambda: d.rpc("Chat", model="q", messages=hi(""), sampling=SP(max_tokens=2)), INV),
            ("Chat role 'system\\n'", lambda: d.rpc("Chat", model="q", messages=hi("system\n"), sampling=SP(max_tokens=2)), INV),
            ("Chat role tool", lambda: d.rpc("Chat", model="q", messages=hi("tool"), sampling=SP(max_tokens=2)), {"OK", "INVALID_ARGUMENT"}),
            ("Generate no prompt", lambda: d.rpc("Generate", model="q", sampling=SP(max_tokens=2)), {"OK", "INVALID_ARGUMENT"}),
            ("Tokenize unknown model", lambda: d.rpc("Tokenize", model="nope", text="x"), {"NOT_FOUND"})):
        k.expect(what, attempt(fn), want)
