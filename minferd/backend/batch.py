"""One forward pass's input: the tokens of several sequences, laid end to end, and where each
sequence's keys live in a paged KV cache.

A sequence's token at position p has its K and V at slot `table[p // block_size] * block_size +
p % block_size` of every layer's cache. The engine builds a Batch per step from its scheduler's
choice; `Batch.solo` is one sequence over a private cache whose slots are its positions (the
`run` command, scoring, benchmarks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Batch:
    ids: np.ndarray  # (n,) int32: every sequence's new tokens, one sequence after another
    positions: np.ndarray  # (n,) int32
    slots: np.ndarray  # (n,) int32: the KV slot each new token is written to
    q_starts: np.ndarray  # (B + 1,) int32: sequence b's tokens are ids[q_starts[b]:q_starts[b + 1]]
    ctx_lens: np.ndarray  # (B,) int32: keys sequence b's last token sees (its position + 1)
    block_tables: np.ndarray  # (B, W) int32, -1 past a sequence's blocks
    block_size: int
    dev: dict = field(default_factory=dict)  # the backend's copies (CudaBackend.prepare)
    # A decode step run ahead (engine.py): its token ids are the step before's sampled ids, which are
    # on the device still (Sampled.ids); `ids` holds placeholders then.
    ids_from: object = None

    @classmethod
    def build(cls, seqs: list[tuple[list[int], int, list[int]]], block_size: int, width: int | None = None) -> Batch:
        """seqs: (new token ids, position of the first, block table) per sequence."""
        w = width or max(len(t) for _, _, t in seqs)
        tables = np.full((len(seqs), max(w, 1)), -1, np.int32)
        if all(len(toks) == 1 for toks, _, _ in seqs):  # a decode step: lists, then one array each
            for b, (_, _, table) in enumerate(seqs):  # (a short prompt's first token pays each NumPy call)
                tables[b, :len(table)] = table
            firsts = [first for _, first, _ in seqs]
            return cls(np.array([toks[0] for toks, _, _ in seqs], np.int32), np.array(firsts, np.int32),
                       np.array([t[p // block_size] * block_size + p % block_size for (_, p, t) in seqs], np.int32),
                       np.arange(len(seqs) + 1, dtype=np.int32), np.array(firsts, np.int32) + 1, tables, block_size)
        ids, pos, starts, lens = [], [], [0], []
        for b, (toks, first, table) in enumerate(seqs):
            ids.extend(toks)
            pos.append(np.arange(first, first + len(toks), dtype=np.int32))
            starts.append(starts[-1] + len(toks))
            lens.append(first + len(toks))
            tables[b, :len(table)] = table
        positions = np.concatenate(pos)
        seq_of = np.repeat(np.arange(len(seqs)), np.diff(starts))
        slots = tables[seq_of, positions // block_size] * block_size + positions % block_size
        return cls(np.asarray(ids, np.int32), positions, slots.astype(np.int32), np.asarray(starts, np.int32),
                   np.asarray(lens, np.int32), tables, block_size)

    @classmethod
    def solo(cls, ids, first: int, cache) -> Batch:
        """One sequence at positions first.. over a cache whose slot of position p is p."""
        return cls.build([(list(np.asarray(ids).tolist()), first, list(range(cache.n_blocks)))], cache.block_size)

    def as_rows(self) -> Batch:
        """The same tokens with each one its own row, as a decode batch: token i at position p
        sees keys 0..p through its sequence's block table (the tokens of this pass before it
        are written first, as in any pass), so a short prefill runs the decode graphs."""
        seq_of = np.repeat(np.arange(self.n_seqs), np.diff(self.q_starts))
        n = len(self.ids)
        return Batch(self.ids, self.positions, self.slots, np.arange(n + 1, dtype=np.int32),
                     (self.positions + 1).astype(np.int32), self.block_tables[seq_of], self.block_size)

    def chunk(self, a: int, b: int) -> Batch:
        """Tokens a..b-1 of a one-sequence batch as a batch of their own: a long prompt in pieces,
        each after the keys the pieces before it wrote."""
        return Batch(self.ids[a:b], self.positions[a:b], self.slots[a:b], np.array([0, b - a], np.int32),
                     np.array([self.positions[b - 1] + 1], np.int32), self.block_tables, self.block_size)

    @property
    def n_seqs(self) -> int:
        return len(self.ctx_lens)

    @property
    def is_decode(self) -> bool:
        """One new token per sequence: the shape a captured decode graph runs."""
        return len(self.ids) == self.n_seqs

    def last_rows(self) -> np.ndarray:
        return self.q_starts[1:] - 1

    def key_slots(self, b: int) -> np.ndarray:
        """Slots of sequence b's keys at positions 0 .. ctx_lens[b] - 1."""
        p = np.arange(self.ctx_lens[b], dtype=np.int64)
        return (self.block_tables[b, p // self.block_size].astype(np.int64) * self.block_size
                + p % self.block_size)
