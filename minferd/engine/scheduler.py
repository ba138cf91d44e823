"""Which sequences run in the next forward pass, and how many of their tokens.

Every step first gives each running sequence its tokens (one for a decoding sequence, a chunk of
its prompt for one still prefilling), oldest first, then admits waiting sequences while the
step's token budget and the free KV blocks allow. A sequence that needs a block when none is
free takes one from the newest running sequence, which is preempted: its blocks go back (the
full ones stay in the prefix cache) and it waits at the front of the queue to be recomputed.
So KV never runs out and a request that fits alone is never refused.
"""
from __future__ import annotations

from collections import deque

from minferd.engine.blocks import BlockManager
from minferd.engine.sequence import Sequence, Status


class Scheduler:
    def __init__(self, blocks: BlockManager, max_tokens: int, max_seqs: int):
        self.blocks, self.max_tokens, self.max_seqs = blocks, max_tokens, max_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens to run) pairs for one step, decoding sequences first."""
        budget, step = self.max_tokens, []
        for seq in sorted(self.running, key=lambda s: s.n_uncomputed > 1):  # stable: oldest first
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:
                continue  # preempted by an older one in this loop
            n = min(seq.n_uncomputed, budget)
            if not self._make_room(seq, n, step):
                continue
            self.blocks.grow(seq, n)
            step.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            plan = self.blocks.plan(seq, budget)
            if not plan.fits(len(self.blocks.free)):
                break
            self.waiting.popleft()
            self.blocks.admit(seq, plan)
            n = min(seq.n_uncomputed, budget)
            self.blocks.grow(seq, n)
            seq.status, seq.admitted = Status.RUNNING, True
            self.running.append(seq)
            step.append((seq, n))
            budget -= n
        return step

    def _make_room(self, seq: Sequence, n: int, step) -> bool:
        """Preempt the newest sequences not yet in this step until seq's n tokens fit; seq itself
        last (then it waits, and False)."""
        if self.blocks.can_grow(seq, n):  # the common case: no set built per sequence and step
            return True
        scheduled = {s.id for s, _ in step}
        while not self.blocks.can_grow(seq, n):
            victims = [s for s in self.running if s.id not in scheduled and s is not seq]
            self.preempt(victims[-1] if victims else seq)
            if not victims:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.n_computed = 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Take a finished (or cancelled) sequence out and give back its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
