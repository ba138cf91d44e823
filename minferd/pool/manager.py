"""Admission: make room for a load in DESIGN.md's order, or refuse with the numbers.

The pool does not know what a model is: the host hands it tenants, objects that say whether
they are idle, pinned, expired and demotable, and that can demote or unload themselves.
"""
from __future__ import annotations

import time
from typing import Iterable, Protocol

from minferd.pool.ledger import Ledger, PoolExhausted


class Tenant(Protocol):
    name: str
    pinned: bool
    last_used: float

    def idle(self) -> bool: ...
    def expired(self, now: float) -> bool: ...
    def w16_bytes(self) -> int: ...  # what demote() would free (0 if it holds no f16 copy)
    def footprint(self) -> int: ...  # what unload() would free
    def demote(self) -> int: ...
    def unload(self) -> int: ...


def demotable(tenants: Iterable[Tenant]) -> list[Tenant]:
    """Idle, unpinned models holding an f16 copy, least recently used first."""
    return sorted((t for t in tenants if not t.pinned and t.idle() and t.w16_bytes()), key=lambda t: t.last_used)


def evictable(tenants: Iterable[Tenant], now: float) -> list[Tenant]:
    """Idle, unpinned models whose keep-alive has passed, least recently used first."""
    return sorted((t for t in tenants if not t.pinned and t.idle() and t.expired(now)), key=lambda t: t.last_used)


def freeable(tenants: Iterable[Tenant], now: float | None = None) -> int:
    tenants = list(tenants)
    now = time.monotonic() if now is None else now
    evict = evictable(tenants, now)
    return sum(t.w16_bytes() for t in demotable(tenants) if t not in evict) + sum(t.footprint() for t in evict)


def make_room(ledger: Ledger, needed: int, tenants: Iterable[Tenant], what: str,
              now: float | None = None) -> list[str]:
    """Free enough for `needed` more bytes: demote idle W16 models (LRU), then unload idle expired
    ones (LRU). Refuses with PoolExhausted, touching nothing, when even that would not suffice.
    Returns what it did, e.g. ["demoted a", "unloaded b"]."""
    tenants = list(tenants)
    now = time.monotonic() if now is None else now
    if needed <= ledger.free():
        return []
    can = freeable(tenants, now)
    if needed > ledger.free() + can:
        raise PoolExhausted(what, needed, ledger.free(), can)
    done = []
    for t in demotable(tenants):
        t.demote()
        done.append(f"demoted {t.name}")
        if needed <= ledger.free():
            return done
    for t in evictable(tenants, now):
        t.unload()
        done.append(f"unloaded {t.name}")
        if needed <= ledger.free():
            return done
    raise PoolExhausted(what, needed, ledger.free(), 0, "; ".join(done))
