"""Loading a model: reserve (the name, admission's decisions carried out, the bytes) under the
host's locks, open and upload without them, commit under the table lock; rolled back on any
failure. Part of Host (minferd/host.py says which lock guards what)."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass

from minferd.config import DEFAULT_CTX, DEFAULT_KEEP_ALIVE, KV_BLOCK_TOKENS, MAX_NAME_CHARS, MAX_RUNNING_SEQS
from minferd.devices import MatmulPath
from minferd.errors import Conflict, InvalidRequest, MinferdError, excerpt
from minferd.loaded import LoadedModel, WeightSet
from minferd.model.loader import ModelFile, build_model, check_backend, open_model_file, upload_weights
from minferd.model.source import ModelSource
from minferd.pool import admission
from minferd.pool.admission import TenantView
from minferd.pool.estimator import estimate, kv_blocks
from minferd.pool.ledger import DeviceOutOfMemory
from minferd.pool.planner import Plan, plan

log = logging.getLogger("minferd")


@dataclass(slots=True)
class LoadOptions:
    matmul_path: MatmulPath | None = None  # None: the planner decides
    ctx: int | None = None  # None: min(the model's training context, DEFAULT_CTX)
    pinned: bool = False
    keep_alive: float = DEFAULT_KEEP_ALIVE
    parallel: int | None = None  # KV for this many full contexts; None: the host's default
    kv_tokens: int | None = None  # KV positions for all sequences together (wins over parallel)

    def kv_size(self, ctx: int, default_parallel: int) -> int:
        n = self.kv_tokens or (self.parallel or default_parallel) * ctx
        if n < ctx:
            raise InvalidRequest(f"kv_tokens {n} is below the context of {ctx}: one full request must fit")
        if n > ctx * MAX_RUNNING_SEQS:
            raise InvalidRequest(f"kv_tokens {n} is past {MAX_RUNNING_SEQS} contexts of {ctx} "
                                 f"(at most {MAX_RUNNING_SEQS} sequences run at once)")
        return n


def check_name(name: str) -> None:
    # Control and invisible characters (not isprintable) made names that status tables, logs
    # and metric labels show wrongly or not at all; they are refused like spaces.
    if not name or len(name) > MAX_NAME_CHARS or any(c.isspace() or not c.isprintable() for c in name):
        raise InvalidRequest(f"model name {excerpt(name)}: 1 to {MAX_NAME_CHARS} printable characters, no spaces")


class LoadMixin:
    # ---- load ----------------------------------------------------------------------------------
    def load(self, name: str, source, opts: LoadOptions | None = None, progress=None) -> LoadedModel:
        """Load `source` (a path, or an opened file from minferd.paths) as `name`: reserve, upload,
        commit. Refused (typed, nothing changed) when the name is taken or the pool cannot hold it."""
        opts = opts or LoadOptions()
        mf = self._open(source)
        owned = mf is not source  # a checked ModelFile given (the fleet's) is its caller's to close
        try:
            check_name(name)
            check_backend(mf, self.traits.kind)
            ctx = opts.ctx or min(mf.spec.ctx_train, DEFAULT_CTX)
            if not 1 <= ctx <= mf.spec.ctx_train:
                raise InvalidRequest(f"ctx {ctx} is outside [1, {mf.spec.ctx_train}] (the model's training context)")
            opts = dataclasses.replace(opts, kv_tokens=opts.kv_size(ctx, self.default_parallel))
            try:
                return self._load(name, mf, ctx, opts, progress)
            except DeviceOutOfMemory:
                # The device refused what the ledger allowed (another process took memory): treat
                # it as pressure. Give back idle f16 copies and try once more, else refuse.
                if not self._demote_idle(keep=mf.identity):
                    raise
                return self._load(name, mf, ctx, opts, progress)
        finally:
            if owned:
                mf.close()  # what the model needs is on the device now, or nothing is

    def _open(self, source) -> ModelFile:
        """The checked file: a loaded one's parse (same descriptor identity: the same bytes) over
        this source, else parsed now. A test suite loads one file under many names. The source
        stays open: the loaded set may go before this load reserves, and then this load uploads."""
        if isinstance(source, ModelFile):
            return source
        src = source if isinstance(source, ModelSource) else ModelSource.open(source)
        return self.shared_file(src) or open_model_file(src)  # closes the source itself when it refuses the file

    def shared_file(self, src: ModelSource) -> ModelFile | None:
        """A loaded file's parse over `src` where this host holds the same file (no header parse)."""
        with self._lock:
            ws = self.weight_sets.get(src.identity)
            if ws is not None and ws.ready.is_set() and ws.users:
                return ws.file.with_source(src)
        return None

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
                    if lm.ws.key == key and lm.ctx == ctx and lm.kv_tokens == opts.kv_tokens:
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
                est = estimate(mf, self.traits, ctx, opts.kv_tokens)
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
                elif not ws.tokenizer.has_chat_template:  # a base model: its chats may read oddly
                    log.warning("%s carries no chat template: Chat renders the %s architecture's default",
                                ws.file.path.name, ws.file.spec.arch)
                ws.backend = backend  # frees the weights once the set's last user goes
                ws.weights = upload_weights(ws.file, backend, self.allocator.for_model(ws.tag), p.matmul_path,
                                            progress)
            model = build_model(ws.file, backend, ws.weights)
            made.append(model.new_cache(mem, kv_blocks(opts.kv_tokens) * KV_BLOCK_TOKENS))
            backend.alloc_scratch(mem, p.bytes["scratch"])
        except BaseException:
            backend.free(*made)
            backend.free_scratch(mem)
            backend.close()
            raise
        return LoadedModel(name, ws, model, made[0], ctx, opts.pinned, opts.keep_alive, kv_tokens=opts.kv_tokens)

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
