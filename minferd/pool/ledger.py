"""The ledger: the one record of who holds and who has been promised which bytes.

Every allocation is tagged (model, kind). A model's reservation is the estimate admission
granted it; its allocations may grow past the reservation only while the pool stays within
capacity. committed = sum over models of max(reserved, held) is what admission checks and
what `free` reports against.
"""
from __future__ import annotations

import threading
from collections import defaultdict

from minferd.errors import MinferdError
from minferd.units import fmt_bytes

KINDS = ("weights", "w16", "kv", "scratch")


class PoolExhausted(MinferdError):
    """The pool cannot hold this: carries the numbers a person needs to act."""

    def __init__(self, what: str, needed: int, free: int, freeable: int = 0, detail: str = ""):
        self.needed, self.free, self.freeable = needed, free, freeable
        msg = (f"{what}: needs {fmt_bytes(needed)} ({needed} bytes), {fmt_bytes(max(free, 0))} free, "
               f"{fmt_bytes(freeable)} could be freed by demoting or unloading idle models")
        super().__init__(msg + (f"; {detail}" if detail else ""))


class DeviceOutOfMemory(PoolExhausted):
    """The device refused although the ledger allowed: another process took memory."""


class LedgerView:
    """The ledger's figures at one moment (a snapshot, or the live ledger under its lock)."""

    def __init__(self, capacity: int, held: dict, reserved: dict):
        self.capacity = capacity
        self._held, self._reserved = held, reserved

    def held(self, model: str | None = None, kind: str | None = None) -> int:
        models = [model] if model is not None else list(self._held)
        return sum(v for m in models if m in self._held
                   for k, v in self._held[m].items() if kind is None or k == kind)

    def by_kind(self, model: str) -> dict[str, int]:
        return dict(self._held[model]) if model in self._held else dict.fromkeys(KINDS, 0)

    def reserved(self, model: str | None = None) -> int:
        if model is not None:
            return self._reserved.get(model, 0)
        return sum(self._reserved.values())

    def committed_of(self, model: str) -> int:
        """What the model counts against capacity: its reservation, or what it holds if more."""
        return max(self._reserved.get(model, 0), self.held(model))

    def committed(self) -> int:
        return sum(self.committed_of(m) for m in set(self._held) | set(self._reserved))

    def free(self) -> int:
        return self.capacity - self.committed()

    def models(self) -> list[str]:
        return sorted(m for m in set(self._held) | set(self._reserved) if self.committed_of(m))


def _locked(method):
    def read(self, *args, **kw):
        with self.lock:
            return method(self, *args, **kw)
    read.__name__, read.__doc__ = method.__name__, method.__doc__
    return read


class Ledger(LedgerView):
    def __init__(self, capacity: int):
        super().__init__(capacity, defaultdict(lambda: dict.fromkeys(KINDS, 0)), {})
        self.lock = threading.RLock()

    # ---- reading: the view's figures, each under the lock; snapshot() for several at once ---------
    held = _locked(LedgerView.held)
    by_kind = _locked(LedgerView.by_kind)
    reserved = _locked(LedgerView.reserved)
    committed_of = _locked(LedgerView.committed_of)
    committed = _locked(LedgerView.committed)
    free = _locked(LedgerView.free)
    models = _locked(LedgerView.models)

    def snapshot(self) -> LedgerView:
        with self.lock:
            return LedgerView(self.capacity, {m: dict(k) for m, k in self._held.items()}, dict(self._reserved))

    # ---- reservations ----------------------------------------------------------------------
    def reserve(self, model: str, nbytes: int, what: str = "") -> None:
        """Promise `nbytes` more to model, or raise PoolExhausted and change nothing."""
        with self.lock:
            new = self._reserved.get(model, 0) + nbytes
            grow = max(new, self.held(model)) - self.committed_of(model)
            if grow > self.free():
                raise PoolExhausted(what or f"reserving for {model}", grow, self.free())
            self._reserved[model] = new

    def unreserve(self, model: str, nbytes: int | None = None) -> None:
        with self.lock:
            left = 0 if nbytes is None else max(self._reserved.get(model, 0) - nbytes, 0)
            if left:
                self._reserved[model] = left
            else:
                self._reserved.pop(model, None)

    # ---- allocations (called by the allocator only) -------------------------------------------
    def charge(self, model: str, kind: str, nbytes: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
        with self.lock:
            held = self.held(model)
            res = self._reserved.get(model, 0)
            grow = max(res, held + nbytes) - max(res, held)
            if grow > self.free():
                raise PoolExhausted(f"allocating {kind} for {model}", nbytes, self.free())
            self._held[model][kind] += nbytes

    def credit(self, model: str, kind: str, nbytes: int) -> None:
        with self.lock:
            self._held[model][kind] -= nbytes
            assert self._held[model][kind] >= 0, (model, kind)
            if not any(self._held[model].values()):
                del self._held[model]
