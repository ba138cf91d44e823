"""The session socket's parts on a socketpair: a frame's bounds and deadlines, and the hang-up watch
that cancels a request whose client left while it wrote nothing (a request waiting its turn)."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from minferd import session_socket
from minferd.errors import InvalidRequest
from minferd.session_socket import HEADER, Closed, HangupWatch, read_frame


def test_a_frame_past_the_limit_is_refused_before_its_bytes_are_read():
    a, b = socket.socketpair()
    b.sendall(HEADER.pack(1001))  # no body: reading it would wait
    with pytest.raises(InvalidRequest, match="frame of 1001 bytes, past this daemon's limit of 1000"):
        read_frame(a, 1000, 5.0)
    b.sendall(HEADER.pack(3) + b"abc")
    assert read_frame(a, 1000, 5.0) == b"abc"
    a.close(), b.close()


def test_idle_and_slow_frames_end_the_connection(monkeypatch):
    monkeypatch.setattr(session_socket, "FRAME_S", 0.3)
    a, b = socket.socketpair()
    t0 = time.monotonic()
    with pytest.raises(Closed):
        read_frame(a, 1000, 0.2)  # nothing comes
    assert 0.2 <= time.monotonic() - t0 < 10
    b.sendall(HEADER.pack(10) + b"abc")  # the rest never comes
    t0 = time.monotonic()
    with pytest.raises(Closed):
        read_frame(a, 1000, 5.0)
    assert 0.3 <= time.monotonic() - t0 < 10
    b.close()
    with pytest.raises(Closed, match="closed"):
        read_frame(a, 1000, 5.0)
    a.close()


def test_the_hangup_watch_cancels_the_running_request_only():
    watch = HangupWatch()
    (a, b), (c, d) = socket.socketpair(), socket.socketpair()
    ea, ec = watch.add(a), watch.add(c)
    ea[1], ec[1] = threading.Event(), threading.Event()
    b.sendall(b"x")  # data is no hang-up
    time.sleep(0.2)
    assert not ea[1].is_set()
    b.close()
    assert ea[1].wait(5) and not ec[1].is_set()
    watch.remove(a), watch.remove(c)
    watch.close()
    for s in (a, c, d):
        s.close()


def test_a_socket_closed_under_the_watch_is_no_hangup():
    """The watch's thread may find a connection its own thread closed a moment before (the race the
    hostile sweep's thread death came from): no exception, no cancel."""
    a, b = socket.socketpair()
    a.close()
    assert session_socket._hung_up(a) is False
    b.close()
