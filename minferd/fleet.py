"""Several devices in one daemon: a Host (pool, ledger, allocator, model table) per device behind
one table of model names. A load is placed on one device; everything else about a model goes to
the device that holds it. A Fleet of one Host behaves as that Host.

Placement, in order: a device already holding the file (its weights are shared, only KV and
scratch are new), then one where the model gets its f16 copy, then one where it fits as planned,
the most free first; a device that refuses (admission could not make room there) passes the load
to the next, and a refusal names every device's numbers. `device` on a load pins it to one.

The fleet's own state is which names are being placed where (`_placing`), under `_lock` for
microseconds: a name is loaded on one device at most. Each Host keeps its own locks and books.
"""
from __future__ import annotations

import threading

from minferd import report
from minferd.config import DEFAULT_CTX
from minferd.errors import InvalidRequest, MinferdError, NotFound, excerpt
from minferd.host import Host, not_found
from minferd.host_load import LoadOptions
from minferd.loaded import LoadedModel
from minferd.model.loader import ModelFile, open_model_file
from minferd.model.source import ModelSource
from minferd.pool.estimator import estimate
from minferd.pool.ledger import PoolExhausted
from minferd.pool.planner import plan


class Fleet:
    def __init__(self, hosts: dict[str, Host]):
        if not hosts:
            raise ValueError("a fleet needs at least one device")
        self.hosts = dict(hosts)  # device name -> its host, in the order given
        self._placing: dict[str, str] = {}  # model name -> device its load runs on
        self._lock = threading.Lock()

    # ---- what callers read as if there were one host ----------------------------------------
    @property
    def devices(self) -> list[str]:
        return list(self.hosts)

    @property
    def first(self) -> Host:
        return next(iter(self.hosts.values()))

    @property
    def traits(self):
        return self.first.traits

    @property
    def default_parallel(self) -> int:
        return self.first.default_parallel

    @property
    def event_counts(self):
        total = {}
        for h in self.hosts.values():
            for k, n in h.event_counts.items():
                total[k] = total.get(k, 0) + n
        return total

    @property
    def retry_promotion(self) -> bool:
        return any(h.retry_promotion for h in self.hosts.values())

    @property
    def promote_in_background(self) -> bool:
        return self.first.promote_in_background

    @promote_in_background.setter
    def promote_in_background(self, on: bool) -> None:
        for h in self.hosts.values():
            h.promote_in_background = on

    def roomiest(self) -> Host:
        """The device with the most free bytes (where a listing of files works out their plans)."""
        return max(self.hosts.values(), key=lambda h: h.ledger.free())

    # ---- routing ---------------------------------------------------------------------------
    def host_of(self, name: str) -> Host:
        for h in self.hosts.values():
            if name in h.models:
                return h
        raise self._not_found(name)

    def device_of(self, name: str) -> str:
        host = self.host_of(name)
        return next(d for d, h in self.hosts.items() if h is host)

    def _not_found(self, name: str) -> NotFound:
        return not_found(name, [n for h in self.hosts.values() for n in h.models])

    def get(self, name: str) -> LoadedModel:
        return self.host_of(name).get(name)

    def has_model(self, name: str) -> bool:
        return any(h.has_model(name) for h in self.hosts.values())

    def stream(self, name: str, *args, **kw):
        return self.host_of(name).stream(name, *args, **kw)

    def generate(self, name: str, *args, **kw):
        return self.host_of(name).generate(name, *args, **kw)

    def unload(self, name: str, *args, **kw) -> int:
        try:
            return self.host_of(name).unload(name, *args, **kw)
        except NotFound:
            for h in self.hosts.values():  # a name still loading says so (Conflict) on its device
                if name in h._loading:
                    return h.unload(name, *args, **kw)
            raise

    def demote(self, name: str) -> int:
        return self.host_of(name).demote(name)

    def promote(self, name: str) -> int:
        return self.host_of(name).promote(name)

    def set_pinned(self, name: str, pinned: bool) -> None:
        self.host_of(name).set_pinned(name, pinned)

    def set_keep_alive(self, name: str, seconds: float) -> None:
        self.host_of(name).set_keep_alive(name, seconds)

    def model_info(self, lm: LoadedModel) -> dict:
        return self._on(self.host_of(lm.name).model_info(lm))

    def _on(self, m: dict) -> dict:
        # One file on two devices is two weight sets: the set's id says which device's it is.
        if len(self.hosts) > 1:
            m["weight_set"] = f"{m['weight_set']}@{m['device']}"
        return m

    def model_bytes(self, lm: LoadedModel) -> dict[str, int]:
        return self.host_of(lm.name).model_bytes(lm)

    def reap(self, now: float | None = None) -> list[str]:
        return [n for h in self.hosts.values() for n in h.reap(now)]

    def promote_waiting(self) -> list[str]:
        return [n for h in self.hosts.values() for n in h.promote_waiting()]

    def unload_all(self) -> None:
        for h in self.hosts.values():
            h.unload_all()

    def status(self) -> dict:
        per = {d: h.status() for d, h in self.hosts.items()}
        pools = [st["pool"] for st in per.values()]
        models = [self._on(m) for st in per.values() for m in st["models"]]
        events = [e for st in per.values() for e in st["events"]][-50:]
        return {"pool": report.pools_total(pools), "pools": pools, "models": models, "events": events}

    # ---- load: placement ---------------------------------------------------------------------
    def load(self, name: str, source, opts: LoadOptions | None = None, progress=None,
             device: str | None = None) -> LoadedModel:
        """Load `source` as `name` on `device`, or on the device placement picks. A name already
        loaded, or being loaded, goes to its device (a repeated load is a no-op there, a different
        one a Conflict)."""
        opts = opts or LoadOptions()
        if device is not None and device not in self.hosts:
            raise InvalidRequest(f"device {excerpt(device)}: this daemon has {', '.join(self.hosts)}")
        src = source if isinstance(source, ModelSource) else ModelSource.open(source)
        # Parsed once per file: a device holding it lends its parse (a suite loads one file under
        # many names; a real header parse is ~100 ms of the GIL). Owns src from here.
        mf = next(filter(None, (h.shared_file(src) for h in self.hosts.values())), None) or open_model_file(src)
        placed = False
        try:
            with self._lock:  # placement is a few estimates: decided here, so a name has one device
                where = self._placing.get(name) or next((d for d, h in self.hosts.items() if name in h.models), None)
                if where is None:
                    order = [device] if device else self._placement(mf, opts)
                    self._placing[name], placed = order[0], True
            if not placed:
                if device is not None and device != where:
                    raise InvalidRequest(f"model name {name!r} is on {where}; unload it first to load it on {device}")
                return self.hosts[where].load(name, mf, opts, progress)
            refusals = []
            for d in order:
                with self._lock:
                    self._placing[name] = d
                try:
                    return self.hosts[d].load(name, mf, opts, progress)
                except PoolExhausted as e:
                    refusals.append((d, e))
            if len(refusals) == 1:
                raise refusals[0][1]
            raise PoolExhausted(f"loading {name} on any of {', '.join(self.hosts)}", refusals[0][1].needed,
                                max(e.free for _, e in refusals), max(e.freeable for _, e in refusals),
                                "; ".join(f"{d}: {e}" for d, e in refusals))
        finally:
            if placed:
                with self._lock:
                    self._placing.pop(name, None)
            mf.close()

    def _placement(self, mf: ModelFile, opts: LoadOptions) -> list[str]:
        """Devices in the order a load tries them (the module docstring's)."""
        ctx = opts.ctx or min(mf.spec.ctx_train, DEFAULT_CTX)
        scored = []
        for i, (d, h) in enumerate(self.hosts.items()):
            free = h.ledger.free()
            shares = mf.identity in h.weight_sets
            try:
                kv = opts.kv_size(ctx, h.default_parallel)
                p = plan(estimate(mf, h.traits, ctx, kv), h.traits, free, opts.matmul_path, h.w16_min_bytes)
                w16, fits = p.matmul_path.value == "w16" and p.total <= free, p.total <= free
            except MinferdError:  # a bad ctx or size: the host's load says so in its own words
                w16 = fits = False
            scored.append(((shares, w16, fits, free, -i), d))
        return [d for _, d in sorted(scored, reverse=True)]

