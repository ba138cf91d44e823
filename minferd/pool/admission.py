"""Admission: what must give way for a load, in DESIGN.md's order, or a refusal with the numbers.

Pure: it reads a snapshot of the table (TenantView, plain values the host takes under its lock)
and returns a Decision; the host carries it out. Nothing here holds or calls a model or the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from minferd.pool.ledger import PoolExhausted


@dataclass(frozen=True, slots=True)
class TenantView:
    """One loaded model as admission sees it, at one moment."""

    name: str
    weight_set: str  # loads of one file share it (and its weights and f16 copy)
    pinned: bool
    idle: bool  # no request queued or running on any model of its weight set
    last_used: float  # monotonic seconds
    expires_at: float  # monotonic seconds when its keep-alive passes idle (inf: never)
    own_bytes: int  # kv + scratch: what unloading it frees
    set_bytes: int  # weights + f16 copy of its weight set: freed when its last user goes
    w16_bytes: int  # the weight set's f16 copy: what demoting frees


@dataclass(frozen=True, slots=True)
class Decision:
    demote: tuple[str, ...] = ()  # one model per weight set whose f16 copy goes
    unload: tuple[str, ...] = ()
    frees: int = 0

    def describe(self) -> str:
        return "; ".join([f"demote {n}" for n in self.demote] + [f"unload {n}" for n in self.unload])


def _sets(tenants) -> dict[str, list[TenantView]]:
    key = lambda t: t.weight_set  # noqa: E731
    return {k: list(g) for k, g in groupby(sorted(tenants, key=key), key)}


def demotable(tenants) -> list[TenantView]:
    """One model per weight set that holds an f16 copy and none of whose users is pinned or busy,
    least recently used set first."""
    out = []
    for users in _sets(tenants).values():
        if users[0].w16_bytes and all(u.idle and not u.pinned for u in users):
            out.append(max(users, key=lambda u: u.last_used))
    return sorted(out, key=lambda t: t.last_used)


def evictable(tenants, now: float) -> list[TenantView]:
    """Idle, unpinned models whose keep-alive has passed, least recently used first (the reaper's)."""
    return sorted((t for t in tenants if not t.pinned and t.idle and t.expires_at <= now),
                  key=lambda t: t.last_used)


def reclaimable(tenants, now: float) -> list[TenantView]:
    """What a load may unload for room: every idle, unpinned model, those whose keep-alive has
    passed first, then least recently used first. Keep-alive says how long an idle model stays
    when nobody needs its room (Ollama's scheduler); pinned models always stay."""
    return sorted((t for t in tenants if not t.pinned and t.idle),
                  key=lambda t: (t.expires_at > now, t.last_used))


def admit(needed: int, free: int, tenants, now: float, what: str) -> Decision:
    """The fewest demotions, then unloads, that leave `needed` bytes free; PoolExhausted (naming
    needed, free and everything that could be freed) when even all of them would not."""
    tenants = list(tenants)
    if needed <= free:
        return Decision()
    demote, unload, gain = [], [], 0
    demoted: set[str] = set()
    for t in demotable(tenants):
        if free + gain >= needed:
            break
        demote.append(t.name)
        demoted.add(t.weight_set)
        gain += t.w16_bytes
    left = {k: len(v) for k, v in _sets(tenants).items()}  # users not yet unloaded, per set
    for t in reclaimable(tenants, now):
        if free + gain >= needed:
            break
        unload.append(t.name)
        gain += t.own_bytes
        left[t.weight_set] -= 1
        if not left[t.weight_set]:  # its last user: the set's weights go too
            gain += t.set_bytes - (t.w16_bytes if t.weight_set in demoted else 0)
    if free + gain < needed:
        raise PoolExhausted(what, needed, free, gain)
    return Decision(tuple(demote), tuple(unload), gain)
