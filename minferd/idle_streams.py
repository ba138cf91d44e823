"""Ends request streams that wait on their client too long.

A Session holds a gRPC thread and a stream place while it waits for its client's next request, so
one left open and unused must not hold them for good. One thread watches every waiting session,
at a granularity of a second or so, and cancels those past their idle time: the client sees the
call end CANCELLED and opens another (minferd.client does, resending the request it had queued).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc


FLUSH_S = 0.5  # a draining stream waits this long at least: its last events have left by then


class IdleStreams:
    def __init__(self, idle_seconds: float):
        self.idle = idle_seconds
        self._waiting: dict[int, tuple[float, Callable[[], object]]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._draining = False

    def requests(self, iterator, cancel: Callable[[], object]) -> Iterator:
        """The items of a request iterator; while it waits for one more than the idle time,
        cancel() ends the call. The items end where the call does, by this or by the client's
        cancel (grpc's iterator raises then): no error of the daemon's, the call has its status."""
        key = id(iterator)
        while True:
            if not self._wait(key, cancel):
                return  # draining: the call ends OK after what it sent (a cancel could drop that)
            try:
                item = next(iterator)
            except (StopIteration, grpc.RpcError):
                return
            finally:
                with self._lock:
                    self._waiting.pop(key, None)
            yield item

    def drain(self) -> None:
        """The daemon is stopping: the streams waiting now end within a moment, and any that comes
        to wait later (its request done) at once, so that an idle session never holds the drain."""
        with self._lock:
            self._draining = True
            for key, (deadline, cancel) in self._waiting.items():
                # Not before FLUSH_S of waiting: a cancel can cut off the events sent just before it.
                self._waiting[key] = (min(deadline, deadline - self.idle + FLUSH_S), cancel)

    def _wait(self, key: int, cancel) -> bool:
        with self._lock:
            if self._draining:
                return False
            self._waiting[key] = (time.monotonic() + self.idle, cancel)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True, name="minferd-idle-streams")
                self._thread.start()
        return True

    def _watch(self) -> None:
        """Until no stream waits (the daemon's threads go back to what they were without sessions)."""
        tick = min(1.0, self.idle / 4)
        while True:
            time.sleep(FLUSH_S / 4 if self._draining else tick)
            now = time.monotonic()
            with self._lock:
                due = [k for k, (deadline, _) in self._waiting.items() if deadline <= now]
                cancels = [self._waiting.pop(k)[1] for k in due]
                done = not self._waiting
                if done:
                    self._thread = None  # the next stream to wait starts another
            for cancel in cancels:
                cancel()
            if done:
                return
