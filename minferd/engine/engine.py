"""One model's engine: a thread that runs its requests together, a step at a time.

    schedule -> run -> postprocess

`add` hands it a Sequence; its tokens come back on the sequence's event queue. `submit` runs a
function on the engine's thread between two steps (the host changes a weight set's f16 copy so,
while no pass reads it). Closing the engine (an unload) refuses new work and ends every
sequence and queued function with Aborted; a sequence whose client went away ends at the next
step, and its blocks are free from then on.

Whoever holds the turn runs steps: the engine's thread, or a request's own thread that finds the
engine idle (nothing running, nothing queued). That one runs its sequence's first step itself
where the backend allows it on any thread (a replay of graphs captured already: backend
`runs_anywhere`), so a short prompt's first token comes with no thread hand-off either way (on
the H200's VM each woke a sleeping thread, ~0.1 ms); the engine's thread takes the rest.

Decode runs a step ahead where the backend allows it (backend `runs_ahead`; run_ahead.py).
"""
from __future__ import annotations

import logging
import queue
import threading

import numpy as np

from minferd.backend.batch import Batch
from minferd.config import valve
from minferd.engine.blocks import BlockManager
from minferd.engine import run_ahead
from minferd.engine.run_ahead import AheadStep
from minferd.engine.scheduler import Scheduler
from minferd.engine.sequence import Sequence, Status
from minferd.errors import Aborted, NotFound
from minferd.priority import engine_nice, lower_this_thread, renice_this_thread
from minferd.worker import Job

log = logging.getLogger("minferd")
_WAKE = object()  # an inbox item that only wakes the engine's thread: a caller's step left work
# How long a request waits for the turn while the engine's thread, with nothing left to run, ends
# its last step (a client's next request may come as soon as its last token went out).
TURN_WAIT_S = 0.005


class ModelEngine:
    def __init__(self, name: str, model, cache, ctx: int, max_seqs: int):
        self.name, self.model, self.cache = name, model, cache
        # The cache's last block is where a padded decode batch's empty rows write.
        self.blocks = BlockManager(cache.n_blocks - 1, cache.block_size)
        self.scheduler = Scheduler(self.blocks, model.max_batch, max_seqs)
        self.max_blocks = -(-ctx // cache.block_size)  # a block table's width: one context
        self.pending = 0  # sequences and functions not yet ended: the pool treats the model as busy
        self.steps = 0
        self.steps_ahead = 0  # decode steps whose tokens waited on the device for the next step's launch
        self.requests = self.tokens = 0  # sequences that ran, and the tokens they generated
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._turn = threading.Lock()  # held by the thread running steps (see the module's doc)
        self.caller_steps = bool(model.be.caller_steps) and valve("MINFERD_CALLER_STEPS") != "0"
        # Threads that compute on the host are lowered; a device engine's only launches and waits.
        self._nice = None if model.be.computes_on_host else engine_nice(valve("MINFERD_ENGINE_NICE"))
        self._closed = False
        self._live: set = set()  # sequences and jobs not yet ended
        self._unsent: list[Sequence] = []  # sequences whose outbox holds events (see step)
        # Where launches return before the work is done (CUDA), a step's tokens go out while the
        # next step runs on the device: waking 64 clients' threads costs the GIL milliseconds.
        self._overlap = bool(getattr(model.be, "launches_async", False))
        self.runs_ahead = run_ahead.enabled(model.be)
        self._ahead: AheadStep | None = None
        self._publish()
        self._thread = threading.Thread(target=self._run, name=f"minferd-model-{name}", daemon=True)
        self._thread.start()

    # ---- the host's side ----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if self.caller_steps and self._idle_turn():
            try:
                taken = self._first_step_here(seq)
                wake = taken and self.scheduler.has_work()
            finally:
                self._turn.release()
            if taken:
                if wake:  # its decode, or a step the backend would not run here
                    self._inbox.put(_WAKE)
                return
        self._enqueue(seq)

    def _idle_turn(self) -> bool:
        """The turn, where it is free or the engine's thread holds it with no work left (read
        without the turn: a hint; _first_step_here checks under it)."""
        return self._turn.acquire(blocking=False) or (
            not self.scheduler.has_work() and self._turn.acquire(timeout=TURN_WAIT_S))

    def _first_step_here(self, seq: Sequence) -> bool:
        """Under the turn, on the caller's thread: where the engine is idle, take seq and run its
        first step here if the backend can (else it stays scheduled for the engine's thread).
        False: the engine is not idle, and seq was not taken."""
        with self._lock:
            if self._closed or self.scheduler.has_work() or not self._inbox.empty():
                return False
            self.pending += 1
            self._live.add(seq)
        self.scheduler.add(seq)
        try:
            self.model.be.bind_thread()
            self.step(here=True)
        except Exception:  # the step's own errors end its sequences; this is anything before it
            log.exception("model %s: a request's own step failed; the engine's thread takes it", self.name)
        self._publish()
        return True

    def submit(self, fn, on_done=None) -> Job:
        """Run fn(job) on the engine's thread between steps; returns the job at once."""
        job = Job(fn, on_done)
        self._enqueue(job)
        return job

    def call(self, fn):
        return self.submit(fn).wait()

    def _enqueue(self, item) -> None:
        with self._lock:
            if self._closed:
                raise NotFound(f"model {self.name!r} is being unloaded")
            self.pending += 1
            self._live.add(item)
        self._inbox.put(item)

    def close_if_idle(self) -> bool:
        with self._lock:
            if self.pending or self._closed:
                return False
            self._closed = True
        self._inbox.put(None)
        return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._live)
        for item in live:
            item.cancel() if isinstance(item, Job) else item.cancelled.set()
        self._inbox.put(None)

    def join(self, timeout: float | None = None) -> None:
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def stop(self) -> None:
        self.close()
        self.join()

    def counts(self) -> dict[str, int]:
        """Sequences and KV blocks as of the engine's latest step (status reads them from any
        thread: the engine publishes a fresh dict, nobody iterates its live state)."""
        return self._counts

    def _publish(self) -> None:
        c = self.blocks.counts()
        self._counts = {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                        "blocks_total": c["total"], "blocks_used": c["used"], "blocks_cached": c["cached"],
                        "blocks_free": c["free"], "block_size": self.cache.block_size}

    # ---- the engine's thread ------------------------------------------------------------------
    def _run(self) -> None:
        if self._nice is None:
            lower_this_thread()
        elif self._nice:
            renice_this_thread(self._nice)
        self.model.be.bind_thread()
        while True:
            with self._turn:
                busy = self.scheduler.has_work()
            items = [] if busy else [self._inbox.get()]
            with self._turn:
                while True:
                    try:
                        items.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                if items and self._ahead:  # new work and jobs start with no step in flight
                    self._settle()
                if self._take(items):
                    self._abort_all()
                    return
                self._end_stopped()
                if self.scheduler.has_work():
                    self.step()
                self._publish()

    def _take(self, items) -> bool:
        closing = False
        for item in items:
            if item is _WAKE:
                continue
            if item is None:
                closing = True
            elif isinstance(item, Job):
                self._run_job(item)
            else:
                self.scheduler.add(item)
        return closing or self._closed

    def _run_job(self, job: Job) -> None:
        try:
            if self._closed:
                job.error = Aborted(f"model {self.name!r} was unloaded before this request ran")
            elif not job.cancelled.is_set():
                job.result = job.fn(job)
        except BaseException as e:  # handed to the waiting caller
            job.error = e
        finally:
            self._ended(job)
            job._finish()

    def step(self, here: bool = False) -> None:
        """One pass of what the scheduler picks. here: on a caller's thread, which runs it only
        where the backend can there (else it stays scheduled, and the engine's thread runs it)."""
        if self._ahead and not run_ahead.holds(self._ahead, self.scheduler, self.blocks):
            self._settle()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return
        try:
            batch = self._batch(scheduled)
            if here and not self.model.be.runs_anywhere(self.model, batch, self.cache):
                return
            logits = self.model.be.run(self.model, batch, self.cache)
            if self._overlap:
                self._flush()  # the previous step's tokens, while this one computes
            self._postprocess(scheduled, logits, may_run_ahead=not here)
        except Exception as e:  # one bad pass fails the sequences in it, not the model
            log.exception("model %s: a step of %d sequences failed", self.name, len(scheduled))
            if self._ahead:  # its sequences are this step's, and fail with it
                step, self._ahead = self._ahead, None
                step.discard()
            for seq, _ in scheduled:
                if seq in self._live:  # not ended already (by a step ahead's token)
                    self._end(seq, error=e)
        if not self._overlap or not self.scheduler.has_work():
            self._flush()
        self.steps += 1

    def _flush(self) -> None:
        if self._unsent:  # an ended sequence leaves the counts before its client hears the end
            self._publish()
        for seq in self._unsent:
            seq.flush()
        self._unsent.clear()

    def _batch(self, scheduled) -> Batch:
        if self._ahead:  # the step ahead's sequences again (run_ahead.holds)
            return self._ahead.next_batch(self.cache.block_size, self.max_blocks)
        parts = [(seq.tokens[seq.n_computed:seq.n_computed + n], seq.n_computed, seq.block_table)
                 for seq, n in scheduled]
        return Batch.build(parts, self.cache.block_size, width=self.max_blocks)

    def _postprocess(self, scheduled, logits, may_run_ahead: bool = False) -> None:
        # Rows whose every token is in this step sample the next; the step ahead's tokens are read
        # only once that is queued behind this step (they may end a sequence of this one).
        ready = [(i, seq) for i, (seq, n) in enumerate(scheduled) if seq.n_uncomputed == n]
        be, seqs = self.model.be, [s for _, s in ready]
        if ready and len(ready) != len(scheduled):
            logits = logits[be.to_device(np.asarray([i for i, _ in ready], np.int64))]
        sampled = be.sample_async(logits, seqs) if ready and self.runs_ahead else None
        if self._ahead:
            self._settle()
            self._flush()  # while the GPU runs this step
        for seq, n in scheduled:
            if seq.status is not Status.FINISHED:
                seq.n_computed += n
                self.blocks.register(seq)
        if not ready:
            return
        if may_run_ahead and sampled is not None and run_ahead.may_hold(scheduled, seqs):
            for seq in seqs:
                seq.ahead = 1
            self._ahead = AheadStep(seqs, sampled)
            self.steps_ahead += 1
            return
        self._add_tokens(seqs, sampled.tokens() if sampled is not None else be.sample(logits, seqs))

    def _add_tokens(self, seqs, tokens) -> None:
        for seq, tok in zip(seqs, tokens):
            seq.ahead = 0
            if seq.status is Status.FINISHED:  # ended by a step ahead's token: this row is thrown away
                continue
            seq.add_token(int(tok))
            self._unsent.append(seq)
            # A first token goes out at once, ahead of the sequence's bookkeeping: its time to first
            # token is not held a step, and the client's thread wakes while this one goes on.
            first = self._overlap and seq.t_first == seq.t_last
            if first:
                seq.flush()
            if seq.status is Status.FINISHED:
                self._end(seq)
                if first:
                    self._publish()  # as _flush does
                    seq.flush()

    # ---- decode run ahead (run_ahead.py) -----------------------------------------------------
    def _settle(self) -> None:
        """The step ahead's tokens read and taken (its sequences that ended since skip theirs)."""
        step, self._ahead = self._ahead, None
        tokens, error = step.read()
        if error is not None:  # the sampler refused a row: those sequences fail
            log.error("model %s: sampling a step ahead of %d sequences failed", self.name, len(step.seqs), exc_info=error)
            for seq in step.seqs:
                if seq.status is not Status.FINISHED:
                    self._end(seq, error=error)
        self._add_tokens(step.seqs, tokens)

    def _end_stopped(self) -> None:
        stopped = [s for s in (*self.scheduler.running, *self.scheduler.waiting) if s.stopped()]
        for seq in stopped:
            seq.finish("cancelled")
            self._end(seq)
        if stopped:
            self._flush()

    def _end(self, seq: Sequence, error: BaseException | None = None) -> None:
        if seq.admitted:
            self.requests += 1
            self.tokens += seq.n_generated
        seq.finish(seq.finish_reason or "error")
        self.scheduler.finish(seq)
        seq.outbox.append(("end", error, None))
        self._unsent.append(seq)
        self._ended(seq)

    def _abort_all(self) -> None:
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self._end(seq, error=Aborted(f"model {self.name!r} was unloaded while this request ran"))
        self._flush()
        # Whatever arrived after the close: nobody will run it.
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Job):
                self._run_job(item)
            elif item is not None:
                item.events.put(("end", Aborted(f"model {self.name!r} was unloaded before this request ran"), None))
                self._ended(item)

    def _ended(self, item) -> None:
        with self._lock:
            if item in self._live:
                self._live.discard(item)
                self.pending -= 1
