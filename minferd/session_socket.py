"""The session socket: Session's requests and events over a plain unix socket beside the daemon's
gRPC socket (unix_socket.session_path), framed by their length (the proto's SocketHello says how).

Why: a request on a gRPC Session still costs ~0.5 ms of gRPC's Python on a 2-core machine and
~0.9 ms on a slow GPU host (bench/rpc_hops.py), several thread wakes a message; a framed message
on a unix socket costs ~0.05 ms (bench/results/s48). A short prompt's time to first token is that
round trip plus the engine's step. The same servicer code runs each request (checks, load on
demand, metrics), so a request answers here exactly what its Generate or Chat call would.

What it holds, and for how long: a connection takes one of the servicer's --max-streams places
from accept to close (refused RESOURCE_EXHAUSTED past them) and a thread; its hello must come
within HELLO_S, a frame's bytes within FRAME_S of its first, the next request within
--session-idle; a frame past the daemon's message limit is refused before it is read. A client
that hangs up mid-request cancels it (HangupWatch); one that stops reading is dropped after SEND_S.
"""
from __future__ import annotations

import contextlib
import hmac
import logging
import os
import select
import socket
import struct
import threading
import time

from google.protobuf.message import DecodeError

from minferd._proto import pb2
from minferd.errors import Busy, InvalidRequest, excerpt
from minferd.unix_socket import BoundSocket, clear_stale, make_parent

log = logging.getLogger("minferd.session_socket")

HEADER = struct.Struct("<I")
HELLO_S = 5.0  # a connection says who it is this soon, or is closed
HELLO_BYTES = 4096  # a hello carries a token, nothing more
FRAME_S = 10.0  # a frame's bytes, once its first came
SEND_S = 30.0  # a client that reads nothing for this long is dropped
UNAUTHENTICATED = "missing or wrong bearer token"


class Closed(Exception):
    """The connection ended: the peer closed it, went quiet too long, or the daemon drains."""


class _Unauthenticated(Exception):
    """A hello without the daemon's token (UNAUTHENTICATED, as the gRPC interceptor answers)."""


def read_frame(conn: socket.socket, limit: int, wait_s: float | None) -> bytes:
    """One frame's message; its first byte within wait_s (None: no limit), the rest within FRAME_S.
    Raises Closed at the end of the stream or a timeout, InvalidRequest for a frame past `limit`
    (before its bytes are read)."""
    (n,) = HEADER.unpack(_read(conn, HEADER.size, wait_s))
    if n > limit:
        raise InvalidRequest(f"session socket: a frame of {n} bytes, past this daemon's limit of {limit}")
    return _read(conn, n, FRAME_S)


def _read(conn: socket.socket, n: int, wait_s: float | None) -> bytes:
    """n bytes: the first within wait_s, all of them within FRAME_S of the first."""
    buf, got = bytearray(n), 0
    view = memoryview(buf)
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while got < n:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise Closed("timed out")
        conn.settimeout(left)
        try:
            k = conn.recv_into(view[got:])
        except OSError as e:  # socket.timeout among them
            raise Closed(str(e)) from None
        if not k:
            raise Closed("the client closed the socket")
        if not got:
            deadline = time.monotonic() + FRAME_S
        got += k
    return bytes(buf)


def send(conn: socket.socket, reply: pb2.SocketReply) -> None:
    body = reply.SerializeToString()
    conn.settimeout(SEND_S)
    conn.sendall(HEADER.pack(len(body)) + body)


class HangupWatch:
    """One thread that waits (epoll) on every open connection for a hang-up and sets the cancel
    event of the request it is running, so a client that leaves frees its sequence at once (a
    request waiting its turn writes nothing that could fail). A connection is added once; a
    request only swaps its event in (no system call a request: a per-request registration and
    its thread wakes cost ~0.3 ms, bench/rpc_hops.py)."""

    HUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR

    def __init__(self):
        self._lock = threading.Lock()
        self._conns: dict[int, list] = {}  # fd -> [socket, the running request's cancel event or None]
        self._epoll = select.epoll()
        self._closed = False
        threading.Thread(target=self._run, name="minferd-session-hangups", daemon=True).start()

    def add(self, conn: socket.socket) -> list:
        entry = [conn, None]
        with self._lock:
            self._conns[conn.fileno()] = entry
        self._epoll.register(conn.fileno(), self.HUP)
        return entry

    def remove(self, conn: socket.socket) -> None:
        """Before the socket is closed (its fd number is then free to be reused)."""
        with self._lock:
            self._conns.pop(conn.fileno(), None)
        with contextlib.suppress(OSError, ValueError):  # ValueError: the watch has ended
            self._epoll.unregister(conn.fileno())

    def close(self) -> None:
        """The thread ends once no connection is left (those mid-request when a drain begins)."""
        self._closed = True

    def _run(self) -> None:
        while not (self._closed and not self._conns):
            for fd, _ in self._epoll.poll(1.0):
                with self._lock:
                    entry = self._conns.get(fd)
                if entry is None or not _hung_up(entry[0]):
                    continue
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)  # level-triggered: reported until unregistered
                if entry[1] is not None:
                    entry[1].set()
        self._epoll.close()


def _hung_up(conn: socket.socket) -> bool:
    """Whether the socket now at this fd has its peer gone (an event for a closed connection whose fd
    number a new one took is not taken for the new one's); unread data does not hide a hang-up."""
    p = select.poll()
    try:
        p.register(conn, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    except ValueError:  # closed by its thread since the event came (fileno -1): nothing left to cancel
        return False
    return bool(p.poll(0))


class SessionSocket:
    """The listening socket, its accept thread and one thread a connection (the module's doc)."""

    def __init__(self, servicer, path: str, token: str | None, max_bytes: int, idle_s: float):
        self.servicer, self.token, self.max_bytes, self.idle_s = servicer, token, max_bytes, idle_s
        self._lock = threading.Lock()
        self._waiting: set[socket.socket] = set()  # connections between requests (drain closes them)
        self._threads: set[threading.Thread] = set()
        self._draining = False
        self._hangups = HangupWatch()
        self._listener, self.bound = _listen(path)
        self._accepter = threading.Thread(target=self._accept, name="minferd-session-accept", daemon=True)
        self._accepter.start()

    def drain(self) -> None:
        """No new connection; those between requests are closed now, those mid-request after it."""
        with self._lock:
            self._draining = True
            waiting = list(self._waiting)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._hangups.close()
        for conn in waiting:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._accepter.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed by drain
            place = contextlib.ExitStack()
            try:
                place.enter_context(self.servicer.stream_place())
            except Busy as e:
                with contextlib.suppress(OSError):
                    send(conn, self._error(e))
                conn.close()
                continue
            t = threading.Thread(target=self._serve, args=(conn, place), name="minferd-session-conn", daemon=True)
            with self._lock:
                self._threads.add(t)
            t.start()

    def _serve(self, conn: socket.socket, place) -> None:
        watched = self._hangups.add(conn)
        try:
            self._hello(conn)
            while True:
                request = self._next_request(conn)
                if request is None:
                    return
                if not self._answer(conn, request, watched):
                    return
        except Closed:
            pass
        except Exception as e:  # noqa: BLE001 - a bad frame or a refused hello: its status, then the end
            with contextlib.suppress(OSError):
                send(conn, self._error(e))
        finally:
            with self._lock:
                self._waiting.discard(conn)
                self._threads.discard(threading.current_thread())
            self._hangups.remove(conn)
            conn.close()
            place.close()

    def _hello(self, conn: socket.socket) -> None:
        try:
            hello = pb2.SocketHello.FromString(read_frame(conn, HELLO_BYTES, HELLO_S))
        except DecodeError:
            raise InvalidRequest("session socket: the first frame is not a SocketHello") from None
        if self.token and not hmac.compare_digest(hello.token.encode(), self.token.encode()):
            raise _Unauthenticated(UNAUTHENTICATED)

    def _next_request(self, conn: socket.socket):
        with self._lock:
            if self._draining:
                return None
            self._waiting.add(conn)
        try:
            frame = read_frame(conn, self.max_bytes, self.idle_s)
        finally:
            with self._lock:
                self._waiting.discard(conn)
        try:
            return pb2.SessionRequest.FromString(frame)
        except DecodeError as e:
            raise InvalidRequest(f"session socket: a frame is not a SessionRequest ({excerpt(str(e))})") from None

    def _answer(self, conn: socket.socket, request: pb2.SessionRequest, watched: list) -> bool:
        """Streams one request's events; False where the connection ends with it."""
        gone = watched[1] = threading.Event()
        events = self.servicer.session_events(request, gone)
        try:
            for e in events:
                try:
                    send(conn, pb2.SocketReply(event=e))
                except OSError:  # the client went away or stopped reading: the request is cancelled
                    gone.set()
                    return False
            return not gone.is_set()
        finally:
            watched[1] = None
            events.close()

    def _error(self, e: BaseException) -> pb2.SocketReply:
        if isinstance(e, _Unauthenticated):
            code, text = "UNAUTHENTICATED", str(e)
        else:
            c, text = self.servicer.refusal(e)
            code = c.name
        return pb2.SocketReply(error=pb2.SocketError(code=code, message=text))


def _listen(path: str) -> tuple[socket.socket, BoundSocket]:
    """A listening unix socket at `path`, owner-only from its first instant, never replacing
    anything but a stale socket (unix_socket's rules)."""
    make_parent(path)
    clear_stale(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        s.bind(path)
    except OSError as e:
        s.close()
        raise InvalidRequest(f"cannot listen on {excerpt(path)}: {e.strerror}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    st = os.lstat(path)
    s.listen(socket.SOMAXCONN)  # a burst of clients waits for the accept thread, not refused EAGAIN
    return s, BoundSocket(path, st.st_dev, st.st_ino)
