"""The attack classes issue 13 listed (bench/hostile_sweep.py runs them): docstring "what was tried |
what is expected"."""
from hostile_harness import *  # noqa: F401,F403


def reaper_unload_race(d, k):
    """3 rounds of 6 models with keep_alive 1 s, each UnloadModel'd at 0.8-1.3 s (one mid-Generate), racing the
    reaper | OK or NOT_FOUND; the daemon serves on"""
    for rnd in range(3):
        names = [f"r{rnd}{i}" for i in range(6)]
        for n in names:
            d.load(n, "q.gguf", ctx=64, keep_alive_seconds=1.0)

        def go(i):
            time.sleep(0.8 + 0.1 * i)
            if i == 0:
                attempt(lambda: d.gen(names[0], n=8))
            return attempt(lambda: d.rpc("UnloadModel", name=names[i]))
        for i, r in enumerate(hold(go, 6)):
            k.expect(f"unload {names[i]}", r, {"OK", "NOT_FOUND", "ABORTED"})
    k.expect("Generate afterwards", attempt(lambda: d.gen("q")), OK)


def truncate_during_load(d, k):
    """a 150 MB file truncated to 1/3, to 0, and `cp`'d over by a small one at its first 'weights' progress |
    INVALID_ARGUMENT (or OK where the read was done); no signal, nothing held"""
    for i, how in enumerate(("third", "zero", "cp-over")):
        p = W.M / f"trunc{i}.gguf"
        shutil.copy(W.M / "big.gguf", p)

        def cut():
            if how == "cp-over":
                with open(p, "r+b") as f:
                    f.truncate(0)
                    f.write((W.M / "q.gguf").read_bytes())
            else:
                os.truncate(p, p.stat().st_size // 3 if how == "third" else 0)

        def load():
            out = None
            for ev in d.stub.LoadModel(pb2.LoadModelRequest(name=f"t{i}", path=p.name, ctx=64), metadata=d.md,
                                       timeout=60):
                if ev.phase == "weights" and out is None:
                    out = cut()
            return ev.phase
        k.expect(f"truncate {how}", attempt(load), {"INVALID_ARGUMENT", "OK"})
        attempt(lambda: d.rpc("UnloadModel", name=f"t{i}"))


def symlink_swap(d, k):
    """models/x.gguf flipped between a hard link of q.gguf and a symlink to outside/evil.gguf (llama) while it is
    loaded 60 times; static symlink, '..', absolute and directory-symlink paths outside | OK only as the inside
    qwen2 file, else PERMISSION_DENIED/NOT_FOUND; outside paths PERMISSION_DENIED"""
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.symlink(W.O / "evil.gguf", W.M / ".xl")
                os.replace(W.M / ".xl", W.M / "x.gguf")
                os.link(W.M / "q.gguf", W.M / ".xf")
                os.replace(W.M / ".xf", W.M / "x.gguf")
    t = threading.Thread(target=flip)
    t.start()
    try:
        for i in range(60):
            if k.expect(f"load x.gguf #{i}", attempt(lambda: d.load(f"sw{i}", "x.gguf", ctx=64)),
                        {"OK", "PERMISSION_DENIED", "NOT_FOUND"}) == "OK":
                m = next(m for m in d.status().models if m.name == f"sw{i}")
                k.check(m.architecture == "qwen2", f"sw{i} is {m.architecture}: the outside file, shown as {m.path}")
    finally:
        stop.set()
        t.join()
    for what, path in (("symlink out", "out.gguf"), ("..", "../outside/evil.gguf"), ("absolute", W.O / "evil.gguf"),
                       ("dir symlink", "sub/evil.gguf")):
        k.expect(what, attempt(lambda: d.load("sx", path)), {"PERMISSION_DENIED"})
    d.unload_all(keep=BASE)


def health_metrics_leaks(d, k):
    """grpc health overall/API/model/<loaded>/model/<absent> and /metrics, without, with a wrong, and with the
    token | overall open; per-model and /metrics UNAUTHENTICATED/401 alike for present and absent names"""
    for svc, md, want in (("", (), "OK"), ("minferd.v1.Minferd", (), "OK"), ("model/q", (), "UNAUTHENTICATED"),
                          ("model/nope", (), "UNAUTHENTICATED"), ("model/q", d.md, "OK"), ("model/nope", d.md, "NOT_FOUND")):
        k.expect(f"health {svc!r} {'token' if md else 'none'}", attempt(
            lambda: d.health.Check(health_pb2.HealthCheckRequest(service=svc), metadata=md, timeout=3)), {want})
    for what, hdr, want in (("none", {}, 401), ("wrong", {"Authorization": "Bearer " + "0" * 32}, 401),
                            ("64 KB header", {"Authorization": "Bearer " + "z" * 65536}, {401, 431, 400}),
                            ("token", {"Authorization": f"Bearer {TOKEN}"}, 200)):
        code, body = http_get(f"http://127.0.0.1:{W.METRICS}/metrics", hdr)
        k.check(code in (want if isinstance(want, set) else {want}), f"/metrics {what}: HTTP {code}")
        k.check((b'model="q"' in body) == (code == 200), f"/metrics {what}: model names {'missing' if code == 200 else 'leaked'}")



def stalls_behind_work(d, k):
    """UnloadModel of a model mid-stream (1500 tokens), then loads of two 150 MB files, GetStatus timed all along |
    the unload returns within 2 s, the stream ends ABORTED, GetStatus never past 0.5 s"""
    d.load("st", "q.gguf", ctx=2048)
    it = d.stub.Generate(pb2.GenerateRequest(model="st", text="hi", sampling=SP(max_tokens=1500, temperature=1.0)),
                         metadata=d.md, timeout=60)
    next(it)
    time.sleep(0.5)
    k.expect("UnloadModel mid-stream", attempt(lambda: d.rpc("UnloadModel", name="st")), OK, within=2.0)
    k.expect("the stream", attempt(lambda: list(it)), {"ABORTED"})
    for n in ("big", "big2"):
        k.expect(f"load {n}.gguf", attempt(lambda: d.load(n, f"{n}.gguf", ctx=64)), OK)
    for n in ("big", "big2"):
        attempt(lambda: d.rpc("UnloadModel", name=n))


def weight_sets_and_refusals(d, k):
    """load F as wa and wb, unload wa, load G as wa; a load whose KV (ctx 4M) passes the budget; an explicit W16 on a
    second load of an MMQ file | separate weight sets, ledger exact; RESOURCE_EXHAUSTED and FAILED_PRECONDITION
    with the table unchanged"""
    a, b = d.load("wa", "q.gguf"), d.load("wb", "q.gguf")
    k.check(a.weight_set == b.weight_set, "two loads of one file do not share a weight set")
    d.rpc("UnloadModel", name="wa")
    a2 = d.load("wa", "l.gguf")
    k.check(a2.weight_set != b.weight_set and a2.architecture == "llama", f"wa after reload: {a2.architecture}")
    ledger_ok(d, k)
    before = [(m.name, m.matmul_path, m.bytes.kv) for m in d.status().models]
    k.expect("ctx 4M", attempt(lambda: d.load("huge", "hugectx.gguf", ctx=1 << 22)), {"RESOURCE_EXHAUSTED"})
    k.expect("W16 on a loaded MMQ file", attempt(lambda: d.load("wc", "q.gguf", matmul_path=pb2.W16)),
             {"FAILED_PRECONDITION"})
    after = [(m.name, m.matmul_path, m.bytes.kv) for m in d.status().models]
    k.check(before == after, f"a refused load changed the table: {set(before) ^ set(after)}")
    for n in ("wa", "wb"):
        d.rpc("UnloadModel", name=n)


TEMPLATES = {  # model file -> (its tokenizer.chat_template, the codes Chat may answer)
    "syntax": ("{% for m in messages %}\n{{ m.role }\n", {"FAILED_PRECONDITION"}),
    "zero": ("{{ 1 / 0 }}", INV), "type": ("{{ messages[0]['content'] + 1 }}", INV),
    "loop": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", INV),
    "strmul": ("{{ 'x' * 10 ** 10 }}", INV), "raise": ("{{ raise_exception('no') }}", INV),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", INV),
    "width": ("{{ '%999999999d' % 1 }}", INV), "center": ("{{ 'x'|center(999999999) }}", INV),
    "fmt": ("{{ '{:>999999999}'.format(1) }}", INV),
    "double": ("{% set ns = namespace(x='a') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}"
               "{{ ns.x|length }}", INV),
    "escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", INV),
    "huge": ("{# " + "x" * (100 << 10) + " #}", {"FAILED_PRECONDITION"}),
    # 24 strings of 8 MB kept across loop steps: each step is within bounds, the render holds 192 MB
    "hoard": ("{% set ns = namespace(x=[]) %}{% for i in range(24) %}{% set ns.x = ns.x + ['y' * 8000000] %}"
              "{% endfor %}{{ ns.x|length }}", {"OK", "INVALID_ARGUMENT"}),
}


def chat_templates(d, k):
    """Chat on models whose templates do not compile, divide by zero, mistype, loop 10^10, build 10 GB strings
    (*, %-width, center, format, doubling ~), recurse, raise, escape the sandbox, are 100 KB, or hoard 24 x 8 MB |
    FAILED_PRECONDITION/INVALID_ARGUMENT within 5 s, the daemon's peak RSS up by < 64 MB, Generate still serves"""
    for name, (_, allowed) in TEMPLATES.items():
        d.load(f"t-{name}", f"t-{name}.gguf", ctx=256)
        Path(f"/proc/{d.pid}/clear_refs").write_text("5")  # resets VmHWM, the peak RSS
        rss0 = vm(d, "VmHWM")
        msgs = [pb2.ChatMessage(role="user", content="hi")]
        k.expect(f"Chat t-{name}", attempt(lambda: d.rpc("Chat", 20, model=f"t-{name}", messages=msgs,
                                                          sampling=SP(max_tokens=2))), allowed, within=5.0)
        grew = vm(d, "VmHWM") - rss0
        k.check(grew < 64 << 10, f"Chat t-{name}: the daemon's peak RSS grew by {grew >> 10} MB")
        k.expect(f"Generate t-{name}", attempt(lambda: d.gen(f"t-{name}", n=2)), OK)
        d.rpc("UnloadModel", name=f"t-{name}")



def amplifying_inputs(d, k):
    """100 KB names in Load/Unload/Generate, 300k-component and 1 MB paths, Detokenize 3.5M ids, Tokenize 4 MB of digits and 6 MB,
    Generate 12 MB of text or 1M ids, 15 stop strings of 1 MB, 17 stop strings, Chat of 5000 / 4000 x 1 KB
    messages, a 17 MB message, gzip bombs of 15 and 40 MB | typed refusals (the 1 MB stops may run) within 5 s, messages under 2000 chars"""
    name, hi = "n" * 100_000, [pb2.ChatMessage(role="user", content="hi")]
    for what, fn, allowed in (
            ("LoadModel name 100 KB", lambda: d.load(name, "q.gguf"), INV),
            ("UnloadModel name 100 KB", lambda: d.rpc("UnloadModel", name=name), {"NOT_FOUND", "INVALID_ARGUMENT"}),
            ("Generate model 100 KB", lambda: d.gen(name), {"NOT_FOUND", "INVALID_ARGUMENT"}),
            ("path of 300k components", lambda: d.load("p", "/a" * 300_000), INV),
            ("path of 1 MB", lambda: d.load("p", "x" * 1_000_000), INV),
            ("Detokenize 3.5M ids", lambda: d.rpc("Detokenize", model="q", ids=[5] * 3_500_000), INV),
            # 4M ids answer in > 4 MiB, past gRPC's default client limit (minferd.client's too): RESOURCE_EXHAUSTED
            ("Tokenize 4 MB of digits", lambda: len(d.rpc("Tokenize", 60, model="q", text="1" * (4 << 20)).ids),
             {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}),
            ("Tokenize 6 MB", lambda: d.rpc("Tokenize", model="q", text="ab " * 2_000_000), INV),
            ("Generate 12 MB text", lambda: d.gen("q", "ab " * 4_000_000), INV),
            ("Generate 1M ids", lambda: d.rpc("Generate", model="q", ids=pb2.TokenIds(ids=[5] * 1_000_000),
                                              sampling=SP(max_tokens=2)), INV),
            ("15 stops of 1 MB", lambda: d.gen("q", n=50, temperature=1.5, stop=["a" * (1 << 20)] * 15), OK),
            ("17 stops", lambda: d.gen("q", stop=["x"] * 17), INV),
            ("Chat 5000 messages", lambda: d.rpc("Chat", model="q", messages=hi * 5000, sampling=SP(max_tokens=2)), INV),
            ("Chat 4000 x 1 KB", lambda: d.rpc("Chat", model="q", messages=[pb2.ChatMessage(role="user", content="w " * 500)]
                                               * 4000, sampling=SP(max_tokens=2)), {"OK", "INVALID_ARGUMENT"}),
            ("17 MB message", lambda: d.rpc("Tokenize", model="q", text="a" * (17 << 20)), {"RESOURCE_EXHAUSTED"}),
            ("gzip: 15 MB in 15 KB", lambda: d.stub.Tokenize(pb2.TokenizeRequest(model="q", text="\0" * (15 << 20)),
                                                           metadata=d.md, timeout=10, compression=grpc.Compression.Gzip), INV),
            ("gzip: 40 MB in 40 KB", lambda: d.stub.Tokenize(pb2.TokenizeRequest(model="q", text="\0" * (40 << 20)),
                                                           metadata=d.md, timeout=10, compression=grpc.Compression.Gzip),
             {"RESOURCE_EXHAUSTED"})):
        k.expect(what, attempt(fn), allowed, within=30.0 if "digits" in what else 5.0)


def health_vs_table(d, k):
    """a model with keep_alive 0.5 s left idle; one with keep_alive 0 after a Generate; a LoadModel of 150 MB whose
    client cancels after 'planning' | health model/<name> NOT_FOUND exactly when the table lacks the name"""
    d.load("hx", "q.gguf", ctx=64, keep_alive_seconds=0.5)
    k.check(d.served("hx") == "OK", "health of a loaded model is not SERVING")
    d.load("h0", "q.gguf", ctx=64, keep_alive_seconds=0.0)
    d.gen("h0")
    it = d.stub.LoadModel(pb2.LoadModelRequest(name="hc", path="big.gguf", ctx=64), metadata=d.md, timeout=60)
    next(it)
    it.cancel()
    time.sleep(2.6)
    names = d.names()
    for n in ("hx", "h0", "hc"):
        k.check((n in names) == (d.served(n) == "OK"), f"{n}: in the table {n in names}, health {d.served(n)}")
    k.check("hx" not in names and "h0" not in names, f"expired models still loaded: {names & {'hx', 'h0'}}")
    attempt(lambda: d.rpc("UnloadModel", name="hc"))


def promote_demote(d, k):
    """Demote/Promote of a W16 model twice each, of an MMQ model, of an unknown name, and Promote of a demoted model
    that is streaming | OK then FAILED_PRECONDITION for a second demote; promote OK (twice); MMQ both
    FAILED_PRECONDITION; NOT_FOUND; the busy promote waits and succeeds (never RESOURCE_EXHAUSTED)"""
    k.check(d.load("w", "w.gguf", matmul_path=pb2.W16).matmul_path == "w16", "explicit W16 not honoured")
    for what, rpc, name, want in (("demote w16", "Demote", "w", OK), ("demote again", "Demote", "w", {"FAILED_PRECONDITION"}),
                                  ("promote", "Promote", "w", OK), ("promote again", "Promote", "w", OK),
                                  ("demote mmq", "Demote", "q", {"FAILED_PRECONDITION"}),
                                  ("promote mmq", "Promote", "q", {"FAILED_PRECONDITION"}),
                                  ("demote unknown", "Demote", "nope", {"NOT_FOUND"}), ("demote w16", "Demote", "w", OK)):
        k.expect(what, attempt(lambda: d.rpc(rpc, name=name)), want)
    k.check(next(m for m in d.status().models if m.name == "w").waiting_for_w16, "a demoted W16 model is not waiting")
    t = threading.Thread(target=lambda: attempt(lambda: d.gen("w", n=150)))
    t.start()
    time.sleep(0.3)
    k.expect("promote while streaming", attempt(lambda: d.rpc("Promote", name="w")), OK, within=15)
    t.join()
    k.check(next(m for m in d.status().models if m.name == "w").matmul_path == "w16", "w is not w16 after promote")
    d.rpc("UnloadModel", name="w")


def same_file_200_names(d, k):
    """one file loaded under 200 names, then all 200 unloaded from 4 threads (issue item 11's thread leak) | one
    weight set, ledger exact, NOT_FOUND's list bounded; used and thread count back where they were"""
    t0, used0 = d.threads(), d.status().pool.used_bytes
    for i in range(200):
        k.expect(f"load n{i}", attempt(lambda: d.load(f"n{i}", "q.gguf", ctx=32)), OK)
    st = ledger_ok(d, k)
    k.check(len({m.weight_set for m in st.models if m.name[0] == "n"}) == 1, "200 loads of one file: several weight sets")
    k.expect("NOT_FOUND among 200", attempt(lambda: d.gen("nope")), {"NOT_FOUND"})
    mid = d.threads()
    hold(lambda i: [k.expect("unload", attempt(lambda: d.rpc("UnloadModel", name=f"n{j}")), OK) for j in range(i, 200, 4)], 4)
    time.sleep(1.0)
    k.check(d.threads() <= t0 + 4, f"threads {t0} -> {mid} with 200 more models -> {d.threads()} after unloading them")
    k.check(d.status().pool.used_bytes == used0, "used bytes not back after unloading the 200")
