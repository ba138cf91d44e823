"""Load test: C concurrent clients over M models for a fixed time, on a loopback unix socket.

    python bench/load.py [--clients 64] [--seconds 20] [--models 3] [--json F] [--address A]

Without --address it writes M synthetic tiny models to a temporary directory, starts a
`minferd serve` on a unix socket there and loads them (pinned, kept forever). With --address it
uses the first M models that daemon already has loaded. Each client is a thread with its own
channel (its own connection): it issues Generate (a random model, a random short prompt,
max_tokens 8, a seed from the client's seeded RNG) and, one call in ten, GetStatus. A prober in
a process of its own (bench/status_probe.py) asks GetStatus every 50 ms all along, so the
daemon's status latency is measured while the models are busy, apart from this process's 64
threads contending for its own GIL (the clients' GetStatus calls, reported too, include that). Every failed call is counted by its status code; the exit status is 1 if there was any.

Reported: throughput (Generate requests/s and generated tokens/s), latency percentiles p50/p90/
p99/max for Generate (time to first event, and total) and for GetStatus (the prober's, those of
its answers that showed a busy model, and the clients'); a table on stdout and, with --json, the same figures as JSON.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

from minferd._proto import pb2, pb2_grpc  # noqa: E402

ARCHS = (("qwen2", "q8_0"), ("llama", "q4_k"), ("gemma3", "q5_0"), ("qwen3", "q4_0"), ("qwen2", "q6_k"))
WORDS = ("the model hello world question answer data code token language time people good new first "
         "state life work day year value string number list function return import class").split()
PERCENTILES = (50, 90, 99)


def write_models(folder: Path, n: int) -> list[Path]:
    from minferd.model.synth import write_model
    paths = []
    for i in range(n):
        arch, quant = ARCHS[i % len(ARCHS)]
        p = folder / f"m{i}-{arch}-{quant}.gguf"
        write_model(p, arch, "tiny", quant, seed=i)
        paths.append(p)
    return paths


def channel(address: str) -> grpc.Channel:
    # Channels with the same target share connections through gRPC's global subchannel pool;
    # a local pool gives each client a connection of its own, as separate processes would have.
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


class Recorder:
    """Latencies and errors from every thread, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ttft: list[float] = []
        self.total: list[float] = []
        self.tokens = 0
        self.per_model: dict[str, list[float]] = collections.defaultdict(list)  # totals by model
        self.status: list[float] = []  # the clients' own GetStatus calls
        self.status_busy: list[float] = []
        self.probe: list[float] = []  # the prober's, from its own process
        self.probe_busy: list[float] = []
        self.errors: collections.Counter = collections.Counter()
        self.error_samples: dict[str, str] = {}

    def generate(self, model: str, ttft: float, total: float, tokens: int) -> None:
        with self.lock:
            self.ttft.append(ttft)
            self.total.append(total)
            self.tokens += tokens
            self.per_model[model].append(total)

    def got_status(self, latency: float, busy: bool) -> None:
        with self.lock:
            self.status.append(latency)
            if busy:
                self.status_busy.append(latency)

    def error(self, what: str, e: grpc.RpcError) -> None:
        code = e.code().name if e.code() else "UNKNOWN"
        with self.lock:
            self.errors[code] += 1
            self.error_samples.setdefault(code, f"{what}: {e.details()}")


def one_generate(stub, rec: Recorder, rng: random.Random, models: list[str], max_tokens: int,
                 timeout: float) -> None:
    model = rng.choice(models)
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
    req = pb2.GenerateRequest(model=model, text=prompt, sampling=pb2.SamplingParams(
        max_tokens=max_tokens, seed=rng.randrange(1 << 32)))
    t0 = time.perf_counter()
    first = None
    try:
        last = None
        for ev in stub.Generate(req, timeout=timeout):
            if first is None:
                first = time.perf_counter() - t0
            last = ev
        total = time.perf_counter() - t0
    except grpc.RpcError as e:
        rec.error("Generate", e)
        return
    if last is None or not last.finish_reason:
        with rec.lock:
            rec.errors["NO_FINAL_EVENT"] += 1
        return
    rec.generate(model, first, total, last.timings.generated_tokens)


def one_status(stub, rec: Recorder, timeout: float) -> None:
    t0 = time.perf_counter()
    try:
        st = stub.GetStatus(pb2.GetStatusRequest(), timeout=timeout)
    except grpc.RpcError as e:
        rec.error("GetStatus", e)
        return
    rec.got_status(time.perf_counter() - t0, any(m.busy for m in st.models))


def prober(address: str, stop: threading.Event, rec: Recorder, args, start: threading.Barrier):
    """GetStatus every probe_every seconds from a process of its own (bench/status_probe.py):
    the daemon's latency, apart from this process's clients contending for its GIL."""
    probe = subprocess.Popen([sys.executable, str(Path(__file__).with_name("status_probe.py")), address,
                              str(args.probe_every), str(args.timeout)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    start.wait()
    stop.wait()
    out, _ = probe.communicate("stop\n", timeout=args.timeout + 30)
    res = json.loads(out.strip().splitlines()[-1])
    with rec.lock:
        rec.probe.extend(res["lat"])
        rec.probe_busy.extend(t for t, b in zip(res["lat"], res["busy"]) if b)
        if res["errors"]:
            rec.errors["PROBE_ERROR"] += len(res["errors"])


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    a = np.asarray(xs) * 1e3
    out = {"n": len(xs), "mean_ms": float(a.mean()), "max_ms": float(a.max())}
    out.update({f"p{p}_ms": float(np.percentile(a, p)) for p in PERCENTILES})
    return out


def run_load(address: str, models: list[str], args) -> dict:
    rec = Recorder()
    stub = pb2_grpc.MinferdStub(channel(address))
    for m in models:  # warm each model once: first-call costs are not what this measures
        one_generate(stub, Recorder(), random.Random(0), [m], args.max_tokens, args.timeout)
    clock = {}

    def go():  # the barrier's action: the clock starts once every thread has its channel
        clock["deadline"] = time.monotonic() + args.seconds
        clock["t0"] = time.perf_counter()

    start = threading.Barrier(args.clients + 2, action=go)
    stop = threading.Event()
    probe = threading.Thread(target=prober, args=(address, stop, rec, args, start), daemon=True)
    clients = [threading.Thread(target=client, args=(i, address, models, clock, rec, args, start), daemon=True)
               for i in range(args.clients)]
    for t in (probe, *clients):
        t.start()
    start.wait()
    for t in clients:
        t.join()
    elapsed = time.perf_counter() - clock["t0"]
    stop.set()
    probe.join()
    st = stub.GetStatus(pb2.GetStatusRequest(), timeout=args.timeout)
    n = len(rec.total)
    return {
        "config": {"clients": args.clients, "seconds": args.seconds, "models": models, "max_tokens": args.max_tokens,
                   "status_fraction": args.status_fraction, "probe_every_s": args.probe_every, "seed": args.seed,
                   "address": address, "device": st.pool.device, "cpu_count": os.cpu_count(),
                   "daemon_threads": None if args.address else args.threads},
        "elapsed_s": elapsed,
        "generate": {"requests": n, "requests_per_s": n / elapsed, "tokens": rec.tokens,
                     "tokens_per_s": rec.tokens / elapsed, "ttft": summary(rec.ttft), "total": summary(rec.total),
                     "per_model": {m: summary(xs) for m, xs in sorted(rec.per_model.items())}},
        "status": {"all": summary(rec.status), "busy": summary(rec.status_busy),
                   "probe": summary(rec.probe), "probe_busy": summary(rec.probe_busy)},
        "errors": dict(rec.errors), "error_count": sum(rec.errors.values()), "error_samples": rec.error_samples,
        "busy_after": [m.name for m in st.models if m.busy],  # nothing may be left running
    }


def client(i: int, address: str, models: list[str], clock: dict, rec: Recorder, args, start: threading.Barrier):
    rng = random.Random(args.seed * 1_000_003 + i)
    ch = channel(address)
    stub = pb2_grpc.MinferdStub(ch)
    try:
        start.wait()
        while time.monotonic() < clock["deadline"]:  # no new call after the deadline; the last one finishes
            if rng.random() < args.status_fraction:
                one_status(stub, rec, args.timeout)
            else:
                one_generate(stub, rec, rng, models, args.max_tokens, args.timeout)
    finally:
        ch.close()


def table(r: dict) -> str:
    c, g = r["config"], r["generate"]
    lines = [
        f"minferd load: {c['clients']} clients x {c['seconds']:g} s over {len(c['models'])} models "
        f"({c['device']}, {c['cpu_count']} cores, unix socket), max_tokens {c['max_tokens']}",
        f"generate  {g['requests']} requests ({g['requests_per_s']:.1f}/s), {g['tokens']} tokens "
        f"({g['tokens_per_s']:.1f}/s) in {r['elapsed_s']:.1f} s ({c['seconds']:g} s of new calls, then the "
        f"last ones finish)",
        f"errors    {r['error_count']}" + (f"  {r['errors']}" if r["errors"] else ""),
        "",
        f"{'latency (ms)':<22}{'n':>7}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}",
    ]
    st = r["status"]
    for label, s in (("generate first event", g["ttft"]), ("generate total", g["total"]),
                     ("status, prober", st["probe"]), ("status, prober, busy", st["probe_busy"]),
                     ("status, from clients", st["all"])):
        if s["n"]:
            lines.append(f"{label:<22}{s['n']:>7}" + "".join(f"{s[k]:>9.1f}" for k in
                                                             ("p50_ms", "p90_ms", "p99_ms", "max_ms")))
        else:
            lines.append(f"{label:<22}{0:>7}")
    for m, s in g["per_model"].items():
        lines.append(f"{'  total, ' + m:<22}{s['n']:>7}" + "".join(f"{s[k]:>9.1f}" for k in
                                                                 ("p50_ms", "p90_ms", "p99_ms", "max_ms")))
    for code, msg in r["error_samples"].items():
        lines.append(f"first {code}: {msg}")
    return "\n".join(lines)


def start_local(args, folder: Path) -> tuple[dict, list[str]]:
    from minferd.spawn import start_daemon
    paths = write_models(folder, args.models)
    d = start_daemon(folder, ["--models-dir", str(folder), "--budget", args.budget, "--threads", str(args.threads),
                              "--device", "cpu"])
    stub = pb2_grpc.MinferdStub(channel(d["address"]))
    names = []
    for i, p in enumerate(paths):
        name = f"m{i}"
        list(stub.LoadModel(pb2.LoadModelRequest(name=name, path=p.name, ctx=args.ctx, pinned=True,
                                                 keep_alive_seconds=-1.0), timeout=120))
        names.append(name)
    return d, names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--address", default=None, help="use this daemon and the models it has loaded")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--status-fraction", type=float, default=0.1, help="share of client calls that are GetStatus")
    ap.add_argument("--probe-every", type=float, default=0.05, help="seconds between the prober's GetStatus")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120.0, help="deadline of each call, seconds")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per model of the daemon this starts")
    ap.add_argument("--budget", default="1GiB", help="pool budget of the daemon this starts")
    ap.add_argument("--ctx", type=int, default=256, help="context the models are loaded with")
    args = ap.parse_args(argv)

    daemon = None
    tmp = tempfile.TemporaryDirectory(prefix="minferd-load-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        if args.address:
            st = pb2_grpc.MinferdStub(channel(args.address)).GetStatus(pb2.GetStatusRequest(), timeout=30)
            names = [m.name for m in st.models][:args.models]
            if not names:
                print(f"load: {args.address} has no model loaded", file=sys.stderr)
                return 2
            address = args.address
        else:
            daemon, names = start_local(args, Path(tmp.name))
            address = daemon["address"]
        result = run_load(address, names, args)
    finally:
        if daemon is not None:
            from minferd.spawn import stop_daemon
            stop_daemon(daemon["pid"])
        tmp.cleanup()
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if result["error_count"] or result["busy_after"] else 0


if __name__ == "__main__":
    sys.exit(main())
