"""Where a time to first token goes outside the engine: MODEL served by a real daemon (over a unix
socket) whose modules are stamped (bench/ttft_split_site), REPS one-token generations of a prompt
of TOKENS ids, and the median time of each stamp from the client's call, the client's receipt last.

    python bench/ttft_split.py MODEL [--device cuda] [--tokens 16] [--reps 150] [--lines] [--session | --socket]
        [--null-forward] [--bare] [--profile FILE]

--session sends the requests in turn on one Session stream instead of a Generate call each, --socket
on the daemon's session socket. --null-forward (a CPU daemon) leaves the model's arithmetic out (the
site's doc says how): the daemon's own time around a step, which a GPU host's TTFT pays too. --bare
makes no stamps and prints the client's times alone; --profile FILE (with --socket) writes cProfile's
stats of the daemon's handling of each request.

--lines also times every line the engine thread runs in the backend's and the engine's files
(sitecustomize.LINE_FILES): a request's total per line, largest first. Tracing slows each line
several-fold, so read those as where the waits are, not as what they cost untraced.
Session 23 on the H200 (bench/results/s23/call3-stamps.log): the 0.5B's 16-token request, 2.77 ms:
the handler at 0.39 ms, queued at 0.52, the graph launched by ~0.75, the token sampled at 2.31,
the handler has it at 2.45, the client at 2.77.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, not installed
sys.path.insert(0, str(ROOT / "bench"))

import serve  # noqa: E402  (bench/serve.py: its channel and model name)
from minferd._proto import pb2, pb2_grpc  # noqa: E402
from minferd.client_session import Session  # noqa: E402
from minferd.client_socket import SocketSession  # noqa: E402
from minferd.unix_socket import session_path, unix_path  # noqa: E402
from minferd.spawn import start_daemon, stop_daemon  # noqa: E402

WARM_REPS = 50  # requests before the timed ones (graphs captured, caches warm)


def run(model: Path, device: str, tokens: int, reps: int, lines: bool, stamps: Path | None,
        on_session: str = "", null_forward: bool = False) -> list[tuple[int, int]]:
    """(call, receipt) perf_counter_ns of each timed request; the daemon's stamps in `stamps`
    (None: none made)."""
    # start_daemon hands this process's environment to the daemon (a one-shot script: no restore)
    os.environ.update({"MINFERD_STAMPS": str(stamps or ""), "MINFERD_STAMP_LINES": "1" if lines else "",
                       "MINFERD_NULL_FORWARD": "1" if null_forward else "",
                       "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "bench" / "ttft_split_site"),
                                                                 os.environ.get("PYTHONPATH")) if p)})
    tmp = tempfile.TemporaryDirectory(prefix="minferd-split-", dir="/tmp")
    d = start_daemon(Path(tmp.name), ["--models-dir", str(model.parent), "--device", device])
    calls = []
    try:
        stub = pb2_grpc.MinferdStub(serve.channel(d["address"]))
        list(stub.LoadModel(pb2.LoadModelRequest(name=serve.MODEL_NAME, path=model.name, ctx=64, pinned=True,
                                                 keep_alive_seconds=-1.0), timeout=600))
        req = pb2.GenerateRequest(model=serve.MODEL_NAME, ids=pb2.TokenIds(ids=list(range(300, 300 + tokens))),
                                  sampling=pb2.SamplingParams(temperature=0.0, max_tokens=1))
        session = None
        if on_session == "session":
            session = Session(stub, pb2, ())
        elif on_session == "socket":
            session = SocketSession(session_path(unix_path(d["address"])), pb2, None)
        for i in range(WARM_REPS + reps):
            got = []
            t = time.perf_counter_ns()
            if session:
                session.run("generate", req, lambda e: got.append(time.perf_counter_ns()))
            else:
                for _ in stub.Generate(req, timeout=60):
                    got.append(time.perf_counter_ns())
            if i >= WARM_REPS:
                calls.append((t, got[0]))
        if session:
            session.close()
    finally:
        stop_daemon(d["pid"])  # its stamps are written as it exits
        tmp.cleanup()
    return calls


def split(calls, stamps: Path) -> tuple[dict, dict]:
    """Per stamp, its times from the call (us); per traced line, the time to the next stamp (us)."""
    rows = [line.rstrip("\n").rsplit("\t", 1) for line in stamps.read_text().splitlines()]
    rows = sorted((int(t), name) for name, t in rows)
    at, lines = collections.defaultdict(list), collections.defaultdict(list)
    i = 0
    for t, got in calls:
        while i < len(rows) and rows[i][0] < t:
            i += 1
        j = i
        while j < len(rows) and rows[j][0] <= got:
            x, name = rows[j]
            if name.startswith("line "):
                if j + 1 < len(rows):
                    lines[name].append((rows[j + 1][0] - x) / 1e3)
            else:
                at[name].append((x - t) / 1e3)
            j += 1
        at["client has it"].append((got - t) / 1e3)
    return at, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=150)
    ap.add_argument("--lines", action="store_true")
    ap.add_argument("--null-forward", action="store_true",
                    help="the model's passes return a fixed row of logits at once, on the request's thread "
                         "(a device engine's way): the daemon's own time, on a machine without the GPU")
    ap.add_argument("--bare", action="store_true", help="no stamps: only the client's times (stamps cost ~1 us each)")
    ap.add_argument("--profile", type=Path, help="with --socket: cProfile's stats of the daemon's request handling "
                    "to this file (read with python -m pstats)")
    ap.add_argument("--session", action="store_const", const="session", dest="way", default="",
                    help="the requests on one gRPC Session stream")
    ap.add_argument("--socket", action="store_const", const="socket", dest="way",
                    help="the requests on the daemon's session socket (minferd.Client's way)")
    args = ap.parse_args()
    if args.profile:
        if args.way != "socket":
            ap.error("--profile times the session socket's handling: add --socket")
        os.environ["MINFERD_PROFILE"] = str(args.profile.resolve())
    with tempfile.TemporaryDirectory(prefix="minferd-stamps-") as d:
        stamps = None if args.bare else Path(d) / "stamps.tsv"
        calls = run(args.model.resolve(), args.device, args.tokens, args.reps, args.lines, stamps, args.way,
                    args.null_forward)
        if stamps is None:
            us = sorted((got - t) / 1e3 for t, got in calls)
            print(f"{args.model.name}: {args.tokens}-token prompt, 1 token, {len(us)} requests "
                  f"({args.way or 'call'}{', null forward' if args.null_forward else ''}): client's time to the first "
                  f"token, us: p10 {us[len(us) // 10]:.1f}  median {statistics.median(us):.1f}  p90 {us[len(us) * 9 // 10]:.1f}")
            return 0
        at, lines = split(calls, stamps)
    print(f"{args.model.name} on {args.device}: {args.tokens}-token prompt, 1 token, {len(calls)} requests "
          f"({ {'session': 'on one Session', 'socket': 'on the session socket'}.get(args.way, 'a Generate call each')}); "
          f"median us from the client's call (n: stamps seen in the window)")
    for name, v in sorted(at.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {name:22s} {statistics.median(v):9.1f}  (n={len(v)})")
    if lines:
        print("traced lines, time to the next stamp: us a request (mean), median a pass, passes a request")
        for name, v in sorted(lines.items(), key=lambda kv: -sum(kv[1]))[:40]:
            print(f"  {sum(v) / len(calls):8.1f} {statistics.median(v):7.1f} x{len(v) / len(calls):4.1f}  {name[5:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
