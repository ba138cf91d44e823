"""A Client's session over the daemon's session socket (minferd/session_socket.py says why): the
same run / close as client_session.Session, its errors as grpc.RpcError with the code the same
request's call would end with, so callers see no difference but the time."""
from __future__ import annotations

import contextlib
import socket
import struct
import time

import grpc

from minferd.client_session import SessionEnded

HEADER = struct.Struct("<I")
CONNECT_S = 5.0
MAX_FRAME = 64 << 20  # what a client takes from a daemon before it calls the stream broken


class SocketCallError(grpc.RpcError):
    """The daemon's error for a request on the session socket, shaped as a call's RpcError."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self._code = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN)
        self._details = message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:
        return f"{self._code.name}: {self._details}"


class SocketSession:
    def __init__(self, path: str, pb, token: str | None):
        """Connects and says hello; OSError where nothing listens at path (the caller falls back)."""
        self.pb = pb
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        deadline = time.monotonic() + CONNECT_S
        try:
            while True:
                try:
                    self.sock.connect(path)
                    break
                except BlockingIOError:  # the daemon's accept queue is full: a burst of clients
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.005)
            self.sock.setblocking(True)
        except OSError:
            self.sock.close()
            raise
        self._in = self.sock.makefile("rb")
        hello = pb.SocketHello(token=token or "").SerializeToString()
        try:
            self.sock.sendall(HEADER.pack(len(hello)) + hello)
        except OSError:  # refused before its hello (every place taken): the daemon's error says so
            reply = self._read()
            self.close()
            self._raise_error(reply)
            raise
        self.served = 0  # requests that got their closing event

    def run(self, kind: str, request, on_event):
        """As client_session.Session.run: SessionEnded where the daemon closed the socket before
        any reply (it idled out, drained or restarted: the caller may resend), SocketCallError
        for the daemon's error. On anything raised the socket is closed."""
        try:
            try:
                self._send(self.pb.SessionRequest(**{kind: request}))
            except SessionEnded:  # refused at once (no place left): its error is there to read
                self._raise_error(self._read())
                raise
            while True:
                reply = self._read()
                if reply is None:
                    raise SessionEnded("the daemon closed the session socket before the request's closing event")
                self._raise_error(reply)
                on_event(reply.event)
                if reply.event.finish_reason:
                    self.served += 1
                    return reply.event
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _send(self, msg) -> None:
        body = msg.SerializeToString()
        try:
            self.sock.sendall(HEADER.pack(len(body)) + body)
        except (BrokenPipeError, ConnectionResetError):
            raise SessionEnded("the daemon closed the session socket") from None

    @staticmethod
    def _raise_error(reply) -> None:
        if reply is not None and reply.WhichOneof("reply") == "error":
            raise SocketCallError(reply.error.code, reply.error.message)

    def _read(self):
        """The next reply, or None where the daemon closed the socket."""
        try:
            return self._read_frame()
        except OSError:  # reset by the daemon's end
            return None

    def _read_frame(self):
        head = self._in.read(HEADER.size)
        if len(head) < HEADER.size:
            return None
        (n,) = HEADER.unpack(head)
        if n > MAX_FRAME:
            raise SocketCallError("INTERNAL", f"the daemon sent a frame of {n} bytes: not a minferd session socket?")
        body = self._in.read(n)
        if len(body) < n:
            return None
        return self.pb.SocketReply.FromString(body)
