"""The loaded models: load / unload / generate / reap, admission's decisions carried out.

The model table changes under `_lock`, held for microseconds and never across work: a load
reserves (name and bytes) under it, opens and uploads without it, and commits under it again,
rolled back on any failure; an unload takes the model out of the table under it, then cancels
its requests and frees its memory without it. So status never waits on a load, an unload, a
demotion or a promotion. Decisions that spend the pool's free bytes (admission, and the
reservation it leads to; promotions' reservations) are taken one at a time under `_admit`.
Lock order: _admit, then _lock, then the ledger's; nothing takes them the other way round.

Loading is host_load.py's, the f16 copies (demote, promote) host_w16.py's: one class, its state
here. Each model has its own worker thread (minferd/worker.py): its requests queue there,
different models run in parallel, and what touches a weight set's buffers runs on its models'
workers between requests. Every buffer comes from the allocator tagged
(owner, kind): a file's weight set owns its weights and f16 copy, a model its KV and scratch.
"""
from __future__ import annotations

import collections
import threading
import time

from minferd import report
from minferd.config import DEFAULT_PARALLEL, W16_MIN_BYTES
from minferd.devices import DeviceTraits
from minferd.errors import Conflict, MinferdError, NotFound, excerpt
from minferd.host_load import LoadMixin, LoadOptions  # noqa: F401 (LoadOptions: callers import it from here)
from minferd.host_w16 import W16Mixin
from minferd.loaded import LoadedModel, WeightSet
from minferd.engine.sequence import Sequence
from minferd.model.generate import GenerationResult, check_prompt
from minferd.model.sampler import SamplingParams
from minferd.pool import admission
from minferd.pool.allocator import Allocator
from minferd.pool.ledger import Ledger


class Host(LoadMixin, W16Mixin):
    def __init__(self, backend_factory, device_memory, traits: DeviceTraits, capacity: int,
                 w16_min_bytes: int = W16_MIN_BYTES, device: str = "cpu", default_parallel: int = DEFAULT_PARALLEL):
        """backend_factory(matmul_path=...) -> a fresh backend (one per model) over `device_memory`."""
        self.backend_factory, self.traits, self.device = backend_factory, traits, device
        self.default_parallel = default_parallel  # a load's KV: this many contexts, unless it says
        self.w16_min_bytes = w16_min_bytes
        self.ledger = Ledger(capacity)
        self.allocator = Allocator(self.ledger, device_memory)
        self.models: dict[str, LoadedModel] = {}
        self.weight_sets: dict[tuple, WeightSet] = {}
        self._loading: dict[str, tuple] = {}  # names reserved by loads in progress -> (file, ctx, done)
        # Names being unloaded -> done. The ledger tags a model's bytes by its name: a new load of
        # the name waits until the old one's are gone (its unreserve took the newcomer's reservation).
        self._unloading: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._admit = threading.Lock()
        self._events_lock = threading.Lock()
        self.events: list[str] = []  # "demoted a", "expired b", ...: the latest 1000, for status and tests
        self.event_counts: collections.Counter = collections.Counter()  # by kind, for metrics
        self.promote_in_background = False  # the daemon sets it: an unload then returns at once
        self.retry_promotion = False  # memory freed while a waiting model was busy: try again

    # ---- unload ----------------------------------------------------------------------------------
    def unload(self, name: str, reason: str | None = None, when=None, promote: bool = True) -> int:
        """Take the model out of the table, cancel its requests (their callers get Aborted), free
        its KV and scratch, and its weights when no other model shares them. Returns the bytes
        freed. With `when` (eviction, expiry, keep-alive 0) only an idle model for which when(model)
        still holds is unloaded, else nothing happens and it returns 0."""
        with self._lock:
            lm = self.models.get(name)
            if lm is None:
                if name in self._loading:
                    raise Conflict(f"model {name!r} is still loading; unload it once it is loaded")
                raise self._not_found(name)
            if when is not None:
                if not when(lm) or not lm.worker.close_if_idle():
                    return 0
            else:
                lm.worker.close()
            del self.models[name]
            self._unloading[name] = threading.Event()
        if reason:
            self.event(reason, name)
        try:
            lm.worker.join()  # a running request stops at its next token
            be = lm.model.be
            freed = self.ledger.held(name)
            be.free(lm.cache)
            be.free_scratch(self.allocator.for_model(name))
            self.ledger.unreserve(name)
            freed -= self.ledger.held(name)
            with self._lock:
                lm.ws.users.remove(lm)
            freed += self._release(lm.ws)
            be.close()
            self.allocator.trim()
        finally:
            with self._lock:
                self._unloading.pop(name).set()
        if promote and self.promote_in_background:
            threading.Thread(target=self.promote_waiting, name="minferd-promote", daemon=True).start()
        elif promote:
            self.promote_waiting()
        return freed

    def unload_all(self) -> None:
        for name in list(self.models):
            try:
                self.unload(name)
            except MinferdError:
                pass  # unloaded meanwhile

    def reap(self, now: float | None = None) -> list[str]:
        """Unload idle, unpinned models whose keep-alive has passed (the daemon calls it every second)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            expired = [t.name for t in admission.evictable(self._views(), now)]
        gone = []
        for name in expired:
            try:
                still = lambda lm: not lm.pinned and lm.idle() and lm.expires_at() <= now  # noqa: E731
                if self.unload(name, reason="expired", when=still):
                    gone.append(name)
            except (NotFound, Conflict):
                pass  # a client unloaded it first
        return gone

    # ---- requests ----------------------------------------------------------------------------
    def generate(self, name: str, prompt_ids, params: SamplingParams, on_piece=None) -> GenerationResult:
        """Generate and wait (on_piece(token_id, text) sees each piece as it is made)."""
        result = None
        for kind, a, b in self.stream(name, prompt_ids, params):
            if kind == "piece" and on_piece:
                on_piece(a, b)
            elif kind == "done":
                result = a
        return result

    def stream(self, name: str, prompt_ids, params: SamplingParams, prompt_text: str | None = None,
               cancel: threading.Event | None = None):
        """Add a generation to the model's engine and yield ("piece", token_id, text) as tokens
        come, then ("done", GenerationResult, None). Closing the iterator early (a client that
        went away) cancels the request: it ends at the engine's next step, its KV blocks free.
        So does setting `cancel`, which another thread may do while this one waits inside."""
        lm = self.get(name)
        if prompt_text is not None:
            prompt_ids = lm.ws.tokenizer.encode(prompt_text)
        ids = check_prompt(prompt_ids, lm.model.spec.n_vocab, lm.ctx)
        seq = Sequence(ids.tolist(), params, lm.ctx, lm.ws.tokenizer)
        seq.gone = cancel
        lm.worker.add(seq)
        try:
            while True:
                kind, a, b = seq.events.get()
                if kind == "end":
                    break
                yield kind, a, b
            if a is not None:
                raise a
            if seq.finish_reason != "cancelled":
                yield "done", GenerationResult(seq.generated, "".join(seq.text), seq.n_prompt, seq.finish_reason,
                                               seq.timings()), None
        finally:
            seq.cancelled.set()
            lm.last_used = time.monotonic()
            if lm.keep_alive == 0:
                try:
                    self.unload(name, when=lambda m: m is lm and m.keep_alive == 0)
                except MinferdError:
                    pass  # someone else unloaded it first

    def get(self, name: str) -> LoadedModel:
        lm = self.models.get(name)
        if lm is None:
            raise self._not_found(name)
        return lm

    def _not_found(self, name: str) -> NotFound:
        return not_found(name, self.models)

    def has_model(self, name: str) -> bool:
        """Loaded and serving (per-model health reads this: it never disagrees with the table)."""
        return name in self.models

    def set_pinned(self, name: str, pinned: bool) -> None:
        self.get(name).pinned = pinned

    def set_keep_alive(self, name: str, seconds: float) -> None:
        self.get(name).keep_alive = seconds

    def event(self, kind: str, name: str) -> None:
        with self._events_lock:
            self.events.append(f"{kind} {name}")
            del self.events[:-1000]
            self.event_counts[kind] += 1

    # ---- accounting ------------------------------------------------------------------------
    def status(self) -> dict:
        """One consistent snapshot of the table and the ledger, built in a few microseconds per
        model under the table lock (never behind a load, an unload or a promotion)."""
        with self._lock:
            snap = self.ledger.snapshot()
            allocated = self.allocator.held_bytes()
            models = [report.model_info(lm, self.traits, snap, self.device) for lm in self.models.values()]
            loading, unloading = list(self._loading), list(self._unloading)
        with self._events_lock:
            events = self.events[-50:]
        return {"pool": report.pool_info(snap, self.device, self.w16_min_bytes, allocated, loading, unloading),
                "models": models, "events": events}

    def model_info(self, lm: LoadedModel) -> dict:
        with self._lock:
            return report.model_info(lm, self.traits, self.ledger.snapshot(), self.device)

    def model_bytes(self, lm: LoadedModel) -> dict[str, int]:
        return report.model_bytes(lm, self.ledger.snapshot())


def not_found(name: str, loaded) -> NotFound:
    """NotFound for `name`, listing (the first 20 of) the names that are loaded."""
    known = sorted(loaded)
    listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
    return NotFound(f"no model named {excerpt(name)} is loaded (loaded: {listed or 'none'})")
