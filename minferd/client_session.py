"""One Session call of a Client: its Generate and Chat requests in turn over one stream.

gRPC's call setup is most of a short request's round trip through Python on both ends (a bare
one-message stream ~0.65 ms on the GPU hosts, bench/rpc_hops.py); a request on an open stream
skips it. The daemon ends a session that idles past its --session-idle (CANCELLED) or that it
drains (OK), and a restarted daemon's connection is gone (UNAVAILABLE): a request that got no event
on a session that served others before is sent once more on a new one. None is answered twice: the daemon
reads a session's next request only once the last one has ended, and an ended session reads none.
"""
from __future__ import annotations

import queue

STALE = ("CANCELLED", "UNAVAILABLE")  # how a session that was open before may be found ended


class SessionEnded(Exception):
    """The daemon ended the session OK without a closing event for the request (it drains)."""


class Session:
    def __init__(self, stub, pb, metadata):
        self.pb = pb
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        # grpc sends what this iterator yields from a thread of its own; None ends the stream.
        self._call = stub.Session(iter(self._requests.get, None), metadata=metadata)
        self.served = 0  # requests that got their closing event

    def run(self, kind: str, request, on_event):
        """Sends one request ("generate" or "chat"); on_event(e) for each of its events; the
        closing event back. Raises grpc.RpcError as the call ended, SessionEnded where it ended
        OK mid-request; on anything raised the session is closed."""
        self._requests.put(self.pb.SessionRequest(**{kind: request}))
        try:
            for e in self._call:
                on_event(e)
                if e.finish_reason:
                    self.served += 1
                    return e
        except BaseException:
            self.close()  # Ctrl-C or a failing callback: the daemon frees the slot at once
            raise
        self.close()
        raise SessionEnded("the daemon ended the Session stream before the request's closing event")

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
