"""The chaos test's driver (tests/e2e/test_chaos.py): 16 clients doing random load / unload /
generate / chat / demote / promote / pin / unpin / keep-alive / status against one real daemon,
quiet points where the pool's books must balance, and a GetStatus latency probe of its own."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from minferd._proto import pb2, pb2_grpc
from tests.e2e.daemon import Daemon

C = grpc.StatusCode
SEED = int(os.environ.get("MINFERD_CHAOS_SEED", "13"))
WORKERS = 16
QUIET_EVERY = 5.0
STATUS_EVERY = 0.02
NAMES = tuple(f"m{i}" for i in range(5))
FILES = ("qwen2.gguf", "llama.gguf", "gemma3.gguf")
# Typed refusals a client can act on. ABORTED: the model was unloaded before or while the request
# ran (the daemon's answer to a request racing an unload). Never INTERNAL, UNKNOWN or UNAVAILABLE.
ALLOWED = {C.INVALID_ARGUMENT, C.NOT_FOUND, C.FAILED_PRECONDITION, C.RESOURCE_EXHAUSTED, C.CANCELLED,
           C.DEADLINE_EXCEEDED, C.ABORTED}
OP_TIMEOUT = 30.0  # an ordinary call's deadline: running past it is a stall, not a client's choice
PATHS = (pb2.MATMUL_PATH_AUTO,) * 7 + (pb2.W16, pb2.MMQ, pb2.FUSED_B)
OPS = {"load": 25, "unload": 8, "generate": 20, "chat": 8, "demote": 7, "promote": 7, "pin": 4, "unpin": 4,
       "keep_alive": 7, "status": 5, "list": 3}


ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench" / "status_probe.py"


class Chaos:
    def __init__(self, daemon: Daemon, seconds: float):
        self.d, self.seconds = daemon, seconds
        self.s = pb2_grpc.MinferdStub(daemon.channel())
        self.outcomes: Counter = Counter()  # (op, outcome)
        self.samples: dict = {}  # (op, outcome) -> the first message seen
        self.violations: list[str] = []
        self.status_lat: list[float] = []
        self.quiet_points = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.pause = threading.Event()
        self.barrier = threading.Barrier(WORKERS + 1)

    def violation(self, msg: str) -> None:
        with self.lock:
            self.violations.append(msg)

    def record(self, op: str, code: grpc.StatusCode, details: str = "", deadline: float = OP_TIMEOUT) -> None:
        with self.lock:
            self.outcomes[(op, code.name)] += 1
            if details:
                self.samples.setdefault((op, code.name), details[:160])
        if code == C.OK:
            return
        if code not in ALLOWED:
            self.violation(f"{op}: {code.name}: {details[:300]}")
        elif code == C.DEADLINE_EXCEEDED and deadline >= OP_TIMEOUT:
            self.violation(f"{op}: ran past its {deadline:.0f} s deadline (a stall)")

    # ---- one random operation -------------------------------------------------------------
    def op(self, rng: random.Random) -> None:
        kind = rng.choices(list(OPS), weights=list(OPS.values()))[0]
        name = rng.choice(NAMES)
        s = self.s
        deadline = OP_TIMEOUT
        try:
            if kind == "load":
                req = pb2.LoadModelRequest(name=name, path=rng.choice(FILES), ctx=rng.choice((128, 256)),
                                           matmul_path=rng.choice(PATHS), pinned=rng.random() < 0.1)
                if rng.random() < 0.8:
                    req.keep_alive_seconds = rng.uniform(0.0, 2.0)
                r = rng.random()
                if r < 0.1:
                    deadline = rng.uniform(0.002, 0.02)
                call = s.LoadModel(req, timeout=deadline)
                if r > 0.85:  # the client goes away after the first progress message
                    next(call)
                    call.cancel()
                    raise_cancelled()
                for _ in call:
                    pass
            elif kind in ("generate", "chat"):
                sp = pb2.SamplingParams(max_tokens=rng.randint(1, 12), temperature=rng.choice((0.0, 0.8)),
                                        seed=rng.randrange(1 << 30))
                if kind == "generate":
                    ids = [rng.randrange(3, 1000) for _ in range(rng.randint(1, 8))]
                    req = pb2.GenerateRequest(model=name, ids=pb2.TokenIds(ids=ids), sampling=sp)
                    method = s.Generate
                else:
                    msgs = [pb2.ChatMessage(role="user", content=rng.choice(("hi", "what is a pool?", "2+2")))]
                    req = pb2.ChatRequest(model=name, messages=msgs, sampling=sp)
                    method = s.Chat
                r = rng.random()
                if r < 0.1:
                    deadline = rng.uniform(0.002, 0.02)
                call = method(req, timeout=deadline)
                if r > 0.85:  # cancelled after its first token
                    next(call)
                    call.cancel()
                    raise_cancelled()
                for _ in call:
                    pass
            elif kind == "unload":
                s.UnloadModel(pb2.UnloadModelRequest(name=name), timeout=deadline)
            elif kind == "demote":
                s.Demote(pb2.DemoteRequest(name=name), timeout=deadline)
            elif kind == "promote":
                s.Promote(pb2.PromoteRequest(name=name), timeout=deadline)
            elif kind in ("pin", "unpin"):
                s.SetModelOptions(pb2.SetModelOptionsRequest(name=name, pinned=kind == "pin"), timeout=deadline)
            elif kind == "keep_alive":
                s.SetModelOptions(pb2.SetModelOptionsRequest(name=name, keep_alive_seconds=rng.uniform(0, 2)),
                                  timeout=deadline)
            elif kind == "status":
                s.GetStatus(pb2.GetStatusRequest(), timeout=deadline)
            else:
                s.ListModels(pb2.ListModelsRequest(), timeout=deadline)
            self.record(kind, C.OK)
        except _Cancelled:
            self.record(kind, C.CANCELLED)
        except StopIteration:  # the stream ended before its first message
            self.record(kind, C.OK)
        except grpc.RpcError as e:
            self.record(kind, e.code(), e.details() or "", deadline)

    # ---- the threads ------------------------------------------------------------------------
    def worker(self, i: int) -> None:
        rng = random.Random(SEED * 1000 + i)
        try:
            while not self.stop.is_set():
                if self.pause.is_set():
                    self.barrier.wait(timeout=120)  # paused
                    self.barrier.wait(timeout=120)  # resumed
                    continue
                self.op(rng)
        except threading.BrokenBarrierError:
            pass
        except Exception as e:  # noqa: BLE001 - a bug in this test, or something no status code says
            self.violation(f"worker {i}: {type(e).__name__}: {e}")
            self.barrier.abort()

    def timer(self) -> None:
        """Time GetStatus from a process of its own, so the latency is the daemon's and not this
        process's 16 client threads contending for its GIL."""
        p = subprocess.Popen([sys.executable, str(PROBE), self.d.address, str(STATUS_EVERY), str(OP_TIMEOUT)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
        self.stop.wait()
        out, _ = p.communicate("stop\n", timeout=OP_TIMEOUT + 30)
        res = json.loads(out.strip().splitlines()[-1])
        with self.lock:
            self.status_lat.extend(res["lat"])
        for e in res["errors"][:20]:
            self.violation(f"timed GetStatus: {e}")

    def settle(self, within: float = 20.0) -> pb2.Status | None:
        """Poll GetStatus until no model is busy and nothing is reserved, twice 0.1 s apart."""
        end, calm = time.monotonic() + within, 0
        st = None
        while time.monotonic() < end:
            st = self.s.GetStatus(pb2.GetStatusRequest(), timeout=OP_TIMEOUT)
            # An unload the keep-alive reaper (or a keep-alive 0 request's end) began holds its
            # bytes under no listed model until its engine's step ends: wait for it too.
            calm = calm + 1 if (not any(m.busy for m in st.models) and st.pool.reserved_bytes == 0
                                and not st.pool.loading and not st.pool.unloading) else 0
            if calm >= 2:
                return st
            time.sleep(0.1)
        self.violation(f"no quiet after {within:.0f} s: reserved {st.pool.reserved_bytes}, "
                       f"busy {[m.name for m in st.models if m.busy]}, loading {list(st.pool.loading)}, "
                       f"unloading {list(st.pool.unloading)}")
        return None

    def check_books(self, st: pb2.Status, where: str) -> None:
        sets = {}
        for m in st.models:
            sets[m.weight_set] = m.bytes.weights + m.bytes.w16
        per_model = sum(sets.values()) + sum(m.bytes.kv + m.bytes.scratch for m in st.models)
        p = st.pool
        if not (p.used_bytes == p.allocated_bytes == per_model) or p.reserved_bytes:
            self.violation(f"{where}: used {p.used_bytes}, allocated {p.allocated_bytes}, per-model sum "
                           f"(one count per weight_set) {per_model}, reserved {p.reserved_bytes}; "
                           f"models {[(m.name, m.weight_set, m.matmul_path) for m in st.models]}")
        if p.used_bytes > p.capacity_bytes:
            self.violation(f"{where}: used {p.used_bytes} > capacity {p.capacity_bytes}")

    def quiet_point(self) -> None:
        self.pause.set()
        self.barrier.wait(timeout=120)  # every worker is between operations
        self.pause.clear()
        try:
            st = self.settle()
            if st is not None:
                self.check_books(st, f"quiet point {self.quiet_points + 1}")
            self.quiet_points += 1
        finally:
            self.barrier.wait(timeout=120)  # resume

    def dead(self) -> bool:
        return self.d.proc.poll() is not None

    def run(self) -> None:
        threads = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(WORKERS)]
        timer = threading.Thread(target=self.timer, daemon=True)
        for t in threads + [timer]:
            t.start()
        end = time.monotonic() + self.seconds
        next_quiet = time.monotonic() + QUIET_EVERY
        try:
            while time.monotonic() < end and not self.dead():
                if len(self.violations) > 200:
                    break
                if time.monotonic() >= next_quiet:
                    self.quiet_point()
                    next_quiet = time.monotonic() + QUIET_EVERY
                time.sleep(0.05)
        except (threading.BrokenBarrierError, grpc.RpcError) as e:
            self.violation(f"quiet point: {type(e).__name__}: {e}")
        finally:
            self.stop.set()
            self.barrier.abort()
            for t in threads + [timer]:
                t.join(timeout=OP_TIMEOUT + 10)

    def summary(self) -> str:
        lines = [f"chaos: {self.seconds:.0f} s, {WORKERS} clients, seed {SEED}, {self.quiet_points} quiet points"]
        by_op: dict[str, Counter] = {}
        for (op, outcome), n in self.outcomes.items():
            by_op.setdefault(op, Counter())[outcome] = n
        for op in sorted(by_op):
            c = by_op[op]
            lines.append(f"  {op:11s} {sum(c.values()):6d}  " + ", ".join(f"{k} {v}" for k, v in c.most_common()))
        lines.append("  a message of each refusal:")
        for (op, outcome), msg in sorted(self.samples.items()):
            lines.append(f"    {op} {outcome}: {msg}")
        lat = sorted(self.status_lat)
        if lat:
            pick = lambda q: lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))] * 1e3
            lines.append(f"  GetStatus x{len(lat)}: p50 {pick(0.5):.1f} ms, p99 {pick(0.99):.1f} ms, "
                         f"max {lat[-1] * 1e3:.1f} ms")
        return "\n".join(lines)


class _Cancelled(Exception):
    pass


def raise_cancelled():
    raise _Cancelled()
