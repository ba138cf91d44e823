"""Hostile-client sweep (issue 13, wider): real `minferd serve --device cpu` daemons in a temp dir,
attacked over real sockets, one function per attack class, a table of results at the end.

    python bench/hostile_sweep.py [--json FILE] [--only NAME,...]

Every class expects a typed gRPC status (never INTERNAL/UNKNOWN/UNAVAILABLE, never the daemon
dying), bounded error messages, and afterwards: the daemon answering GetStatus, used == allocated ==
the ledger's per-set/per-model sum, no traceback in its log, and GetStatus (timed every 50 ms by a
prober process of its own) never slower than 0.5 s while the class ran. Exit 1 on any FAIL.
"""
from __future__ import annotations

import argparse, collections, contextlib, json, math, os, re, secrets, shutil, signal, socket, subprocess, sys
import tempfile, threading, time, urllib.error, urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from minferd._proto import pb2, pb2_grpc  # noqa: E402
from minferd.model.synth import write_model  # noqa: E402
from minferd.spawn import start_daemon, stop_daemon  # noqa: E402
from tests.gguf_edit import rewrite  # noqa: E402  (read-only use of the tests' GGUF rewriter)

PY, TOKEN, STALL = sys.executable, secrets.token_hex(16), 0.5
TYPED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
         "ABORTED", "DEADLINE_EXCEEDED", "CANCELLED", "UNAUTHENTICATED", "OUT_OF_RANGE"}
PROBER = """import grpc,sys,time,os
sys.path.insert(0,sys.argv[3]); from minferd._proto import pb2,pb2_grpc
s=pb2_grpc.MinferdStub(grpc.insecure_channel(sys.argv[1])); md=(("authorization","Bearer "+os.environ["T"]),)
out=open(sys.argv[2],"a",buffering=1)
while True:
    t=time.monotonic()
    try: s.GetStatus(pb2.GetStatusRequest(),metadata=md,timeout=2); c="OK"
    except grpc.RpcError as e: c=e.code().name
    out.write(f"{t} {time.monotonic()-t} {c}\\n"); time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A `minferd serve` from minferd.spawn (socket workdir/d.sock); the token through MINFERD_TOKEN."""

    def __init__(self, workdir: Path, args, token: str | None = TOKEN):
        workdir.mkdir(parents=True)
        saved = os.environ.pop("MINFERD_TOKEN", None)
        if token:
            os.environ["MINFERD_TOKEN"] = token
        try:
            info = start_daemon(workdir, ["--device", "cpu", "--threads", "1", *map(str, args)], timeout=60)
        finally:
            os.environ.pop("MINFERD_TOKEN", None)
            if saved is not None:
                os.environ["MINFERD_TOKEN"] = saved
        self.pid, self.address, self.log = info["pid"], info["address"], Path(info["log"])
        self.md = (("authorization", f"Bearer {token}"),) if token else ()
        self.ch = grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
        self.stub, self.health = pb2_grpc.MinferdStub(self.ch), health_pb2_grpc.HealthStub(self.ch)

    def rpc(self, method: str, timeout=30, md=None, **req):
        call = getattr(self.stub, method)
        out = call(getattr(pb2, method + "Request")(**req), metadata=self.md if md is None else md, timeout=timeout)
        return list(out) if method in ("LoadModel", "Generate", "Chat") else out

    def load(self, name, path, ctx=128, **kw):
        return self.rpc("LoadModel", name=name, path=str(path), ctx=ctx, **kw)[-1].model

    def gen(self, model, text="hi", n=4, timeout=60, **sp):
        return self.rpc("Generate", timeout, model=model, text=text, sampling=pb2.SamplingParams(max_tokens=n, **sp))

    def status(self, timeout=2.0):
        return self.rpc("GetStatus", timeout)

    def names(self):
        return {m.name for m in self.status().models}

    def served(self, name, md=None) -> str:
        return attempt(lambda: self.health.Check(health_pb2.HealthCheckRequest(service=f"model/{name}"),
                                                 metadata=self.md if md is None else md, timeout=3))[0]

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def alive(self) -> bool:
        try:
            return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def unload_all(self, keep=()):
        for n in self.names() - set(keep):
            attempt(lambda: self.rpc("UnloadModel", name=n))


def attempt(fn):
    """(code name, details, seconds) of one call: 'OK' and the result's text when it succeeds."""
    t0 = time.monotonic()
    try:
        r = fn()
        return "OK", str(r)[:200], time.monotonic() - t0
    except grpc.RpcError as e:
        return e.code().name, e.details() or "", time.monotonic() - t0


class Case:
    """What one class saw: codes by count, and every broken expectation."""

    def __init__(self):
        self.bad, self.seen = [], collections.Counter()

    def expect(self, label, res, allowed=TYPED, within=10.0):
        code, det, secs = res
        self.seen[code] += 1
        if code not in allowed:
            self.bad.append(f"{label}: {code} {det[:200]!r}")
        if secs > within:
            self.bad.append(f"{label}: took {secs:.2f} s (> {within})")
        if len(det) > 2000:
            self.bad.append(f"{label}: a message of {len(det)} characters")
        return code

    def check(self, ok, msg):
        if not ok:
            self.bad.append(msg)
        return ok


def ledger_ok(d: Daemon, k: Case, quiet=5.0):
    """At rest: used == allocated == the sum of each weight set's weights+w16 and each model's kv+scratch."""
    end = time.monotonic() + quiet
    while True:
        st = d.status()
        if st.pool.reserved_bytes == 0 and not any(m.busy for m in st.models) or time.monotonic() > end:
            break
        time.sleep(0.1)
    sets = {m.weight_set: m.bytes.weights + m.bytes.w16 for m in st.models}
    total = sum(sets.values()) + sum(m.bytes.kv + m.bytes.scratch for m in st.models)
    k.check(st.pool.used_bytes == st.pool.allocated_bytes == total,
            f"ledger: used {st.pool.used_bytes} allocated {st.pool.allocated_bytes} sum {total} "
            f"reserved {st.pool.reserved_bytes}")
    return st


def slow_status(path: Path, t0: float, t1: float) -> float:
    worst = 0.0
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            start, lat, code = line.split()
            if t0 <= float(start) <= t1:
                worst = max(worst, float(lat) if code == "OK" else 2.0)
    return worst


def hold(fn, n):
    """Run fn(i) in n threads; their results in order."""
    out = [None] * n
    ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i))) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out


def spawn(listen, args=(), env=None, cwd=None, umask=None, log=None):
    """A bare `minferd serve` for the transport and socket rules (spellings spawn.py does not make)."""
    e = {k: v for k, v in os.environ.items() if k != "MINFERD_TOKEN"}
    e.update(env or {}, PYTHONPATH=str(ROOT))
    out = open(log, "w")
    return subprocess.Popen([PY, "-m", "minferd.cli", "serve", "--device", "cpu", "--threads", "1",
                             *(["--listen", listen] if listen else []), *map(str, args)],
                            stdout=out, stderr=subprocess.STDOUT, env=e, cwd=cwd, start_new_session=True,
                            preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def listening(proc, log: Path, timeout=40.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if "listening on" in log.read_text():
            return True
        time.sleep(0.05)
    return False


def kill(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


# ---- the attack classes: docstring "what was tried | what is expected" ------------------------------
INV, OK = {"INVALID_ARGUMENT"}, {"OK"}
SP = pb2.SamplingParams


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
        p = M / f"trunc{i}.gguf"
        shutil.copy(M / "big.gguf", p)

        def cut():
            if how == "cp-over":
                with open(p, "r+b") as f:
                    f.truncate(0)
                    f.write((M / "q.gguf").read_bytes())
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
                os.symlink(O / "evil.gguf", M / ".xl")
                os.replace(M / ".xl", M / "x.gguf")
                os.link(M / "q.gguf", M / ".xf")
                os.replace(M / ".xf", M / "x.gguf")
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
    for what, path in (("symlink out", "out.gguf"), ("..", "../outside/evil.gguf"), ("absolute", O / "evil.gguf"),
                       ("dir symlink", "sub/evil.gguf")):
        k.expect(what, attempt(lambda: d.load("sx", path)), {"PERMISSION_DENIED"})
    d.unload_all(keep=BASE)


def transport_rules(d, k):
    """starts with TLS but no token, blank/short/spaced tokens, --token on argv, plain TCP, --insecure on 0.0.0.0,
    metrics on 0.0.0.0 without token; a TLS+token daemon called without/with wrong/blank/the token | each bad
    start refused in one line (no traceback, no token echoed); UNAUTHENTICATED unless the token; the token in no
    argv or log"""
    cert, key = TMP / "c.pem", TMP / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-subj",
                    "/CN=localhost", "-days", "1"], capture_output=True, check=True)
    (TMP / "spaced").write_text("tok en" + "x" * 20)
    secret = "argv" + secrets.token_hex(12)
    tcp, unix = f"127.0.0.1:{free_port()}", f"unix://{TMP}/refused.sock"
    bad = {"TLS, no token": ([tcp, "--tls-cert", cert, "--tls-key", key], {}), "blank token": ([tcp], {"MINFERD_TOKEN": "   "}),
           "short token": ([tcp], {"MINFERD_TOKEN": "short"}), "--token argv": ([unix, "--token", secret], {}),
           "plain TCP": ([tcp], {}), "--insecure 0.0.0.0": ([f"0.0.0.0:{free_port()}", "--insecure"], {}),
           "metrics 0.0.0.0": ([unix, "--metrics-listen", f"0.0.0.0:{free_port()}"], {}),
           "spaced token file": ([tcp, "--token-file", TMP / "spaced"], {})}
    procs = {w: (spawn(a[0], a[1:], e, log=TMP / f"bad{i}.log"), TMP / f"bad{i}.log") for i, (w, (a, e)) in enumerate(bad.items())}
    for what, (p, log) in procs.items():
        rc, text = p.wait(60), log.read_text()
        k.check(rc != 0 and "minferd: listening on" not in text and "Traceback" not in text and secret not in text,
                f"{what}: exit {rc}: {text.strip()[-160:]!r}")
    tf, tls = TMP / "token", f"127.0.0.1:{free_port()}"
    tf.write_text(TOKEN + "\n")
    p = spawn(tls, ["--tls-cert", cert, "--tls-key", key, "--token-file", tf], log=TMP / "tls.log")
    if k.check(listening(p, TMP / "tls.log"), "TLS+token daemon did not start"):
        s = pb2_grpc.MinferdStub(grpc.secure_channel(tls, grpc.ssl_channel_credentials(cert.read_bytes()),
                                                     options=[("grpc.ssl_target_name_override", "localhost")]))
        for what, md, want in (("no token", (), "UNAUTHENTICATED"), ("wrong", (("authorization", "Bearer " + "0" * 32),),
                               "UNAUTHENTICATED"), ("blank bearer", (("authorization", "Bearer "),), "UNAUTHENTICATED"),
                               ("the token", d.md, "OK")):
            k.expect(f"TLS {what}", attempt(lambda: s.GetStatus(pb2.GetStatusRequest(), metadata=md, timeout=5)), {want})
        plain = pb2_grpc.MinferdStub(grpc.insecure_channel(tls))
        k.expect("plaintext to TLS", attempt(lambda: plain.GetStatus(pb2.GetStatusRequest(), timeout=3)),
                 {"UNAVAILABLE", "DEADLINE_EXCEEDED"})
    kill(p)
    for what, text in (("cmdline", Path(f"/proc/{d.pid}/cmdline").read_bytes().decode()), ("log", d.log.read_text()),
                       ("tls log", (TMP / "tls.log").read_text())):
        k.check(TOKEN not in text, f"the token is in the daemon's {what}")


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
        code, body = http_get(f"http://127.0.0.1:{METRICS}/metrics", hdr)
        k.check(code in (want if isinstance(want, set) else {want}), f"/metrics {what}: HTTP {code}")
        k.check((b'model="q"' in body) == (code == 200), f"/metrics {what}: model names {'missing' if code == 200 else 'leaked'}")


def http_get(url, headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return type(e).__name__, b""


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


def vm(d, field) -> int:  # kB
    return int(next(ln for ln in Path(f"/proc/{d.pid}/status").read_text().splitlines()
                    if ln.startswith(field)).split()[1])


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


def socket_rules(d, k):
    """unix:/abs, unix:relative, unix:///abs under umask 0; a second daemon on a live socket; a regular file, a
    directory, a symlink at the path; a stale socket; a successor started while the old daemon drains (3 s) |
    mode 0600 in every spelling; live/file/dir/link refused and left as they were; stale replaced; the successor
    keeps its socket when the old one exits, and the old one exits 0 within its drain"""
    s = TMP / "s"
    s.mkdir()
    procs = []
    try:
        for what, listen, cwd in (("unix:/abs", f"unix:{s}/one.sock", None), ("unix:rel", "unix:rel.sock", s),
                                  ("unix:///abs", f"unix://{s}/three.sock", None)):
            path = s / (listen.rsplit("/", 1)[-1].removeprefix("unix:"))
            procs.append(spawn(listen, cwd=cwd, umask=0, log=s / f"{path.name}.log"))
            up = listening(procs[-1], s / f"{path.name}.log")
            mode = oct(path.stat().st_mode & 0o777) if path.exists() else None
            if k.check(up and mode == "0o600", f"{what}: listening {up}, mode {mode}"):
                k.expect(f"{what} GetStatus", attempt(lambda: pb2_grpc.MinferdStub(grpc.insecure_channel(
                    f"unix://{path}")).GetStatus(pb2.GetStatusRequest(), timeout=3)), OK)
        (s / "file.sock").write_text("keep me")
        (s / "dir.sock").mkdir()
        os.symlink(s / "file.sock", s / "link.sock")
        tries = {n: spawn(f"unix://{s}/{n}", log=s / f"{n}.try.log") for n in ("one.sock", "file.sock", "dir.sock", "link.sock")}
        for n, p in tries.items():
            rc = p.wait(60)
            k.check(rc != 0 and "minferd: listening on" not in (s / f"{n}.try.log").read_text(), f"a daemon on {n}: exit {rc}")
        k.check((s / "file.sock").read_text() == "keep me" and (s / "dir.sock").is_dir() and (s / "link.sock").is_symlink(),
                "something at a socket path was replaced")
        k.expect("the first still serves", attempt(lambda: pb2_grpc.MinferdStub(grpc.insecure_channel(
            f"unix://{s}/one.sock")).GetStatus(pb2.GetStatusRequest(), timeout=3)), OK)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(s / "stale.sock"))
        stale.close()
        procs.append(spawn(f"unix://{s}/stale.sock", log=s / "stale.log"))
        k.check(listening(procs[-1], s / "stale.log"), "a stale socket was not replaced")
        a = spawn(f"unix://{s}/succ.sock", ["--models-dir", M, "--drain-seconds", "3"], log=s / "a.log")
        if k.check(listening(a, s / "a.log"), "the draining daemon did not start"):
            sa = pb2_grpc.MinferdStub(grpc.insecure_channel(f"unix://{s}/succ.sock"))
            list(sa.LoadModel(pb2.LoadModelRequest(name="q", path="q.gguf", ctx=2048), timeout=30))
            stream = sa.Generate(pb2.GenerateRequest(model="q", text="hi", sampling=SP(max_tokens=1500)), timeout=60)
            next(stream)
            a.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            procs.append(spawn(f"unix://{s}/succ.sock", log=s / "b.log"))
            k.check(listening(procs[-1], s / "b.log"), f"the successor did not start: {(s / 'b.log').read_text()[-200:]!r}")
            t0 = time.monotonic()
            rc = a.wait(30)
            k.check(rc == 0 and time.monotonic() - t0 < 3 + 10, f"the draining daemon: exit {rc} after {time.monotonic() - t0:.1f} s")
            k.expect("the successor serves after the old one exits", attempt(lambda: pb2_grpc.MinferdStub(
                grpc.insecure_channel(f"unix://{s}/succ.sock")).GetStatus(pb2.GetStatusRequest(), timeout=3)), OK)
        procs.append(a)
    finally:
        for p in procs:
            kill(p)


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


def cli_rules(d, k):
    """minferctl load ./q.gguf from the models dir (the daemon's cwd is elsewhere); negative --max-tokens, --ctx,
    --seed; a daemon with --budget 100TiB and --parent-pid of a process then SIGKILLed | the caller's file loads;
    one-line usage errors (exit 2, no traceback); a warning for the clamped budget; the daemon exits with its parent"""
    env = {**os.environ, "MINFERD_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    ctl = {what: subprocess.Popen([PY, "-m", "minferd.ctl", "--address", d.address, *a], cwd=M, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for what, a in (("load ./q.gguf", ("load", "./q.gguf", "--name", "rel", "--ctx", "64", "-q")),
                           ("--max-tokens -1", ("generate", "q", "hi", "--max-tokens", "-1")),
                           ("--ctx -5", ("load", "q.gguf", "--ctx", "-5")), ("--seed -1", ("generate", "q", "hi", "--seed", "-1")))}
    for what, p in ctl.items():
        _, err = p.communicate(timeout=60)
        want = 0 if what.startswith("load ./") else 2
        k.check(p.returncode == want and "Traceback" not in err, f"minferctl {what}: exit {p.returncode}: {err.strip()[-160:]!r}")
    k.check("rel" in d.names(), "minferctl load ./q.gguf did not load the caller's file")
    attempt(lambda: d.rpc("UnloadModel", name="rel"))
    sleeper = subprocess.Popen(["sleep", "120"])
    p = spawn(f"unix://{TMP}/pp.sock", ["--parent-pid", sleeper.pid, "--budget", "100TiB"], log=TMP / "pp.log")
    try:
        up = listening(p, TMP / "pp.log")
        k.check(up and "is more than" in (TMP / "pp.log").read_text(), "no warning for --budget 100TiB on this host")
        sleeper.kill()
        sleeper.wait()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(8)
        k.check(p.poll() is not None, "the daemon outlived its --parent-pid by 8 s")
    finally:
        kill(p)


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


def raw(d, method, data, stream=False):
    call = (d.ch.unary_stream if stream else d.ch.unary_unary)(f"/minferd.v1.Minferd/{method}")
    return lambda: list(call(data, metadata=d.md, timeout=5)) if stream else call(data, metadata=d.md, timeout=5)


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
    w = Daemon(TMP / "watch", ["--models-dir", M, "--budget", "256MiB", "--drain-seconds", "2"], token=None)
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
        ("127.0.0.1", METRICS), timeout=30) for _ in range(25)], 4), [])))
    flood.start()
    for when in ("while they open", "once they are open"):
        time.sleep(1.0)
        t1 = time.monotonic()
        code, _ = http_get(f"http://127.0.0.1:{METRICS}/metrics", {"Authorization": f"Bearer {TOKEN}"})
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
    code, body = http_get(f"http://127.0.0.1:{METRICS}/metrics", {"Authorization": f"Bearer {TOKEN}"})
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
            ("dir path /", lambda: d.load("o", f"{M}/"), {"NOT_FOUND", "INVALID_ARGUMENT"}),
            ("Chat no messages", lambda: d.rpc("Chat", model="q", sampling=SP(max_tokens=2)), INV),
            ("Chat role ''", lambda: d.rpc("Chat", model="q", messages=hi(""), sampling=SP(max_tokens=2)), INV),
            ("Chat role 'system\\n'", lambda: d.rpc("Chat", model="q", messages=hi("system\n"), sampling=SP(max_tokens=2)), INV),
            ("Chat role tool", lambda: d.rpc("Chat", model="q", messages=hi("tool"), sampling=SP(max_tokens=2)), {"OK", "INVALID_ARGUMENT"}),
            ("Generate no prompt", lambda: d.rpc("Generate", model="q", sampling=SP(max_tokens=2)), {"OK", "INVALID_ARGUMENT"}),
            ("Tokenize unknown model", lambda: d.rpc("Tokenize", model="nope", text="x"), {"NOT_FOUND"})):
        k.expect(what, attempt(fn), want)


ISSUE = [reaper_unload_race, truncate_during_load, symlink_swap, transport_rules, health_metrics_leaks, stalls_behind_work,
         weight_sets_and_refusals, chat_templates, amplifying_inputs, socket_rules, health_vs_table, promote_demote,
         same_file_200_names, cli_rules]
BEYOND = [streams_abandoned, streams_pending, never_reading, deadlines_1ms, keep_alive_values, sampling_extremes,
          load_unload_storm, reflection_token, metadata_16k, special_files, hard_link, utf8_edges, bad_token_ids,
          health_watch_storm, metrics_idle_connections, metrics_series_of_unloaded, socket_garbage, odd_fields]
BASE = ("q", "l")  # loaded for the whole sweep, kept forever


# ---- the files, the daemon, the runner -----------------------------------------------------------
def make_files():
    for p in (M, O, O / "dir"):
        p.mkdir(parents=True)
    write_model(M / "q.gguf", "qwen2", "tiny", "q8_0", seed=1)
    write_model(M / "l.gguf", "llama", "tiny", "q4_k", seed=2)
    write_model(O / "evil.gguf", "llama", "tiny", "q8_0", seed=3)
    write_model(M / "hugectx.gguf", "qwen2", "tiny", "q8_0", seed=4, overrides={"ctx": 1 << 22})
    write_model(M / "big.gguf", "qwen2", "tiny", "q8_0", random_blocks_=True,
                overrides=dict(vocab=32768, hidden=1024, layers=8, ffn=4096))
    shutil.copy(M / "big.gguf", M / "big2.gguf")
    shutil.copy(M / "q.gguf", M / "w.gguf")
    for name, (src, _) in TEMPLATES.items():
        rewrite(M / "q.gguf", M / f"t-{name}.gguf", metadata={"tokenizer.chat_template": src})
    os.link(M / "q.gguf", M / "hard.gguf")
    os.symlink(O / "evil.gguf", M / "out.gguf")
    os.symlink(O, M / "sub")
    os.symlink("/dev/zero", M / "zero.gguf")
    os.mkfifo(M / "fifo.gguf")
    (M / "dir.gguf").mkdir()
    with contextlib.suppress(OSError):  # root only
        os.mknod(M / "chr.gguf", 0o600 | 0o020000, os.makedev(1, 5))


def main_daemon():
    d = Daemon(TMP / f"main{secrets.token_hex(2)}", ["--models-dir", M, "--budget", "1GiB", "--metrics-port", METRICS,
                                                    "--drain-seconds", "5"])
    for n in BASE:
        d.load(n, f"{n}.gguf", ctx=2048 if n == "q" else 256, keep_alive_seconds=-1)
    probe = subprocess.Popen([PY, "-c", PROBER, d.address, str(TMP / "probe.txt"), str(ROOT)],
                             env={**os.environ, "T": TOKEN})
    return d, probe


def run(fn, d):
    k, t0, seen_log = Case(), time.monotonic(), d.log.stat().st_size
    tried, expected = (" ".join(x.split()) for x in re.split(r"\s\|\s", fn.__doc__, maxsplit=1))
    try:
        fn(d, k)
    except Exception as e:  # the sweep's own failure is a FAIL too, named
        k.bad.append(f"sweep raised {type(e).__name__}: {str(e)[:200]}")
    if not d.alive():
        k.bad.append(f"the daemon died: {d.log.read_text()[-300:]!r}")
    elif k.expect("GetStatus afterwards", attempt(lambda: d.status(timeout=2)), OK) == "OK":
        d.unload_all(keep=BASE)
        ledger_ok(d, k)
    time.sleep(0.1)
    worst = slow_status(TMP / "probe.txt", t0, time.monotonic())
    k.check(worst <= STALL, f"GetStatus took {worst:.2f} s while this ran (prober)")
    new = d.log.read_bytes()[seen_log:].decode(errors="replace") if d.log.exists() else ""
    for line in new.splitlines():
        if any(m in line for m in ("Traceback", "internal error", "reaper:", "Exception")):
            k.bad.append(f"log: {line.strip()[:200]}")
            break
    got = ", ".join(f"{c} x{n}" for c, n in k.seen.most_common()) or "-"
    got += f"; GetStatus max {worst:.2f} s; {time.monotonic() - t0:.1f} s"
    return {"class": fn.__name__, "listed": fn in ISSUE, "tried": tried, "expected": expected, "got": got,
            "failures": k.bad, "verdict": "FAIL" if k.bad else "PASS"}


def main(argv=None) -> int:
    global TMP, M, O, METRICS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--only", default=None, help="comma-separated class names")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = ap.parse_args(argv)
    TMP = Path(tempfile.mkdtemp(prefix="mhs-", dir="/tmp"))  # short: unix socket paths
    M, O, METRICS = TMP / "models", TMP / "outside", free_port()
    t_start, results = time.monotonic(), []
    head = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    make_files()
    d, probe = main_daemon()
    threads0 = None
    try:
        for fn in BEYOND[:2] + ISSUE + BEYOND[2:]:  # the stream storms first: gRPC's pool is at its size after them
            if args.only and fn.__name__ not in args.only.split(","):
                continue
            results.append(run(fn, d))
            print(f"{results[-1]['verdict']} {fn.__name__}: {results[-1]['got']}", flush=True)
            threads0 = threads0 or d.threads()
            if not d.alive():
                probe.kill()
                d, probe = main_daemon()
        k = Case()
        d.unload_all()
        st = d.status()
        k.check(st.pool.used_bytes == st.pool.allocated_bytes == 0, f"after unloading everything: used "
                f"{st.pool.used_bytes} allocated {st.pool.allocated_bytes}")
        k.check(d.threads() <= max(threads0, 256 + 12), f"threads {threads0} at start, {d.threads()} at the end")
        os.kill(d.pid, signal.SIGTERM)
        t0 = time.monotonic()
        while d.alive() and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        k.check(not d.alive(), "SIGTERM: the daemon still running after 15 s (drain 5 s)")
        results.append({"class": "final", "listed": True, "tried": "unload everything, SIGTERM", "expected":
                        "used == allocated == 0; threads <= gRPC's 256 + 12; exit within the 5 s drain", "got":
                        f"used {st.pool.used_bytes}, threads {threads0} -> {d.threads() if d.alive() else 'exited'}",
                        "failures": k.bad, "verdict": "FAIL" if k.bad else "PASS"})
    finally:
        probe.kill()
        stop_daemon(d.pid, timeout=5)
        if not args.keep:
            shutil.rmtree(TMP, ignore_errors=True)
    print(f"\n{'class':<26} {'verdict':<7} got\n" + "\n".join(
        f"{r['class']:<26} {r['verdict']:<7} {r['got']}" + "".join(f"\n{'':<35}- {b}" for b in r["failures"][:6])
        for r in results))
    for r in results:
        print(f"\n[{r['verdict']}] {r['class']}\n  tried:    {r['tried']}\n  expected: {r['expected']}\n  got:      {r['got']}")
    fails = [r["class"] for r in results if r["verdict"] == "FAIL"]
    print(f"\n{head}: {len(results) - len(fails)} PASS, {len(fails)} FAIL in {time.monotonic() - t_start:.0f} s"
          + (f": {', '.join(fails)}" if fails else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"commit": head, "results": results}, indent=1))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
