"""Decode run a step ahead: the rules for when a step's tokens may wait on the device.

Once every sequence of a step is decoding, the engine launches the next step with its token ids
read on the device from this step's sampler (Batch.ids_from), and only then reads this step's
tokens and sends them, so the GPU does not wait on the host between tokens (s32, H100, tg128
through the daemon: 0.5B 1099 -> 1316 tok/s, 7B 371 -> 405). A sequence whose token ends it (an
end-of-generation id, a stop string) is found a step late and that step's row is thrown away:
its K and V are its real last token's, past what it registers in the prefix cache. One that
ends by its length is not run past. New work, a stopped client or a job settles the step first.
"""
from __future__ import annotations

from dataclasses import dataclass

from minferd.backend.base import Sampled
from minferd.backend.batch import Batch
from minferd.config import valve
from minferd.engine.sequence import Status


def enabled(be) -> bool:
    """MINFERD_RUN_AHEAD (0 or 1) where set, else whether the backend gains by it."""
    ahead = valve("MINFERD_RUN_AHEAD")
    if ahead not in (None, "0", "1"):
        raise ValueError(f"MINFERD_RUN_AHEAD must be 0 or 1, got {ahead[:20]!r}")
    return bool(be.runs_ahead) if ahead is None else ahead == "1"


@dataclass(frozen=True, slots=True)
class AheadStep:
    """A decode step launched whose tokens are not read yet: its ready sequences, in its rows'
    order, and their sampled ids (on the device, and on their way to the host)."""
    seqs: list
    sampled: Sampled

    def next_batch(self, block_size: int, width: int) -> Batch:
        """The step after it (where `holds`): the same sequences, their ids read on the device."""
        batch = Batch.build([([0], s.n_computed, s.block_table) for s in self.seqs], block_size, width=width)
        batch.ids_from = self.sampled.ids
        return batch

    def read(self) -> tuple[list, Exception | None]:
        """Its tokens, or a None a row and the error where the sampler refused one."""
        try:
            return self.sampled.tokens(), None
        except Exception as e:  # noqa: BLE001 - the caller fails the step's sequences with it
            return [None] * len(self.seqs), e

    def discard(self) -> None:
        """Its tokens waited for (its host buffer is written until then) and dropped: a step failed."""
        for s in self.seqs:
            s.ahead = 0
        try:
            self.sampled.tokens()
        except Exception:  # noqa: BLE001 - already failing
            pass


def may_hold(scheduled, seqs) -> bool:
    """Whether a step's tokens may wait on the device for the next step: every row a decode of a
    running sequence that has sent a token already (a first token goes out at once), and none
    whose next token ends it by length."""
    return len(seqs) == len(scheduled) and all(
        n == 1 and s.n_generated and s.status is Status.RUNNING and not s.last_token_due() for s, n in scheduled)


def holds(step: AheadStep, scheduler, blocks) -> bool:
    """Whether the next step is `step`'s sequences again, one token each, as it was launched for:
    nothing new waits, none was ended or stopped, and their blocks can grow without a preemption."""
    return not scheduler.waiting and scheduler.running == step.seqs and not any(s.stopped() for s in step.seqs) \
        and sum(blocks.needed(s, 1) for s in step.seqs) <= len(blocks.free)
