"""The Session stream's attack class (bench/hostile_sweep.py runs it): docstring "what was tried | what is
expected"."""
from hostile_harness import *  # noqa: F401,F403

import queue  # noqa: E402


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
