"""The Session stream's attack class (bench/hostile_sweep.py runs it): docstring "what was tried | what is
expected"."""
from hostile_harness import *  # noqa: F401,F403

import collections  # noqa: E402
import queue  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402


class _Open:
    """A raw Session call: requests fed through a queue, events read when the attack wants them."""

    def __init__(self, d, channel=None):
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        stub = pb2_grpc.MinferdStub(channel) if channel else d.stub
        self.call = stub.Session(iter(self.requests.get, None), metadata=d.md, timeout=120)

    def send(self, n=1):
        self.requests.put(pb2.SessionRequest(generate=pb2.GenerateRequest(model="q", text="hi", sampling=SP(
            max_tokens=n, temperature=0))))

    def closing_events(self) -> int:
        return sum(1 for e in self.call if e.finish_reason)


def sessions(d, k):
    """300 Session streams opened at once, each asking one token, then left waiting (each open one holds a
    --max-streams place); one session sending 200 requests before reading any event; one whose second message is
    not a SessionRequest; 1000 sessions opened and cancelled at once |
    past the 224 places RESOURCE_EXHAUSTED; GetStatus and health answer within 0.5 s while every place is held; all
    200 requests answered; the bad bytes INVALID_ARGUMENT; after the cancels every place free again
    (224 sessions serve) and the threads back"""
    t0 = d.threads()
    held = [_Open(d) for _ in range(300)]
    for s in held:
        s.send()
    refused = 0
    for s in held:
        code = attempt(lambda: next(s.call))[0]
        refused += code == "RESOURCE_EXHAUSTED"
        k.check(code in ("OK", "RESOURCE_EXHAUSTED"), f"a session's first event: {code}")
    k.check(refused == 300 - 224, f"{refused} of 300 sessions refused, expected the 76 past 224 places")
    for _ in range(3):
        k.expect("GetStatus behind 224 waiting sessions", attempt(lambda: d.status(timeout=2)), OK, within=STALL)
    k.expect("health Check behind 224 waiting sessions", attempt(lambda: d.health.Check(
        health_pb2.HealthCheckRequest(service=""), timeout=2)), OK, within=STALL)
    for s in held:
        s.call.cancel()
    time.sleep(1.0)

    flood = _Open(d)
    for _ in range(200):
        flood.send()
    time.sleep(2.0)
    flood.requests.put(None)  # the stream ends OK once all 200 are answered
    got = attempt(flood.closing_events)
    k.expect("200 requests before reading", got, OK, within=30)
    k.check(got[1] == "200", f"{got[1]} closing events for 200 requests")
    k.check(flood.call.code() == grpc.StatusCode.OK, f"the flooding session ended {flood.call.code()}")

    raw = d.ch.stream_stream("/minferd.v1.Minferd/Session")
    good = pb2.SessionRequest(generate=pb2.GenerateRequest(model="q", text="hi", sampling=SP(max_tokens=1)))
    k.expect("a session's second message not a SessionRequest", attempt(lambda: list(raw(
        iter([good.SerializeToString(), b"\x0a\xff\xff\xff\xff\x0f"]), metadata=d.md, timeout=30))), INV)

    storm = [_Open(d) for _ in range(1000)]
    for s in storm:
        s.call.cancel()
    time.sleep(2.0)
    again = [_Open(d) for _ in range(224)]
    for s in again:
        s.send()
    served = sum(attempt(lambda: next(s.call))[0] == "OK" for s in again)
    k.check(served == 224, f"{served} of 224 sessions served after the storms: places not given back")
    for s in again:
        s.call.cancel()
    time.sleep(2.0)
    k.check(d.threads() <= max(t0, 256 + 12), f"threads {t0} -> {d.threads()} after the sessions went")


def _connect(d, hello: bytes | None = None):
    """A raw connection to the daemon's session socket; hello: a SocketHello's bytes, sent framed."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(d.address.removeprefix("unix://") + ".session")  # blocking: waits its turn in the accept queue
    s.settimeout(60)
    if hello is not None:
        s.sendall(struct.pack("<I", len(hello)) + hello)
    return s


def _replies(s) -> list:
    """Every reply until the daemon closes the socket (a reset counts as closed)."""
    f, out = s.makefile("rb"), []
    try:
        while len(head := f.read(4)) == 4:
            out.append(pb2.SocketReply.FromString(f.read(struct.unpack("<I", head)[0])))
    except OSError:
        pass
    s.close()
    return out


def _closing(s) -> bool:
    """Whether the request sent on s got its closing event (s is closed then)."""
    f = s.makefile("rb")
    try:
        while len(head := f.read(4)) == 4:
            r = pb2.SocketReply.FromString(f.read(struct.unpack("<I", head)[0]))
            if r.WhichOneof("reply") != "event" or r.event.finish_reason:
                return r.WhichOneof("reply") == "event"
        return False
    finally:
        s.close()


def _code(s) -> str:
    got = _replies(s)
    return got[-1].error.code if got and got[-1].WhichOneof("reply") == "error" else "CLOSED"


def session_socket(d, k):
    """The session socket (the daemon's path + .session): 300 connections at once that never say hello; one
    hello with a wrong token; a frame announcing 1 GiB; half a header, then nothing; a 3000-token request whose
    client hangs up after its first event; 1000 connections opened and closed at once |
    past the 224 places a RESOURCE_EXHAUSTED frame at once, GetStatus within 0.5 s meanwhile, the held ones closed
    within the 5 s hello limit; UNAUTHENTICATED; INVALID_ARGUMENT before the body is read; half a header
    closed after the 10 s frame limit; the hung-up request cancelled; afterwards 224 connections serve and the
    threads are back"""
    t0 = d.threads()
    token = pb2.SocketHello(token=TOKEN).SerializeToString()
    held = [_connect(d) for _ in range(300)]
    time.sleep(1.0)
    k.expect("GetStatus behind 300 silent connections", attempt(lambda: d.status(timeout=2)), OK, within=STALL)
    t1 = time.monotonic()
    codes = collections.Counter(_code(s) for s in held)
    k.check(codes["RESOURCE_EXHAUSTED"] == 76 and codes["CLOSED"] == 224, f"300 silent connections: {dict(codes)}")
    k.check(time.monotonic() - t1 < 8, f"silent connections closed after {time.monotonic() - t1:.1f} s")
    got = _code(_connect(d, pb2.SocketHello(token="wrong-" + TOKEN).SerializeToString()))
    k.check(got == "UNAUTHENTICATED", f"a wrong token: {got}")
    s = _connect(d, token)
    s.sendall(struct.pack("<I", 1 << 30))
    k.check(_code(s) == "INVALID_ARGUMENT", "a 1 GiB frame not refused INVALID_ARGUMENT")
    s = _connect(d, token)
    s.sendall(b"\x10\x00")
    t1 = time.monotonic()
    k.check(_code(s) == "CLOSED" and 9 < time.monotonic() - t1 < 15, f"half a header: {time.monotonic() - t1:.1f} s")
    s = _connect(d, token)
    body = pb2.SessionRequest(generate=pb2.GenerateRequest(model="q", text="hi", sampling=SP(
        max_tokens=3000, temperature=0))).SerializeToString()
    s.sendall(struct.pack("<I", len(body)) + body)
    k.check(len(s.recv(4)) > 0, "no first event")
    s.close()
    time.sleep(2.0)
    running = sum(m.engine.running for m in d.status().models)
    k.check(running == 0, f"{running} sequences still running after their client hung up")
    for s in [_connect(d) for _ in range(1000)]:
        s.close()
    time.sleep(2.0)
    again = [_connect(d, token) for _ in range(224)]
    one = pb2.SessionRequest(generate=pb2.GenerateRequest(model="q", text="hi", sampling=SP(max_tokens=1)))
    for s in again:
        s.sendall(struct.pack("<I", one.ByteSize()) + one.SerializeToString())
    served = sum(_closing(s) for s in again)
    k.check(served == 224, f"{served} of 224 connections served after the storms: places not given back")
    time.sleep(2.0)
    k.check(d.threads() <= max(t0, 256 + 12), f"threads {t0} -> {d.threads()} after the connections went")
