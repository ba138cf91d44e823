"""The transport's share of a time to first token: a bare Python gRPC server's unary and one-message
server-streaming round trips (the floor any Python client of a Python daemon pays), beside a real
daemon's streaming Generate of one token of MODEL (its own prefill_ms shown apart), all over unix
sockets in this machine.

    python bench/rpc_floor.py MODEL [--device cpu] [--reps 300]

Session 16 (2 CPU cores, tiny qwen2 on the CPU backend): bare unary 0.41 ms, bare stream's first
message 0.78-0.93 ms (grpc.aio's server the same), Generate's first event 2.6-3.1 ms of which the
engine 1.6-1.9 ms: the rest is that floor and ~0.2 ms of the daemon's hand-offs. The bare figures
come for grpc's default channel ("threaded") and minferd's (client.channel_options: a stream read
on the calling thread), which the daemon's figure uses.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

import serve  # noqa: E402  (bench/serve.py: its channel)
from minferd._proto import pb2, pb2_grpc  # noqa: E402


def median_ms(f, reps: int) -> float:
    for _ in range(max(10, reps // 10)):
        f()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def bare(reps: int) -> dict:
    def stream(req, ctx):
        yield b"x"

    handler = grpc.method_handlers_generic_handler("floor.Floor", {
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Unary": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"x")})
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handler])
    with tempfile.TemporaryDirectory(prefix="minferd-floor-", dir="/tmp") as tmp:
        address = f"unix:{tmp}/floor.sock"
        server.add_insecure_port(address)
        server.start()
        got = {}
        try:
            # grpc's default channel (a stream's messages through its spin thread) and minferd's
            for kind, ch in (("threaded", grpc.insecure_channel(address)), ("client", serve.channel(address))):
                unary, stream_call = ch.unary_unary("/floor.Floor/Unary"), ch.unary_stream("/floor.Floor/Stream")
                got[kind] = {"unary_ms": median_ms(lambda: unary(b"r"), reps),
                             "stream_first_ms": median_ms(lambda: next(iter(stream_call(b"r"))), reps)}
                ch.close()
            return got
        finally:
            server.stop(None)


def daemon(model: Path, device: str, reps: int) -> dict:
    from minferd.spawn import start_daemon, stop_daemon
    tmp = tempfile.TemporaryDirectory(prefix="minferd-floor-", dir="/tmp")
    d = start_daemon(Path(tmp.name), ["--models-dir", str(model.parent), "--device", device])
    try:
        got = {}
        for kind, ch in (("threaded", grpc.insecure_channel(d["address"])), ("client", serve.channel(d["address"]))):
            stub = pb2_grpc.MinferdStub(ch)
            if not got:
                list(stub.LoadModel(pb2.LoadModelRequest(name=serve.MODEL_NAME, path=model.name, ctx=64, pinned=True,
                                                         keep_alive_seconds=-1.0), timeout=600))
            req = pb2.GenerateRequest(model=serve.MODEL_NAME, ids=pb2.TokenIds(ids=[300]),
                                      sampling=pb2.SamplingParams(temperature=0.0, max_tokens=1))
            engine, ttft = [], []

            def first():
                t = time.perf_counter()
                it = stub.Generate(req, timeout=60)
                next(it)
                ttft.append((time.perf_counter() - t) * 1e3)
                for ev in it:
                    if ev.HasField("timings"):
                        engine.append(ev.timings.prefill_ms)

            ms = median_ms(first, reps)
            got[kind] = {"generate_ms": ms, "first_event_ms": statistics.median(ttft[-reps:]),
                         "engine_prefill_ms": statistics.median(engine)}
            ch.close()
        return got
    finally:
        stop_daemon(d["pid"])
        tmp.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    for kind, floor in bare(args.reps).items():
        print(f"bare gRPC, {kind} channel: unary {floor['unary_ms']:.3f} ms, one-message stream "
              f"{floor['stream_first_ms']:.3f} ms")
    for kind, got in daemon(args.model.resolve(), args.device, args.reps).items():
        print(f"minferd Generate, 1 token, {kind} channel: first event {got['first_event_ms']:.3f} ms (engine "
              f"{got['engine_prefill_ms']:.3f} ms, the rest {got['first_event_ms'] - got['engine_prefill_ms']:.3f} ms), "
              f"whole stream {got['generate_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
