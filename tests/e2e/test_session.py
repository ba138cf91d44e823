"""The Session stream against one real daemon: Generate and Chat requests in turn on one call give
what their own calls give; a bad request ends it with Generate's status and the daemon serves on;
an idle one ends CANCELLED and gives its stream place back; minferd.Client rides one (on the session socket
where the daemon has one, test_session_socket.py) and resends a request an idled-out session never read.
"""
from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from minferd._proto import pb2
from minferd.client import Client
from minferd.model.synth import write_model
from tests.e2e.daemon import Daemon

IDLE = 1.0  # the daemon's --session-idle
PLACES = 3  # its --max-streams: one more than any test but the idle one holds, for a place still on its way back


def sessions_daemon(tmp_path_factory, name: str, idle: float, places: int):
    """A CPU daemon over a tiny model, `places` generation places, sessions idle out after `idle` s
    (this module's and test_session_socket's fixture)."""
    d = tmp_path_factory.mktemp(f"{name}-models")
    write_model(d / "tiny.gguf", "qwen2", "tiny", "q8_0", seed=3)
    daemon = Daemon(tmp_path_factory.mktemp(f"{name}-daemon"), "--models-dir", d, "--budget", "256MiB",
                    "--threads", "1", "--max-streams", places, "--session-idle", idle)
    yield daemon
    assert daemon.stop() == 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    yield from sessions_daemon(tmp_path_factory, "session", IDLE, PLACES)


class Open:
    """A raw Session call: requests put as they are wanted, events read on this thread."""

    def __init__(self, stub, metadata=()):
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.call = stub.Session(iter(self.requests.get, None), metadata=metadata, timeout=60)

    def send(self, **kind) -> list:
        self.requests.put(pb2.SessionRequest(**kind))
        events = []
        for e in self.call:
            events.append(e)
            if e.finish_reason:
                return events
        raise AssertionError("the session ended before the request's closing event")

    def close(self):
        self.requests.put(None)


def when_free(fn, seconds=20.0):
    """fn() once a stream place is free: a session ended by a cancel gives its place back as its
    handler unwinds, a moment after the client saw the call end."""
    end = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > end:
                raise
            time.sleep(0.05)


def opened(stub, n=1, begun_only=False) -> Open:
    """A session whose first request (n tokens) was answered, or begun where begun_only: it holds
    a place. A new one each try while every place is taken."""
    def go():
        s = Open(stub)
        s.requests.put(pb2.SessionRequest(generate=generate([2, 3], n=n)))
        for e in s.call:
            if begun_only or e.finish_reason:
                return s
    return when_free(go)


def generate(prompt, n=6, **kw):
    return pb2.GenerateRequest(model="tiny", ids=pb2.TokenIds(ids=prompt),
                               sampling=pb2.SamplingParams(temperature=0, max_tokens=n), **kw)


def tokens(events):
    return [e.token_id for e in events if e.token_id >= 0 and not e.finish_reason]


def test_requests_in_turn_give_what_their_own_calls_give(daemon):
    stub = daemon.stub()
    prompts = [[1, 2, 3], [40, 41], [7] * 20, [1, 2, 3]]
    alone = [tokens(stub.Generate(generate(p), timeout=60)) for p in prompts]
    chat = pb2.ChatRequest(model="tiny", messages=[pb2.ChatMessage(role="user", content="hello there")],
                           sampling=pb2.SamplingParams(temperature=0, max_tokens=5))
    chat_alone = tokens(stub.Chat(chat, timeout=60))
    s = Open(stub)
    got = [tokens(s.send(generate=generate(p))) for p in prompts]
    got_chat = tokens(s.send(chat=chat))
    last = s.send(generate=generate([9, 9], n=3))
    s.close()
    assert got == alone and got_chat == chat_alone and all(len(t) == 6 for t in got)
    assert last[-1].finish_reason == "length" and last[-1].timings.generated_tokens == 3
    assert list(s.call) == [] and s.call.code() == grpc.StatusCode.OK  # closing the requests ends it OK


@pytest.mark.parametrize("kind, status, words", [
    ({"generate": pb2.GenerateRequest(model="nope", ids=pb2.TokenIds(ids=[1]))}, grpc.StatusCode.NOT_FOUND, "nope"),
    ({"generate": pb2.GenerateRequest(model="tiny")}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    ({}, grpc.StatusCode.INVALID_ARGUMENT, "generate or a chat"),
])
def test_a_bad_request_ends_the_session_with_its_status(daemon, kind, status, words):
    stub = daemon.stub()
    s = Open(stub)
    assert tokens(s.send(generate=generate([5, 6]))) == tokens(stub.Generate(generate([5, 6]), timeout=60))
    s.requests.put(pb2.SessionRequest(**kind))
    with pytest.raises(grpc.RpcError) as e:
        list(s.call)
    assert e.value.code() == status and words in e.value.details()
    assert len(tokens(stub.Generate(generate([5, 6]), timeout=60))) == 6  # the daemon serves on


def test_bytes_that_do_not_parse_are_invalid_argument(daemon):
    ch = daemon.channel()
    raw = ch.stream_stream("/minferd.v1.Minferd/Session")
    good = pb2.SessionRequest(generate=generate([3, 4], n=2)).SerializeToString()
    replies = raw(iter([good, b"\x0a\xff\xff\xff\xff"]), timeout=60)
    with pytest.raises(grpc.RpcError) as e:
        list(replies)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Session: the request does not parse" in e.value.details()
    ch.close()


def test_an_idle_session_ends_and_gives_its_stream_place_back(daemon):
    stub = daemon.stub()
    t0 = time.monotonic()
    held = [opened(stub) for _ in range(PLACES)]  # every place held while they wait
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Generate(generate([1], n=1), timeout=60))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for s in held:
        with pytest.raises(grpc.RpcError) as e:
            next(s.call)
        assert e.value.code() == grpc.StatusCode.CANCELLED
    assert IDLE <= time.monotonic() - t0 < IDLE + 15
    assert len(tokens(when_free(lambda: list(stub.Generate(generate([1], n=2), timeout=60))))) == 2


def grpc_client(address, **kw) -> Client:
    """A Client that sends gRPC Sessions (as with a TCP daemon's): its session socket not tried."""
    c = Client(address, **kw)
    c._socket_path = None
    return c


@pytest.mark.parametrize("way", ["socket", "grpc"])
def test_client_rides_one_session_and_resends_after_an_idle_end(daemon, way):
    c = Client(daemon.address) if way == "socket" else grpc_client(daemon.address)
    try:
        first = c.generate("tiny", [1, 2, 3], max_tokens=4, temperature=0)
        again = c.generate("tiny", [1, 2, 3], max_tokens=4, temperature=0)
        assert (again["text"], again["token_ids"]) == (first["text"], first["token_ids"]) and len(first["token_ids"]) == 4
        session = c._session
        assert session.served == 2
        time.sleep(IDLE + 2)  # the daemon ends it; the client finds out on its next request
        assert c.generate("tiny", [1, 2, 3], max_tokens=4, temperature=0)["token_ids"] == first["token_ids"]
        assert c._session is not session and c._session.served == 1
        with pytest.raises(grpc.RpcError) as e:
            c.generate("nope", [1], max_tokens=1)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and c._session is None
        assert c.chat("tiny", [{"role": "user", "content": "hi"}], max_tokens=2, temperature=0)["finish_reason"]
    finally:
        c.close()


def test_a_session_asks_for_the_token(tmp_path, synth_model):
    d = Daemon(tmp_path, "--device", "cpu", "--preload", f"{synth_model('qwen2')}=tiny", "--threads", "1",
               token="s3ssion-token-0123456789abcdef")
    try:
        stub = d.stub()
        with pytest.raises(grpc.RpcError) as e:
            Open(stub).send(generate=generate([1], n=1))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len(tokens(Open(stub, d.metadata()).send(generate=generate([1], n=2)))) == 2
    finally:
        assert d.stop() == 0


def test_session_idle_from_the_environment_and_its_bounds(tmp_path):
    from minferd.cli import parser
    from minferd.config import load_config
    from minferd.errors import InvalidRequest
    from minferd.serve import _check_numbers
    assert load_config({}, env={"MINFERD_SESSION_IDLE": "2.5"}).session_idle == 2.5
    for bad in ("0", "-1", "nan", "1e9"):
        with pytest.raises(InvalidRequest, match="session_idle"):
            _check_numbers(load_config({}, env={"MINFERD_SESSION_IDLE": bad}))
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--session-idle", "0"])


def test_a_client_that_cancels_ends_its_session_quietly(daemon):
    """Between requests and mid-generation: the places come back, the daemon logs no error."""
    stub = daemon.stub()
    before = daemon.log.read_text().count("internal error")
    opened(stub, 2).call.cancel()  # while the daemon waits for its next request
    opened(stub, 1500, begun_only=True).call.cancel()  # mid-generation
    held = [opened(stub, 2) for _ in range(PLACES)]
    for s in held:
        s.close()
    assert daemon.log.read_text().count("internal error") == before


def test_a_client_dropped_unclosed_closes_its_session(daemon):
    c = grpc_client(daemon.address)
    assert len(when_free(lambda: c.generate("tiny", [5], max_tokens=2, temperature=0))["token_ids"]) == 2
    call = c._session._call
    del c  # its place goes back now, not when the daemon finds it idle
    assert call.code() == grpc.StatusCode.CANCELLED
    on_socket = Client(daemon.address)  # the same on the session socket
    assert len(when_free(lambda: on_socket.generate("tiny", [5], max_tokens=2, temperature=0))["token_ids"]) == 2
    sock = on_socket._session.sock
    del on_socket
    assert sock.fileno() == -1


def test_an_idle_session_does_not_hold_the_drain(tmp_path, synth_model):
    """SIGTERM: a session between requests ends at once (the daemon exits well inside its drain), one
    mid-request gets its request's last event first."""
    d = Daemon(tmp_path, "--device", "cpu", "--preload", f"{synth_model('qwen2')}=tiny", "--threads", "1",
               "--drain-seconds", "30")
    stub = d.stub()
    waiting = Open(stub)
    waiting.send(generate=pb2.GenerateRequest(model="tiny", ids=pb2.TokenIds(ids=[1]),
                                              sampling=pb2.SamplingParams(temperature=0, max_tokens=1)))
    client, on_grpc = Client(d.address), grpc_client(d.address)  # on the session socket, and on gRPC
    for c in (client, on_grpc):
        assert len(c.generate("tiny", [1], max_tokens=2, temperature=0)["token_ids"]) == 2
    busy = Open(stub)
    busy.requests.put(pb2.SessionRequest(generate=pb2.GenerateRequest(
        model="tiny", ids=pb2.TokenIds(ids=[1]), sampling=pb2.SamplingParams(temperature=0, max_tokens=300))))
    next(busy.call)
    rest, ended = [], []

    def read():  # the request's events as they come, then the session ends (OK) with the daemon
        try:
            rest.extend(busy.call)
        except grpc.RpcError:
            pass
        ended.append(busy.call.code())
    reader = threading.Thread(target=read)
    reader.start()
    t0 = time.monotonic()
    assert d.stop(timeout=60) == 0
    assert time.monotonic() - t0 < 15, "the drain waited on a session between requests"
    reader.join(30)
    assert rest and rest[-1].finish_reason == "length" and rest[-1].timings.generated_tokens == 300
    assert ended == [grpc.StatusCode.OK]  # after its last event, nothing of it cut off
    assert waiting.call.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    for c in (client, on_grpc):
        with pytest.raises(grpc.RpcError) as e:  # a Client's session ended with it: a new one finds no daemon
            c.generate("tiny", [1], max_tokens=1, temperature=0)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_of_a_daemon_without_session_sends_calls(daemon):
    """A daemon from before Session answers it UNIMPLEMENTED (here: the real daemon asked for a method
    it does not have): the Client sends that request and the next ones as calls of their own."""
    c = grpc_client(daemon.address)
    try:
        c.stub.Session = c.channel.stream_stream("/minferd.v1.Minferd/NoSuchMethod",
                                                 request_serializer=pb2.SessionRequest.SerializeToString,
                                                 response_deserializer=pb2.GenerateEvent.FromString)
        for _ in range(2):
            assert len(when_free(lambda: c.generate("tiny", [5, 6], max_tokens=3, temperature=0))["token_ids"]) == 3
        assert c._sessions is False and c._session is None
    finally:
        c.close()
