"""The models that are loaded: load / unload / generate, and the pool's decisions carried out.

State is owned here, under one lock for the model table; each model has its own lock for
requests, so requests to different models run in parallel and requests to one model queue.
Memory is the pool's: every buffer comes from the allocator tagged (owner, kind), where the
owner of weights and f16 copies is the file's weight set (shared by every model loaded from
the same file) and the owner of the KV cache and scratch is the model itself.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from minferd.devices import DeviceTraits, MatmulPath
from minferd.errors import Conflict, InvalidRequest, NotFound
from minferd.model.arch.llama import MATMUL
from minferd.model.generate import GenerationResult, generate
from minferd.model.loader import ModelFile, build_model, open_model_file, upload_weights
from minferd.model.sampler import SamplingParams
from minferd.pool import manager
from minferd.pool.allocator import Allocator
from minferd.pool.estimator import estimate
from minferd.pool.ledger import Ledger
from minferd.pool.planner import W16_MIN_BYTES, Plan, plan

DEFAULT_CTX = 4096
DEFAULT_KEEP_ALIVE = 300.0  # seconds; 0 unloads when idle, negative keeps forever


@dataclass(slots=True)
class LoadOptions:
    matmul_path: MatmulPath | None = None  # None: the planner decides
    ctx: int | None = None  # None: min(the model's training context, DEFAULT_CTX)
    pinned: bool = False
    keep_alive: float = DEFAULT_KEEP_ALIVE


@dataclass(eq=False)
class WeightSet:
    """One file's tensors on the device, shared (refcounted) by every model loaded from it."""

    key: tuple
    tag: str
    file: ModelFile
    weights: dict
    tokenizer: object
    plan: Plan
    users: list = field(default_factory=list)
    demoted: bool = False  # planned W16 but its f16 copy was given back under pressure

    def w16_bytes(self) -> int:
        return sum(w.w16.nbytes for w in self.weights.values() if w.w16 is not None)

    def matmul_weights(self):
        return [self.weights[n] for n, (_, role) in self.file.tensors.items() if role == MATMUL]


@dataclass(eq=False)
class LoadedModel:
    name: str
    ws: WeightSet
    model: object
    cache: object
    ctx: int
    pinned: bool
    keep_alive: float
    host: "Host"
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.time)
    busy: int = 0
    requests: int = 0
    tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- the pool's view (manager.Tenant) -----------------------------------------------------
    def idle(self) -> bool:
        return self.busy == 0 and all(u.busy == 0 for u in self.ws.users)

    def expired(self, now: float) -> bool:
        return self.keep_alive >= 0 and now - self.last_used >= self.keep_alive

    def w16_bytes(self) -> int:
        # A shared weight set is demoted once, through its first user.
        return self.ws.w16_bytes() if self.ws.users and self.ws.users[0] is self else 0

    def footprint(self) -> int:
        ledger = self.host.ledger
        own = ledger.held(self.name)
        return own + (ledger.held(self.ws.tag) if self.ws.users == [self] else 0)

    def demote(self) -> int:
        return self.host.demote(self.name)

    def unload(self) -> int:
        self.host.events.append(f"evicted {self.name}")
        return self.host.unload(self.name)


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
        self.events: list[str] = []  # demotions, evictions, promotions, refusals: for status and tests

    # ---- load / unload ---------------------------------------------------------------------
    def load(self, name: str, path: str, opts: LoadOptions | None = None, progress=None) -> LoadedModel:
        opts = opts or LoadOptions()
        if not name or len(name) > 128 or any(c.isspace() for c in name):
            raise InvalidRequest(f"model name {name!r}: 1 to 128 characters, no spaces")
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
            if hasattr(backend, "alloc_scratch"):
                backend.alloc_scratch(mem)
        except BaseException:
            backend.free(*made)
            if hasattr(backend, "free_scratch"):
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
            with lm.lock:
                del self.models[name]
                be = lm.model.be
                be.free(lm.cache)
                if hasattr(be, "free_scratch"):
                    be.free_scratch(self.allocator.for_model(name))
                self.ledger.unreserve(name)
                ws = lm.ws
                ws.users.remove(lm)
                if not ws.users:
                    be.free(*ws.weights.values())
                    self.ledger.unreserve(ws.tag)
                    del self.weight_sets[ws.key]
            freed = before - self.ledger.held()
            self.promote_waiting()
            return freed

    def unload_all(self) -> None:
        for name in list(self.models):
            self.unload(name)

    # ---- demote / promote ------------------------------------------------------------------
    def demote(self, name: str) -> int:
        """Give back a model's f16 copy; it keeps serving through its quantized path."""
        with self.lock:
            ws = self.get(name).ws
            if not ws.w16_bytes():
                return 0
            freed = sum(ws.users[0].model.be.drop_w16(w) for w in ws.matmul_weights())
            self.ledger.unreserve(ws.tag, freed)
            ws.demoted = True
            self.events.append(f"demoted {name}")
            return freed

    def promote(self, name: str) -> int:
        """Build a model's f16 copy again if the pool can hold it; returns the bytes added (0 if not)."""
        with self.lock:
            lm = self.get(name)
            ws = lm.ws
            if ws.w16_bytes() or not lm.idle():
                return 0
            need = ws.plan.bytes["w16"] or 2 * ws.file.matmul_elems()
            if need > self.ledger.free():
                return 0
            self.ledger.reserve(ws.tag, need, f"promoting {name}")
            be = lm.model.be
            try:
                for w in ws.matmul_weights():
                    be.make_w16(w)
            except BaseException:
                for w in ws.matmul_weights():
                    be.drop_w16(w)
                self.ledger.unreserve(ws.tag, need)
                raise
            ws.demoted = False
            self.events.append(f"promoted {name}")
            return need

    def promote_waiting(self) -> list[str]:
        """Demoted models get their f16 copy back, most recently used first, while it fits."""
        done = []
        with self.lock:
            waiting = [ws.users[0] for ws in self.weight_sets.values() if ws.demoted and ws.users]
            for lm in sorted(waiting, key=lambda m: -max(u.last_used for u in m.ws.users)):
                if self.promote(lm.name):
                    done.append(lm.name)
        return done

    # ---- requests --------------------------------------------------------------------------
    def generate(self, name: str, prompt_ids, params: SamplingParams, on_piece=None,
                 should_stop=None) -> GenerationResult:
        lm = self.get(name)
        with lm.lock:
            if self.models.get(name) is not lm:
                raise NotFound(f"model {name!r} was unloaded")
            lm.busy += 1
            try:
                res = generate(lm.model, lm.ws.tokenizer, prompt_ids, params, lm.ctx, on_piece,
                               should_stop, cache=lm.cache)
            finally:
                lm.busy -= 1
                lm.last_used = time.monotonic()
            lm.requests += 1
            lm.tokens += len(res.token_ids)
        if lm.keep_alive == 0:
            self.unload(name)
        return res

    def get(self, name: str) -> LoadedModel:
        lm = self.models.get(name)
        if lm is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise NotFound(f"no model named {name!r} is loaded (loaded: {known})")
        return lm

    def set_pinned(self, name: str, pinned: bool) -> None:
        self.get(name).pinned = pinned

    def set_keep_alive(self, name: str, seconds: float) -> None:
        self.get(name).keep_alive = seconds

    def reap(self, now: float | None = None) -> list[str]:
        """Unload idle, unpinned models whose keep-alive has passed (call periodically)."""
        now = time.monotonic() if now is None else now
        gone = [t.name for t in manager.evictable(self._tenants(), now)]
        for name in gone:
            self.events.append(f"expired {name}")
            self.unload(name)
        return gone

    def _tenants(self):
        return list(self.models.values())

    # ---- accounting ------------------------------------------------------------------------
    def model_bytes(self, lm: LoadedModel) -> dict[str, int]:
        own, shared = self.ledger.by_kind(lm.name), self.ledger.by_kind(lm.ws.tag)
        return {"weights": shared["weights"], "w16": shared["w16"], "kv": own["kv"], "scratch": own["scratch"]}


def _file_key(path) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)
