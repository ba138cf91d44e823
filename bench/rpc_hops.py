"""What each thread hand-off on a request's path costs on this machine, and whether grpc.aio's
server would spare any: a bare one-message stream (unix socket, minferd's client channel) through
grpc's thread-pool server and through grpc.aio's, its message made in the handler ("inline") or by
a worker thread the handler hands the request to and waits on ("engine": minferd's path, where the
model's thread makes the token; "engine_tail": that thread then runs --tail-us of Python, as the
engine's bookkeeping after a first token holds the GIL the handler needs), beside a bare wake of a
sleeping thread by a queue. Each also on an open bidi stream carrying one request after another
(minferd's Session), which skips gRPC's call setup, and on minferd's session socket (no gRPC at
all: minferd/session_socket.py's server and minferd/client_socket.py's client).

    python bench/rpc_hops.py [--reps 2000] [--json OUT]

Why: on the lent H200 VM a thread asleep on an idle core took ~0.1 ms to run (bench/NOTES.md, s23),
where this 2-core CI machine takes ~0.01; the sync server's path wakes a pool thread for the call
and again for its request message, then the engine and the handler. The aio server runs handlers
on its event loop: if its "engine" figure sits well under the sync one on the GPU machine, moving
Generate and Chat to async handlers is worth its size; if not, the transport is the floor.
Session 28 (this machine, 2 cores): see bench/NOTES.md.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import queue
import statistics
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

import serve  # noqa: E402  (bench/serve.py: minferd's client channel)
from minferd._proto import pb2  # noqa: E402
from minferd.client_socket import SocketSession  # noqa: E402
from minferd.session_socket import SessionSocket  # noqa: E402

METHOD = "/hops.Hops/Stream"
SESSION = "/hops.Hops/Session"


class Engine:
    """A thread that answers each request on the queue it came with: the model's thread's place.
    tail_us: Python it runs after the answer before it sleeps again, holding the GIL the handler
    needs (the engine's bookkeeping after a first token: ending the sequence, the step's end)."""

    def __init__(self, tail_us: float = 0.0):
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.tail = tail_us / 1e6
        threading.Thread(target=self._run, daemon=True, name="hops-engine").start()

    def _run(self):
        while True:
            reply = self.inbox.get()
            reply(b"x")
            end = time.perf_counter() + self.tail
            while time.perf_counter() < end:
                pass


def sync_server(address: str, engine: Engine | None) -> grpc.Server:
    def stream(req, ctx):
        if engine is None:
            yield b"x"
            return
        box: queue.SimpleQueue = queue.SimpleQueue()
        engine.inbox.put(box.put)
        yield box.get()

    def session(requests, ctx):
        for req in requests:
            yield from stream(req, ctx)

    handler = grpc.method_handlers_generic_handler("hops.Hops", {
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Session": grpc.stream_stream_rpc_method_handler(session)})
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handler])
    server.add_insecure_port(address)
    server.start()
    return server


class AioServer:
    """grpc.aio's server on an event loop of its own thread."""

    def __init__(self, address: str, engine: Engine | None):
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.address, self.engine = address, engine
        self.thread = threading.Thread(target=self._run, daemon=True, name="hops-aio")
        self.thread.start()
        self.started.wait(30)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.started.set()
        self.loop.run_forever()

    async def _start(self):
        engine, loop = self.engine, self.loop

        async def stream(req, ctx):
            if engine is None:
                yield b"x"
                return
            fut = loop.create_future()
            engine.inbox.put(lambda msg: loop.call_soon_threadsafe(fut.set_result, msg))
            yield await fut

        async def session(requests, ctx):
            async for req in requests:
                async for msg in stream(req, ctx):
                    yield msg

        handler = grpc.method_handlers_generic_handler("hops.Hops", {
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Session": grpc.stream_stream_rpc_method_handler(session)})
        self.server = grpc.aio.server(handlers=[handler])
        self.server.add_insecure_port(self.address)
        await self.server.start()

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.server.stop(None), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


class HopsServicer:
    """What minferd's session socket asks of the servicer (minferd/session_socket.py), answering
    as the gRPC handlers above do: the closing event made inline or by the engine thread."""

    def __init__(self, engine: Engine | None):
        self.engine = engine

    def stream_place(self):
        return contextlib.nullcontext()

    def session_events(self, request, gone):
        if self.engine is None:
            yield pb2.GenerateEvent(token_id=-1, finish_reason="length")
            return
        box: queue.SimpleQueue = queue.SimpleQueue()
        self.engine.inbox.put(box.put)
        box.get()
        yield pb2.GenerateEvent(token_id=-1, finish_reason="length")


def socket_ms(path: str, reps: int) -> float:
    """Requests in turn on minferd's session socket (its own server and client code)."""
    s = SocketSession(path, pb2, None)
    req = pb2.GenerateRequest(model="m")
    samples = []
    for i in range(reps + reps // 10):
        time.sleep(0.001)
        t = time.perf_counter()
        s.run("generate", req, lambda e: None)
        if i >= reps // 10:
            samples.append((time.perf_counter() - t) * 1e3)
    s.close()
    return statistics.median(samples)


def first_message_ms(address: str, reps: int, on_session: bool = False) -> float:
    """A call of its own a request, or (on_session) requests in turn on one open bidi stream, as
    minferd's Session: the request's message fed through a queue to grpc's sending thread."""
    ch = serve.channel(address)
    if on_session:
        requests: queue.SimpleQueue = queue.SimpleQueue()
        replies = ch.stream_stream(SESSION)(iter(requests.get, None))
        send = lambda: (requests.put(b"r"), next(replies))  # noqa: E731
    else:
        call = ch.unary_stream(METHOD)
        send = lambda: next(iter(call(b"r", timeout=30)))  # noqa: E731
    samples = []
    for i in range(reps + reps // 10):
        time.sleep(0.001)  # every thread asleep again, as between a client's requests
        t = time.perf_counter()
        send()
        if i >= reps // 10:
            samples.append((time.perf_counter() - t) * 1e3)
    if on_session:
        requests.put(None)
    serve.close(ch)
    return statistics.median(samples)


def thread_wake_ms(reps: int) -> float:
    """A queue put to a thread asleep in get, until that thread runs (one way)."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    woke: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [woke.put(time.perf_counter()) for _ in iter(inbox.get, None)], daemon=True).start()
    samples = []
    for _ in range(reps):
        time.sleep(0.001)
        t = time.perf_counter()
        inbox.put(1)
        samples.append((woke.get() - t) * 1e3)
    inbox.put(None)
    return statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--tail-us", type=float, default=50.0, help="the engine_tail variant's Python after its answer")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    got = {"thread_wake_ms": thread_wake_ms(args.reps)}
    with tempfile.TemporaryDirectory(prefix="minferd-hops-", dir="/tmp") as tmp:
        for kind in ("sync", "aio"):
            for where in ("inline", "engine", "engine_tail"):
                address = f"unix:{tmp}/{kind}-{where}.sock"
                engine = None if where == "inline" else Engine(args.tail_us if where == "engine_tail" else 0.0)
                server = sync_server(address, engine) if kind == "sync" else AioServer(address, engine)
                try:
                    got[f"{kind}_{where}_ms"] = first_message_ms(address, args.reps)
                    got[f"{kind}_{where}_session_ms"] = first_message_ms(address, args.reps, on_session=True)
                finally:
                    server.stop(None) if kind == "sync" else server.stop()
        for where in ("inline", "engine", "engine_tail"):
            engine = None if where == "inline" else Engine(args.tail_us if where == "engine_tail" else 0.0)
            server = SessionSocket(HopsServicer(engine), f"{tmp}/socket-{where}.sock", None, 1 << 20, 60.0)
            try:
                got[f"socket_{where}_ms"] = socket_ms(server.bound.path, args.reps)
            finally:
                server.drain()
    print(f"thread wake (queue put -> the sleeping thread runs): {got['thread_wake_ms']:.3f} ms")
    for kind in ("sync", "aio"):
        print(f"{kind:>4} server, one-message stream: inline {got[f'{kind}_inline_ms']:.3f} ms, "
              f"made by an engine thread {got[f'{kind}_engine_ms']:.3f} ms, "
              f"with {args.tail_us:.0f} us of its Python after it {got[f'{kind}_engine_tail_ms']:.3f} ms")
        print(f"{kind:>4} server, the same on an open session stream: inline {got[f'{kind}_inline_session_ms']:.3f} ms, "
              f"made by an engine thread {got[f'{kind}_engine_session_ms']:.3f} ms, "
              f"with its Python after it {got[f'{kind}_engine_tail_session_ms']:.3f} ms")
    print(f"session socket: inline {got['socket_inline_ms']:.3f} ms, made by an engine thread "
          f"{got['socket_engine_ms']:.3f} ms, with its Python after it {got['socket_engine_tail_ms']:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
