"""One worker thread per model: requests to one model run in order, different models in parallel.

A job that is cancelled while queued never runs; one that is running sees `cancelled` through the
should_stop hook it was given, so a client that goes away frees its slot at once. Closing the
worker (an unload) refuses new jobs and cancels the queued and running ones: their callers get
Aborted, and the unload waits only for the running job to notice.
"""
from __future__ import annotations

import queue
import threading

from minferd.errors import Aborted, NotFound
from minferd.priority import lower_this_thread


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


class ModelWorker:
    def __init__(self, name: str):
        self.name = name
        self.pending = 0  # queued + running: the pool treats a model with pending work as busy
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._jobs: set[Job] = set()  # queued and running
        self._thread = threading.Thread(target=self._run, name=f"minferd-model-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn, on_done=None) -> Job:
        """Queue fn(job); returns the job at once. on_done() runs on the worker when it ends."""
        job = Job(fn, on_done)
        with self._lock:
            if self._closed:
                raise NotFound(f"model {self.name!r} is being unloaded")
            self.pending += 1
            self._jobs.add(job)
        self._q.put(job)
        return job

    def call(self, fn):
        """Run fn(job) on the worker and wait for it."""
        return self.submit(fn).wait()

    def close_if_idle(self) -> bool:
        """Close if nothing is queued or running, in one step (a request submitted a moment later
        is refused, never half-run on a model being unloaded)."""
        with self._lock:
            if self.pending or self._closed:
                return False
            self._closed = True
        self._q.put(None)
        return True

    def close(self) -> None:
        """Refuse new jobs and cancel every queued and running one; returns at once (join waits)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()
        self._q.put(None)

    def join(self, timeout: float | None = None) -> None:
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def stop(self) -> None:
        self.close()
        self.join()

    def _run(self) -> None:
        lower_this_thread()
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                if self._closed:
                    job.error = Aborted(f"model {self.name!r} was unloaded before this request ran")
                elif job.cancelled.is_set():
                    job.error = None  # nobody is waiting for it any more
                else:
                    job.result = job.fn(job)
                    if self._closed:  # stopped early by the unload: say so, not "cancelled"
                        job.error = Aborted(f"model {self.name!r} was unloaded while this request ran")
            except BaseException as e:  # handed to the waiting caller
                job.error = e
            finally:
                with self._lock:
                    self.pending -= 1
                    self._jobs.discard(job)
                job._finish()


def call_exclusive(workers: list[ModelWorker], fn):
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
