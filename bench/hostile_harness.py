"""The hostile sweep's harness (bench/hostile_sweep.py): a daemon under attack, one call's outcome, a
class's expectations, and the run's paths (W: set by the runner before any class runs)."""
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




class _Where:
    """The run's temp dir, models dir, outside dir and metrics port (hostile_sweep.main sets them)."""
    TMP = M = O = METRICS = None


W = _Where()
BASE = ("q", "l")  # loaded for the whole sweep, kept forever

INV, OK = {"INVALID_ARGUMENT"}, {"OK"}
SP = pb2.SamplingParams


def http_get(url, headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return type(e).__name__, b""

def vm(d, field) -> int:  # kB
    return int(next(ln for ln in Path(f"/proc/{d.pid}/status").read_text().splitlines()
                    if ln.startswith(field)).split()[1])

def raw(d, method, data, stream=False):
    call = (d.ch.unary_stream if stream else d.ch.unary_unary)(f"/minferd.v1.Minferd/{method}")
    return lambda: list(call(data, metadata=d.md, timeout=5)) if stream else call(data, metadata=d.md, timeout=5)
