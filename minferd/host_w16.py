"""The f16 copies: demote (give one back), promote (build it again), and promotion of the weight
sets that wait for one when memory frees. Part of Host (its _lock, _admit and table).

A copy is dropped or built on the set's models' workers while every one of them is parked
between requests (call_exclusive): on CUDA a request on another model's stream could otherwise
still read memory the pool has handed to someone else. That wait happens outside both locks.
"""
from __future__ import annotations

from minferd.errors import Conflict, MinferdError


class W16Mixin:
    def demote(self, name: str) -> int:
        """Give back a model's f16 copy (shared by every load of its file); it keeps serving
        through its quantized path. Returns the bytes freed."""
        with self._lock:
            ws = self.get(name).ws
            if ws.changing:
                raise Conflict(f"{name}'s f16 copy is being built or dropped; try again")
            if not ws.w16_bytes():
                path = ws.current_path(self.traits, 0).value
                raise Conflict(f"{name} holds no f16 copy (it runs {path}): nothing to demote")
            ws.changing = True
            workers = [u.worker for u in ws.users]
        from minferd.worker import call_exclusive
        try:
            freed = call_exclusive(workers, lambda job: _drop_all(ws))
        finally:
            ws.changing = False
        self.ledger.unreserve(ws.tag, freed)
        ws.demoted = True
        self.event("demoted", name)
        self.allocator.trim()
        return freed

    def promote(self, name: str) -> int:
        """Build a model's f16 copy again; waits for requests in flight. Returns the bytes added
        (0 if it holds one already); PoolExhausted with the numbers if the pool cannot hold it."""
        with self._admit:  # the reservation competes with loads for the same free bytes
            with self._lock:
                ws = self.get(name).ws
                if ws.w16_bytes():
                    return 0
                if not ws.wants_w16() and not ws.demoted:
                    raise Conflict(f"{name} was planned {ws.plan.matmul_path.value}, not w16: nothing to promote")
                if ws.changing:
                    raise Conflict(f"{name}'s f16 copy is being built or dropped; try again")
                need = ws.plan.w16_bytes
                self.ledger.reserve(ws.tag, need, f"promoting {name}")
                ws.changing = True
                workers = [u.worker for u in ws.users]
        from minferd.worker import call_exclusive
        be = ws.backend

        def build(job):
            try:
                for w in ws.matmul_weights():
                    be.make_w16(w)
            except BaseException:
                _drop_all(ws)
                raise
            be.weights_changed()

        try:
            call_exclusive(workers, build)
        except BaseException:
            self.ledger.unreserve(ws.tag, need)
            raise
        finally:
            ws.changing = False
        ws.demoted = False
        self.event("promoted", name)
        return need

    def promote_waiting(self) -> list[str]:
        """Weight sets waiting for an f16 copy get it, most recently used first, while it fits.
        Called when memory frees (an unload); a busy set is left for the daemon's next tick
        (retry_promotion), never waited for here."""
        with self._lock:
            waiting = [ws for ws in self.weight_sets.values()
                       if ws.users and ws.waiting_for_w16() and not ws.changing]
            busy = [ws for ws in waiting if any(u.busy for u in ws.users)]
            self.retry_promotion = bool(busy)
            waiting = [ws for ws in waiting if ws not in busy]
            waiting.sort(key=lambda ws: -max(u.last_used for u in ws.users))
            names = [ws.users[0].name for ws in waiting]
            needs = [ws.plan.w16_bytes for ws in waiting]
        done = []
        for name, need in zip(names, needs):
            if need > self.ledger.free():
                continue
            try:
                if self.promote(name):
                    done.append(name)
            except MinferdError:
                pass  # unloaded, busy or outgrown since the snapshot: the next call tries again
        return done

    def _demote_idle(self, keep: tuple) -> list[str]:
        """Every idle, unpinned f16 copy but `keep`'s (the device ran out of memory under us)."""
        from minferd.pool import admission
        with self._lock:
            ws = self.weight_sets.get(keep)
            names = [t.name for t in admission.demotable(self._views(exclude=ws))]
        done = []
        for name in names:
            try:
                if self.demote(name):
                    done.append(name)
            except MinferdError:
                pass
        return done


def _drop_all(ws) -> int:
    """Drop a weight set's f16 copies (its users' workers held); the graphs that read them go too."""
    freed = sum(ws.backend.drop_w16(w) for w in ws.matmul_weights())
    ws.backend.weights_changed()
    return freed
