"""Jobs: functions a model's engine runs on its thread between two steps (minferd/engine/engine.py),
and running one while other engines are parked between theirs.

A job cancelled while queued never runs; its caller waits on it with `wait`."""
from __future__ import annotations

import threading

from minferd.errors import NotFound


class Job:
    def __init__(self, fn, on_done=None):
        self.fn = fn
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self.on_done = on_done

    def cancel(self) -> None:
        self.cancelled.set()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result

    def _finish(self) -> None:
        self.done.set()
        if self.on_done:
            self.on_done()


def call_exclusive(workers: list, fn):
    """Run fn(job) on workers[0] while every other worker is parked between requests, and wait.
    Weights shared by several models change (an f16 copy dropped or built) only while none of
    them is reading them: on CUDA a request on another model's stream could otherwise still be
    reading memory the pool has handed to someone else. A worker being stopped is skipped."""
    release = threading.Event()
    parked = []
    try:
        for w in workers[1:]:
            ready = threading.Event()
            try:
                job = w.submit(lambda job, ready=ready: (ready.set(), release.wait()))
            except NotFound:
                continue  # being unloaded: it runs nothing more
            parked.append((ready, job))
        for ready, job in parked:
            while not ready.wait(0.05) and not job.done.is_set():
                pass
        return workers[0].call(fn)
    finally:
        release.set()
