"""A decode pass's weights asked of L2 a fixed distance ahead of the mat-vec that reads them.

Why: a decode token reads the same byte stream every time (each layer's q/k/v, o, gate/up and
down, then the output matrix), and its one-column mat-vecs wait on memory, not on issue: on the
H200 the 7B's gate/up reached ~58% of the copy ceiling where the 545 MB output matrix reached
~79% (bench/NOTES.md, s36-s38). Latency, not bandwidth: each CTA has one step of loads in flight
and a node's first wave starts cold. Here every launch's CTAs, as they start, ask L2 for the
bytes `distance` further down the stream (cp.async.bulk.prefetch: the copy engine's work, no
registers, no waiting; kernels/mmvq.cu l2_ahead), so the stream is read that far ahead of its
use by requests the SMs do not have to hold. (Session 18's weight_prefetch asked for a CTA's own
rows, one line a thread, before pdl_enter: it lost; this asks for later nodes' bytes.)

How: the first capture of a decode graph records its mat-vec launches' matrices in order
(`record`), `plan` maps each launch to its window [start + distance, end + distance) of that
stream (wrapping to the next token's first layers), cut at the matrices' edges into at most
mmvq.MAX_AHEAD pieces, and the captures after it pass them (`window`). A hint: no result changes.
MINFERD_L2_AHEAD=MB turns it on (bench/l2_ahead measures it); off by default until it wins.
"""
from __future__ import annotations

from minferd.config import valve
from minferd.kernels.mmvq import MAX_AHEAD


def distance_from_valve() -> int:
    """MINFERD_L2_AHEAD: megabytes of the weight stream to read ahead; unset or 0: off."""
    v = valve("MINFERD_L2_AHEAD")
    if v is None:
        return 0
    if not v.isdigit() or int(v) > 4096:
        raise ValueError(f"MINFERD_L2_AHEAD={v[:40]!r}: not a whole number of megabytes in 0..4096")
    return int(v) << 20


class AheadPlan:
    """One model's decode stream and each launch's prefetch window (keyed by the device pointer
    of the launch's first matrix: a decode pass reads each matrix in one launch)."""

    def __init__(self, distance: int):
        self.distance = distance
        self.order: list[list[tuple[int, int]]] = []
        self.windows: dict[int, tuple] = {}
        self.recording = False
        self.planned = False

    def window(self, mats) -> tuple:
        """A launch's matrices (device arrays) -> its (pointer, bytes) pieces; () before the plan."""
        if self.recording:
            self.order.append([(m.data.ptr, m.nbytes) for m in mats])
        return self.windows.get(mats[0].data.ptr, ())

    def plan(self) -> None:
        segs = [s for launch in self.order for s in launch]
        total = sum(n for _, n in segs)
        self.planned, self.recording = True, False
        if not total:
            return
        at = 0
        for launch in self.order:
            size = sum(n for _, n in launch)
            self.windows[launch[0][0]] = self._pieces(segs, total, at + self.distance, size)
            at += size

    @staticmethod
    def _pieces(segs, total: int, lo: int, size: int) -> tuple:
        """[lo, lo + size) of the stream (mod total) as pieces of its matrices, 16-byte aligned."""
        pieces, at, lo = [], 0, lo % total
        for _ in range(2):  # the window may wrap past the stream's end once
            for ptr, n in segs:
                a, b = max(lo, at), min(lo + size, at + n)
                if a < b:
                    p0, p1 = -(-(ptr + a - at) // 16) * 16, (ptr + b - at) // 16 * 16
                    if p1 > p0:
                        pieces.append((p0, p1 - p0))
                at += n
            lo, size, at = 0, max(0, lo + size - total), 0
            if not size:
                break
        return tuple(pieces[:MAX_AHEAD])
