"""The models that are loaded: load / unload / generate, and the pool's decisions carried out.

State is owned here, under one lock for the model table. Each model has its own worker thread
(minferd/worker.py): its requests queue there, different models run in parallel, and anything
that touches a model's buffers (demote, promote) runs on that worker, between requests.
Memory is the pool's: every buffer comes from the allocator tagged (owner, kind), where the
owner of weights and f16 copies is the file's weight set (shared by every model loaded from
the same file) and the owner of the KV cache and scratch is the model itself.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass

from minferd import report
from minferd.devices import DeviceTraits, MatmulPath
from minferd.errors import Conflict, InvalidRequest, NotFound
from minferd.loaded import LoadedModel, WeightSet
from minferd.model.generate import GenerationResult, generate
from minferd.model.loader import build_model, open_model_file, upload_weights
from minferd.model.sampler import SamplingParams
from minferd.pool import manager
from minferd.pool.allocator import Allocator
from minferd.pool.estimator import estimate
from minferd.pool.ledger import DeviceOutOfMemory, Ledger
from minferd.pool.planner import W16_MIN_BYTES, Plan, plan
from minferd.worker import Job, call_exclusive

DEFAULT_CTX = 4096
DEFAULT_KEEP_ALIVE = 300.0  # seconds; 0 unloads when idle, negative keeps forever


@dataclass(slots=True)
class LoadOptions:
    matmul_path: MatmulPath | None = None  # None: the planner decides
    ctx: int | None = None  # None: min(the model's training context, DEFAULT_CTX)
    pinned: bool = False
    keep_alive: float = DEFAULT_KEEP_ALIVE


class Host:
    def __init__(self, backend_factory, device_memory, traits: DeviceTraits, capacity: int,
                 w16_min_bytes: int = W16_MIN_BYTES, device: str = "cpu"):
        """backend_factory() -> a fresh backend (one per model) over `device_memory`."""
        self.backend_factory, self.traits, self.device = backend_factory, traits, device
        self.w16_min_bytes = w16_min_bytes
        self.ledger = Ledger(capacity)
        self.allocator = Allocator(self.ledger, device_memory)
        self.models: dict[str, LoadedModel] = {}
        self.weight_sets: dict[tuple, WeightSet] = {}
        self.lock = threading.RLock()
        self.events: list[str] = []  # demotions, evictions, expiries, promotions: for status and tests
        self.event_counts: dict[str, int] = {}  # by kind, for metrics
        self.promote_in_background = False  # the daemon sets it: an unload then returns at once

    # ---- load / unload ---------------------------------------------------------------------
    def load(self, name: str, path: str, opts: LoadOptions | None = None, progress=None) -> LoadedModel:
        opts = opts or LoadOptions()
        # Control and invisible characters (not isprintable) made names that status tables, logs
        # and metric labels show wrongly or not at all; they are refused like spaces.
        if not name or len(name) > 128 or any(c.isspace() or not c.isprintable() for c in name):
            raise InvalidRequest(f"model name {name[:160]!r}: 1 to 128 printable characters, no spaces")
        mf = open_model_file(path)
        key = _file_key(mf.path)
        ctx = opts.ctx or min(mf.spec.ctx_train, DEFAULT_CTX)
        if not 1 <= ctx <= mf.spec.ctx_train:
            raise InvalidRequest(f"ctx {ctx} is outside [1, {mf.spec.ctx_train}] (the model's training context)")
        with self.lock:
            if name in self.models:
                lm = self.models[name]
                if lm.ws.key == key and lm.ctx == ctx:
                    return lm  # loading what is already loaded is a no-op, as in Ollama
                raise Conflict(f"model name {name!r} is in use by {lm.ws.file.path} (ctx {lm.ctx}); unload it first")
            est = estimate(mf, self.traits, ctx)
            ws = self.weight_sets.get(key)
            if ws is not None:
                p = Plan(ws.plan.matmul_path, f"shares weights with {ws.users[0].name}", ctx, ws.plan.kv_dtype,
                         {"weights": 0, "w16": 0, "kv": est.kv, "scratch": est.scratch})
            else:
                p = plan(est, self.traits, self.ledger.free(), opts.matmul_path, self.w16_min_bytes)
            what = f"loading {name} ({mf.path.name}, {p.matmul_path.value})"
            # The models whose weights this load will share must not be evicted to make room for it.
            others = [t for t in self._tenants() if ws is None or t.ws is not ws]
            manager.make_room(self.ledger, p.total, others, what)
            try:
                return self._load_reserved(name, mf, key, ws, p, est, opts, ctx, progress)
            except DeviceOutOfMemory:
                # The device refused what the ledger allowed (another process took memory):
                # treat it as pressure. Give back idle f16 copies and try once more, else refuse.
                others = [t for t in self._tenants() if ws is None or t.ws is not ws]
                if not any(t.demote() for t in manager.demotable(others)):
                    raise
                return self._load_reserved(name, mf, key, ws, p, est, opts, ctx, progress)

    def _load_reserved(self, name, mf, key, ws, p: Plan, est, opts, ctx, progress) -> LoadedModel:
        new_ws = ws is None
        tag = f"weights:{name}"
        own = p.bytes["kv"] + p.bytes["scratch"]
        if new_ws:
            self.ledger.reserve(tag, p.bytes["weights"] + p.bytes["w16"], f"loading {name}")
        try:
            self.ledger.reserve(name, own, f"loading {name}")
        except BaseException:
            if new_ws:
                self.ledger.unreserve(tag)
            raise
        backend = self.backend_factory()
        made = []
        try:
            if new_ws:
                from minferd.model.tokenizer import Tokenizer, read_tokenizer_metadata
                tok = Tokenizer.from_metadata(read_tokenizer_metadata(mf.gguf))
                weights = upload_weights(mf, backend, self.allocator.for_model(tag), p.matmul_path, progress)
                made.extend(weights.values())
                ws = WeightSet(key, tag, mf, weights, tok, p)
            mem = self.allocator.for_model(name)
            model = build_model(ws.file, backend, ws.weights)
            cache = model.new_cache(mem, ctx)
            made.append(cache)
            backend.alloc_scratch(mem, p.bytes["scratch"])
        except BaseException:
            backend.free(*made)
            backend.free_scratch(self.allocator.for_model(name))
            self.ledger.unreserve(name)
            if new_ws:
                self.ledger.unreserve(tag)
            raise
        lm = LoadedModel(name, ws, model, cache, ctx, opts.pinned, opts.keep_alive, self)
        ws.users.append(lm)
        self.weight_sets[key] = ws
        self.models[name] = lm
        if progress:
            progress("ready", 1, 1)
        return lm

    def unload(self, name: str) -> int:
        """Free a model's KV and scratch, and its weights when no other model shares them.
        Waits for a request in flight to finish. Returns the bytes freed."""
        with self.lock:
            lm = self.get(name)
            before = self.ledger.held()
            del self.models[name]
            lm.worker.stop()  # the running request finishes, queued ones are refused
            be = lm.model.be
            be.free(lm.cache)
            be.free_scratch(self.allocator.for_model(name))
            self.ledger.unreserve(name)
            ws = lm.ws
            ws.users.remove(lm)
            if not ws.users:
                be.free(*ws.weights.values())
                self.ledger.unreserve(ws.tag)
                del self.weight_sets[ws.key]
            freed = before - self.ledger.held()
            self.allocator.trim()
        if self.promote_in_background:
            threading.Thread(target=self.promote_waiting, name="minferd-promote", daemon=True).start()
        else:
            self.promote_waiting()
        return freed

    def unload_all(self) -> None:
        for name in list(self.models):
            self.unload(name)

    # ---- demote / promote ------------------------------------------------------------------
    def demote(self, name: str) -> int:
        """Give back a model's f16 copy; it keeps serving through its quantized path."""
        with self.lock:
            lm = self.get(name)
            ws = lm.ws
            if not ws.w16_bytes():
                return 0
            workers = [u.worker for u in ws.users]
        # On the model's workers, after requests in flight (which may be reading the f16 copy);
        # outside the host's lock, so status and other models' loads do not wait for them.
        freed = call_exclusive(workers, lambda job: sum(lm.model.be.drop_w16(w) for w in ws.matmul_weights()))
        with self.lock:
            self.ledger.unreserve(ws.tag, freed)
            ws.demoted = ws.demoted or freed > 0
            if freed:
                self.event("demoted", name)
                self.allocator.trim()
        return freed

    def promote(self, name: str) -> int:
        """Build a model's f16 copy again if the pool can hold it; returns the bytes added (0 if not)."""
        with self.lock:
            lm = self.get(name)
            ws = lm.ws
            if ws.w16_bytes() or not lm.idle():
                return 0
            need = ws.plan.w16_bytes
            if need > self.ledger.free():
                return 0
            self.ledger.reserve(ws.tag, need, f"promoting {name}")
            be = lm.model.be

            def build(job):
                try:
                    for w in ws.matmul_weights():
                        be.make_w16(w)
                except BaseException:
                    for w in ws.matmul_weights():
                        be.drop_w16(w)
                    raise

            try:
                call_exclusive([u.worker for u in ws.users], build)
            except BaseException:
                self.ledger.unreserve(ws.tag, need)
                raise
            ws.demoted = False
            self.event("promoted", name)
            return need

    def promote_waiting(self) -> list[str]:
        """Demoted models get their f16 copy back, most recently used first, while it fits."""
        done = []
        with self.lock:
            waiting = [ws.users[0] for ws in self.weight_sets.values() if ws.waiting_for_w16() and ws.users]
            for lm in sorted(waiting, key=lambda m: -max(u.last_used for u in m.ws.users)):
                if self.promote(lm.name):
                    done.append(lm.name)
        return done

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
            if lm.keep_alive == 0 and not lm.busy and self.models.get(name) is lm:
                try:
                    self.unload(name)
                except NotFound:
                    pass  # someone else unloaded it first

    def get(self, name: str) -> LoadedModel:
        lm = self.models.get(name)
        if lm is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise NotFound(f"no model named {name!r} is loaded (loaded: {known})")
        return lm

    def has_model(self, name: str) -> bool:
        """Loaded and serving (per-model health reads this: it never disagrees with the table)."""
        return name in self.models

    def set_pinned(self, name: str, pinned: bool) -> None:
        self.get(name).pinned = pinned

    def set_keep_alive(self, name: str, seconds: float) -> None:
        self.get(name).keep_alive = seconds

    def reap(self, now: float | None = None) -> list[str]:
        """Unload idle, unpinned models whose keep-alive has passed (call periodically)."""
        now = time.monotonic() if now is None else now
        gone = [t.name for t in manager.evictable(self._tenants(), now)]
        for name in gone:
            self.event("expired", name)
            self.unload(name)
        return gone

    def event(self, kind: str, name: str) -> None:
        self.events.append(f"{kind} {name}")
        del self.events[:-1000]
        self.event_counts[kind] = self.event_counts.get(kind, 0) + 1

    def _tenants(self):
        return list(self.models.values())

    # ---- accounting ------------------------------------------------------------------------
    def status(self) -> dict:
        with self.lock:
            return {"pool": report.pool_info(self.ledger, self.device, self.w16_min_bytes),
                    "models": [self.model_info(lm) for lm in self.models.values()],
                    "events": list(self.events[-50:])}

    def model_info(self, lm: LoadedModel) -> dict:
        return report.model_info(lm, self.traits, self.ledger)

    def model_bytes(self, lm: LoadedModel) -> dict[str, int]:
        return report.model_bytes(lm, self.ledger)


def _file_key(path) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)
