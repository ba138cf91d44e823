"""The loaded models: load / unload / generate / reap, admission's decisions carried out.

The model table changes under `_lock`, held for microseconds and never across work: a load
reserves (name and bytes) under it, opens and uploads without it, and commits under it again,
rolled back on any failure; an unload takes the model out of the table under it, then cancels
its requests and frees its memory without it. So status never waits on a load, an unload, a
demotion or a promotion. Decisions that spend the pool's free bytes (admission, and the
reservation it leads to; promotions' reservations) are taken one at a time under `_admit`.
Lock order: _admit, then _lock, then the ledger's; nothing takes them the other way round.

Each model has its own worker thread (minferd/worker.py): its requests queue there, different
models run in parallel, and what touches a weight set's buffers (demote, promote: host_w16.py)
runs on its models' workers between requests. Every buffer comes from the allocator tagged
(owner, kind): a file's weight set owns its weights and f16 copy, a model its KV and scratch.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass

from minferd import report
from minferd.config import (
    DEFAULT_CTX,
    DEFAULT_KEEP_ALIVE,
    MAX_NAME_CHARS,
    W16_MIN_BYTES,
)
from minferd.devices import DeviceTraits, MatmulPath
from minferd.errors import Conflict, InvalidRequest, MinferdError, NotFound, excerpt
from minferd.host_w16 import W16Mixin
from minferd.loaded import LoadedModel, WeightSet
from minferd.model.generate import GenerationResult, generate
from minferd.model.loader import ModelFile, build_model, open_model_file, upload_weights
from minferd.model.sampler import SamplingParams
from minferd.model.source import ModelSource
from minferd.pool import admission
from minferd.pool.admission import TenantView
from minferd.pool.allocator import Allocator
from minferd.pool.estimator import estimate
from minferd.pool.ledger import DeviceOutOfMemory, Ledger
from minferd.pool.planner import Plan, plan
from minferd.worker import Job

log = logging.getLogger("minferd")

@dataclass(slots=True)
class LoadOptions:
    matmul_path: MatmulPath | None = None  # None: the planner decides
    ctx: int | None = None  # None: min(the model's training context, DEFAULT_CTX)
    pinned: bool = False
    keep_alive: float = DEFAULT_KEEP_ALIVE


def check_name(name: str) -> None:
    # Control and invisible characters (not isprintable) made names that status tables, logs
    # and metric labels show wrongly or not at all; they are refused like spaces.
    if not name or len(name) > MAX_NAME_CHARS or any(c.isspace() or not c.isprintable() for c in name):
        raise InvalidRequest(f"model name {excerpt(name)}: 1 to {MAX_NAME_CHARS} printable characters, no spaces")


class Host(W16Mixin):
    def __init__(self, backend_factory, device_memory, traits: DeviceTraits, capacity: int,
                 w16_min_bytes: int = W16_MIN_BYTES, device: str = "cpu"):
        """backend_factory(matmul_path=...) -> a fresh backend (one per model) over `device_memory`."""
        self.backend_factory, self.traits, self.device = backend_factory, traits, device
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

    # ---- load ----------------------------------------------------------------------------------
    def load(self, name: str, source, opts: LoadOptions | None = None, progress=None) -> LoadedModel:
        """Load `source` (a path, or an opened file from minferd.paths) as `name`: reserve, upload,
        commit. Refused (typed, nothing changed) when the name is taken or the pool cannot hold it."""
        opts = opts or LoadOptions()
        mf = self._open(source)
        try:
            check_name(name)
            ctx = opts.ctx or min(mf.spec.ctx_train, DEFAULT_CTX)
            if not 1 <= ctx <= mf.spec.ctx_train:
                raise InvalidRequest(f"ctx {ctx} is outside [1, {mf.spec.ctx_train}] (the model's training context)")
            try:
                return self._load(name, mf, ctx, opts, progress)
            except DeviceOutOfMemory:
                # The device refused what the ledger allowed (another process took memory): treat
                # it as pressure. Give back idle f16 copies and try once more, else refuse.
                if not self._demote_idle(keep=mf.identity):
                    raise
                return self._load(name, mf, ctx, opts, progress)
        finally:
            mf.close()  # what the model needs is on the device now, or nothing is

    def _open(self, source) -> ModelFile:
        """The checked file: a loaded one's as it was parsed at its first load (same descriptor
        identity: the same bytes), else parsed now. A test suite loads one file under many names."""
        src = source if isinstance(source, ModelSource) else ModelSource.open(source)
        with self._lock:
            ws = self.weight_sets.get(src.identity)
            if ws is not None and ws.ready.is_set() and ws.users:
                src.close()
                return ws.file
        return open_model_file(src)  # closes the source itself when it refuses the file

    def _load(self, name, mf, ctx, opts, progress) -> LoadedModel:
        while True:
            step = self._reserve(name, mf, ctx, opts)
            if not isinstance(step, threading.Event):
                break
            step.wait()  # the same file is being uploaded (for this name or another): then share or return it
        if isinstance(step, LoadedModel):
            return step
        ws, p, first = step
        try:
            lm = self._build(name, ws, p, ctx, opts, progress, first)
        except BaseException:
            self.ledger.unreserve(name)
            with self._lock:
                self._loading.pop(name)[2].set()
            self._release(ws)
            raise
        with self._lock:
            ws.users.append(lm)
            self.models[name] = lm
            self._loading.pop(name)[2].set()
        ws.ready.set()  # loads of the same file waiting for it share it now (on failure: _release sets it)
        if progress:
            progress("ready", 1, 1)
        return lm

    def _reserve(self, name, mf, ctx, opts):
        """Under _admit: admission, its decisions carried out, the bytes reserved. Returns the
        loaded model (a repeated load), an Event to wait for (the same load from another client,
        or the file being uploaded for another name), or (weight set, plan, whether it uploads)."""
        key = mf.identity
        with self._admit:
            with self._lock:
                lm = self.models.get(name)
                if lm is not None:
                    if lm.ws.key == key and lm.ctx == ctx:
                        return lm  # loading what is already loaded is a no-op, as in Ollama
                    raise Conflict(f"model name {name!r} is in use by {lm.ws.file.path} (ctx {lm.ctx}); unload it first")
                if name in self._unloading:
                    return self._unloading[name]
                if name in self._loading:
                    other_key, other_ctx, done = self._loading[name]
                    if (other_key, other_ctx) == (key, ctx):
                        return done  # the same load from another client: its model, once it is there
                    raise Conflict(f"model name {name!r} is being loaded by another request (another file or ctx)")
                ws = self.weight_sets.get(key)
                if ws is not None and not ws.ready.is_set():
                    return ws.ready
                est = estimate(mf, self.traits, ctx)
                if ws is not None:
                    user = ws.users[0].name if ws.users else "a load in progress"
                    if opts.matmul_path is not None and opts.matmul_path != ws.plan.matmul_path:
                        raise Conflict(f"{mf.path.name} is loaded as {user} with plan {ws.plan.matmul_path.value}; a "
                                       f"second load shares its weights and plan, so it cannot run "
                                       f"{opts.matmul_path.value} (unload {user} first, or leave matmul_path unset)")
                    p = Plan(ws.plan.matmul_path, f"shares weights with {user}", ctx, ws.plan.kv_dtype,
                             {"weights": 0, "w16": 0, "kv": est.kv, "scratch": est.scratch})
                else:
                    p = plan(est, self.traits, self.ledger.free(), opts.matmul_path, self.w16_min_bytes)
                what = f"loading {name} ({mf.path.name}, {p.matmul_path.value})"
                decision = admission.admit(p.total, self.ledger.free(), self._views(exclude=ws), time.monotonic(), what)
                self._loading[name] = (key, ctx, threading.Event())
                first = ws is None
                if first:
                    ws = WeightSet(key, mf, p, ready=threading.Event())
                    self.weight_sets[key] = ws  # another load of this file waits for it (ready)
                ws.refs += 1
            try:
                self._carry_out(decision)
                if first:
                    self.ledger.reserve(ws.tag, p.bytes["weights"] + p.bytes["w16"], what)
                try:
                    self.ledger.reserve(name, p.bytes["kv"] + p.bytes["scratch"], what)
                except BaseException:
                    if first:
                        self.ledger.unreserve(ws.tag)
                    raise
            except BaseException:
                with self._lock:
                    self._loading.pop(name)[2].set()
                self._release(ws)
                raise
        return ws, p, first

    def _build(self, name, ws: WeightSet, p: Plan, ctx, opts, progress, first: bool) -> LoadedModel:
        """Without any lock: upload (the first load of a file), then the model's own KV and scratch.
        On failure frees what it made; the caller gives back the reservations."""
        backend = self.backend_factory(matmul_path=ws.plan.matmul_path)
        mem, made = self.allocator.for_model(name), []
        try:
            if first:
                from minferd.model.tokenizer import Tokenizer, read_tokenizer_metadata
                ws.tokenizer = Tokenizer.from_metadata(read_tokenizer_metadata(ws.file.gguf))
                problem = ws.tokenizer.check_chat_template()
                if problem:  # it still generates; Chat on it answers FAILED_PRECONDITION naming this
                    log.warning("%s: %s", ws.file.path.name, problem)
                ws.backend = backend  # frees the weights once the set's last user goes
                ws.weights = upload_weights(ws.file, backend, self.allocator.for_model(ws.tag), p.matmul_path,
                                            progress)
            model = build_model(ws.file, backend, ws.weights)
            made.append(model.new_cache(mem, ctx))
            backend.alloc_scratch(mem, p.bytes["scratch"])
        except BaseException:
            backend.free(*made)
            backend.free_scratch(mem)
            backend.close()
            raise
        return LoadedModel(name, ws, model, made[0], ctx, opts.pinned, opts.keep_alive)

    def _release(self, ws: WeightSet) -> int:
        """One user or pending load fewer; the last one frees the set's weights. Returns bytes freed."""
        with self._lock:
            ws.refs -= 1
            gone = ws.refs == 0
            if gone and self.weight_sets.get(ws.key) is ws:
                del self.weight_sets[ws.key]
        if not gone:
            return 0
        held = self.ledger.held(ws.tag)
        if ws.weights:
            ws.backend.free(*ws.weights.values())
        self.ledger.unreserve(ws.tag)
        ws.ready.set()
        return held - self.ledger.held(ws.tag)

    # ---- admission's view, and its decisions carried out -----------------------------------------
    def _views(self, exclude: WeightSet | None = None) -> list[TenantView]:
        """Under _lock: every model but those of `exclude` (a load's shared set must stay)."""
        snap = self.ledger.snapshot()
        views = []
        for lm in self.models.values():
            ws = lm.ws
            if ws is exclude:
                continue
            pending = ws.refs > len(ws.users)  # a load in progress will read these weights
            views.append(TenantView(
                lm.name, ws.id, lm.pinned, lm.idle(), lm.last_used, lm.expires_at(), snap.committed_of(lm.name),
                0 if pending else snap.committed_of(ws.tag), 0 if ws.changing else snap.by_kind(ws.tag)["w16"]))
        return views

    def _carry_out(self, decision: admission.Decision) -> None:
        # Each step re-checks its model: one that turned busy or went since the snapshot is
        # skipped, and the reservation that follows refuses if the room is not there after all.
        for name in decision.demote:
            try:
                self.demote(name)
            except MinferdError:
                pass
        for name in decision.unload:
            try:
                # No promotion after it: the room is for the load that holds _admit now.
                self.unload(name, reason="evicted", when=lambda lm: not lm.pinned and lm.idle(), promote=False)
            except MinferdError:
                pass

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
        """Queue a generation on the model's worker and yield ("piece", token_id, text) as tokens
        come, then ("done", GenerationResult, None). Closing the iterator early (a client that
        went away) cancels the request: a queued one never runs, a running one stops. So does
        setting `cancel`, which another thread may do while this one waits inside the iterator."""
        lm = self.get(name)
        if prompt_text is not None:
            prompt_ids = lm.ws.tokenizer.encode(prompt_text)
        events: queue.SimpleQueue = queue.SimpleQueue()

        def stopped() -> bool:
            return job.cancelled.is_set() or (cancel is not None and cancel.is_set())

        def run(job: Job):
            if cancel is not None and cancel.is_set():
                return None  # its client went away while it was queued
            res = generate(lm.model, lm.ws.tokenizer, prompt_ids, params, lm.ctx,
                           lambda tok, piece: events.put(("piece", tok, piece)), stopped,
                           cache=lm.cache)
            lm.requests += 1
            lm.tokens += len(res.token_ids)
            return res

        job = lm.worker.submit(run)
        job.on_done = lambda: events.put(("end", None, None))
        try:
            while True:
                kind, a, b = events.get()
                if kind == "end":
                    break
                yield kind, a, b
            result = job.wait()
            if result is not None:
                yield "done", result, None
        finally:
            job.cancel()
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
        known = sorted(self.models)
        listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        return NotFound(f"no model named {excerpt(name)} is loaded (loaded: {listed or 'none'})")

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
            models = [report.model_info(lm, self.traits, snap) for lm in self.models.values()]
        with self._events_lock:
            events = self.events[-50:]
        return {"pool": report.pool_info(snap, self.device, self.w16_min_bytes, allocated),
                "models": models, "events": events}

    def model_info(self, lm: LoadedModel) -> dict:
        with self._lock:
            return report.model_info(lm, self.traits, self.ledger.snapshot())

    def model_bytes(self, lm: LoadedModel) -> dict[str, int]:
        return report.model_bytes(lm, self.ledger.snapshot())

