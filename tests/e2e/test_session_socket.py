"""The session socket against a real daemon (minferd/session_socket.py): requests on it give what
their calls give; a frame past the limit, bytes that do not parse and a wrong token are refused with
their status and the daemon serves on; it holds a --max-streams place a connection, closes an idle
one, cancels the request of a client that hangs up; MINFERD_SESSION_SOCKET=0 opens none and the
Client then rides gRPC's Session.
"""
from __future__ import annotations

import os
import socket
import stat
import struct
import time

import grpc
import pytest

from minferd._proto import pb2
from minferd.client import Client
from minferd.client_socket import SocketCallError, SocketSession
from tests.e2e.daemon import Daemon
from tests.e2e.test_session import sessions_daemon, when_free

IDLE = 1.5  # the daemon's --session-idle
PLACES = 3  # its --max-streams
HEADER = struct.Struct("<I")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    yield from sessions_daemon(tmp_path_factory, "socket", IDLE, PLACES)


def path_of(daemon) -> str:
    return daemon.sock + ".session"


def generate(prompt, n=4):
    return pb2.GenerateRequest(model="tiny", ids=pb2.TokenIds(ids=prompt),
                               sampling=pb2.SamplingParams(temperature=0, max_tokens=n))


def raw(daemon, hello: bytes | None = b"") -> socket.socket:
    """A connection that has said hello (no token), unless hello is None."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path_of(daemon))
    if hello is not None:
        s.sendall(HEADER.pack(len(hello)) + hello)
    return s


def replies(s: socket.socket) -> list:
    """Every reply until the daemon closes the socket."""
    f, out = s.makefile("rb"), []
    while len(head := f.read(4)) == 4:
        out.append(pb2.SocketReply.FromString(f.read(HEADER.unpack(head)[0])))
    return out


def test_requests_on_the_socket_give_what_their_calls_give(daemon):
    st = os.lstat(path_of(daemon))
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    stub = daemon.stub()
    s = when_free(lambda: SocketSession(path_of(daemon), pb2, None))
    try:
        for prompt in ([1, 2, 3], [40, 41], [7] * 20):
            got = []
            last = s.run("generate", generate(prompt), got.append)
            want = list(stub.Generate(generate(prompt), timeout=60))
            assert [(e.text, e.token_id) for e in got[:-1]] == [(e.text, e.token_id) for e in want[:-1]]
            assert last.finish_reason == want[-1].finish_reason and last.timings.generated_tokens == 4
        chat = pb2.ChatRequest(model="tiny", messages=[pb2.ChatMessage(role="user", content="hi")],
                               sampling=pb2.SamplingParams(temperature=0, max_tokens=3))
        got = []
        s.run("chat", chat, got.append)
        assert [e.token_id for e in got] == [e.token_id for e in stub.Chat(chat, timeout=60)]
        assert s.served == 4
        with pytest.raises(grpc.RpcError) as e:  # a Client's callers catch grpc.RpcError, as for calls
            s.run("generate", pb2.GenerateRequest(model="nope", ids=pb2.TokenIds(ids=[1])), got.append)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in e.value.details()
    finally:
        s.close()


@pytest.mark.parametrize("frame, code, words", [
    (HEADER.pack(1 << 30), "INVALID_ARGUMENT", "frame of 1073741824 bytes"),
    (HEADER.pack(3) + b"\xff\xff\xff", "INVALID_ARGUMENT", "not a SessionRequest"),
    (HEADER.pack(0), "INVALID_ARGUMENT", "generate or a chat"),
])
def test_a_bad_frame_is_refused_and_the_daemon_serves_on(daemon, frame, code, words):
    s = served(daemon)
    s.sendall(frame)
    got = replies(s)
    assert len(got) == 1 and got[0].error.code == code and words in got[0].error.message
    s.close()
    assert Client(daemon.address).generate("tiny", [1, 2], max_tokens=2, temperature=0)["finish_reason"]


def served(daemon) -> socket.socket:
    """A connection that holds a place: its first request answered (refused ones are tried again)."""
    def go():
        sess = SocketSession(path_of(daemon), pb2, None)
        sess.run("generate", generate([1], n=1), lambda e: None)
        return sess.sock
    return when_free(go)


def refused_or(got: list) -> list:
    """got, unless the daemon refused the connection for want of a place (when_free tries again)."""
    if got and got[0].error.code == "RESOURCE_EXHAUSTED":
        raise SocketCallError("RESOURCE_EXHAUSTED", got[0].error.message)
    return got


def test_a_hello_that_does_not_parse(daemon):
    def go():
        s = raw(daemon, hello=None)
        s.sendall(HEADER.pack(2) + b"\xff\xff")
        return refused_or(replies(s))
    got = when_free(go)
    assert got[0].error.code == "INVALID_ARGUMENT" and "SocketHello" in got[0].error.message


def test_places_idle_and_hangup(daemon):
    """Every place held: the next connection is refused at once; an idle one is closed after
    --session-idle; a client that hangs up mid-generation gets its place back and its sequence
    cancelled."""
    t0 = time.monotonic()
    held = [served(daemon) for _ in range(PLACES)]
    refused = replies(raw(daemon, hello=None))
    assert refused[0].error.code == "RESOURCE_EXHAUSTED" and str(PLACES) in refused[0].error.message
    for s in held:
        assert replies(s) == []  # closed by the daemon, idle
        s.close()
    assert IDLE <= time.monotonic() - t0 < IDLE + 15
    with pytest.raises(grpc.RpcError) as e:  # the Client's way: refused as a call would be
        full = [served(daemon) for _ in range(PLACES)]
        Client(daemon.address).generate("tiny", [1], max_tokens=1)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for s in full:
        s.close()
    s = served(daemon)
    body = pb2.SessionRequest(generate=generate([2, 3], n=3000)).SerializeToString()
    s.sendall(HEADER.pack(len(body)) + body)
    assert s.recv(4)  # generating
    s.close()
    end = time.monotonic() + 20
    while daemon.stub().GetStatus(pb2.GetStatusRequest(), timeout=10).models[0].engine.running and time.monotonic() < end:
        time.sleep(0.05)
    assert not daemon.stub().GetStatus(pb2.GetStatusRequest(), timeout=10).models[0].engine.running
    held = [served(daemon) for _ in range(PLACES)]  # every place back
    for s in held:
        s.close()


def test_the_socket_asks_for_the_token(tmp_path, synth_model):
    d = Daemon(tmp_path, "--device", "cpu", "--preload", f"{synth_model('qwen2')}=tiny", "--threads", "1",
               token="s0cket-token-0123456789abcdef")
    try:
        for token in (None, "wrong-token-0123456789abcdef"):
            with pytest.raises(grpc.RpcError) as e:
                SocketSession(path_of(d), pb2, token).run("generate", generate([1]), lambda e: None)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and (token or "#") not in e.value.details()
        c = Client(d.address, token=d.token)
        assert len(c.generate("tiny", [1], max_tokens=2, temperature=0)["token_ids"]) == 2
        assert type(c._session).__name__ == "SocketSession"
    finally:
        assert d.stop() == 0


def test_no_socket_where_turned_off_and_the_client_rides_grpc(tmp_path, synth_model):
    d = Daemon(tmp_path, "--device", "cpu", "--preload", f"{synth_model('qwen2')}=tiny", "--threads", "1",
               env={"MINFERD_SESSION_SOCKET": "0"})
    try:
        assert not os.path.exists(path_of(d))
        c = Client(d.address)
        assert len(c.generate("tiny", [1], max_tokens=2, temperature=0)["token_ids"]) == 2
        assert c._socket_path is None and type(c._session).__name__ == "Session"
    finally:
        assert d.stop() == 0
    assert not os.path.exists(path_of(d))
