"""Decode steps captured as CUDA graphs, one per batch-size bucket, and replayed per step."""
from __future__ import annotations

import logging

import cupy as cp
import numpy as np

from minferd.backend.base import KVCache
from minferd.backend.batch import Batch
from minferd.devices import PREFILL_GRAPH_TOKENS

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # a batch runs the graph of the next bucket up
log = logging.getLogger("minferd")


def decode_bucket(n: int) -> int:
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"a decode batch of {n} sequences: past the largest bucket {BUCKETS[-1]}")


def capture(g):
    """A DecodeGraph's or PrefillGraph's pass of its model over its batch and cache (`bucket`
    rows), recorded on the backend's stream as a CUDA graph: (the graph, its output)."""
    be = g.be
    be.stream.begin_capture()
    try:
        with be.capturing(g.bucket):
            out = g.model.forward_batch(g.batch, g.cache)
    finally:
        graph = be.stream.end_capture()
    return graph, out


class DecodeGraph:
    """One decode step of `bucket` sequences, captured once. Token ids, positions, slots, lengths
    and block tables live in one device buffer the step reads, so a replay costs one copy in
    and the logits out. Rows past the batch are padding: length 0, written to the cache's last
    block, which no sequence is given."""

    def __init__(self, be, model, cache: KVCache, bucket: int, width: int, one_row: bool = False):
        self.be, self.model, self.cache, self.bucket, self.width = be, model, cache, bucket, width
        self.pad_slot = (cache.n_blocks - 1) * cache.block_size
        n = bucket
        # one_row: a prompt's tokens as rows (Batch.as_rows), whose last row alone needs logits:
        # the output matmul reads its vocabulary-wide matrix for that row only (a mat-vec).
        self.one_row = one_row
        self.host = np.zeros(4 * n + n * width + 1, np.int32)
        with be.scope():  # the input buffer lives in the model's arena, like the graph's own memory
            self.buf = cp.zeros(self.host.size, cp.int32)
        dev = {name: self.buf[i * n:(i + 1) * n] for i, name in enumerate(("ids", "positions", "slots", "ctx_lens"))}
        dev["block_tables"] = self.buf[4 * n:4 * n + n * width].reshape(n, width)
        if one_row:
            dev["logit_rows"] = self.buf[-1:]
        self.batch = Batch(np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32),
                           np.arange(n + 1, dtype=np.int32), np.zeros(n, np.int32), np.zeros((n, width), np.int32),
                           cache.block_size, dev)
        self.graph = None
        # Capture failed (a kernel that cannot be captured), or the model's pass reads results
        # on the host (its MoE routing): run the step as is.
        self.eager = not be.graph_safe(model, bucket)
        self.pool = be.arena.graph_pool()  # the graph's buffers (and an eager step's, after a failed capture)

    def run(self, batch: Batch):
        """The batch's logits: (B, vocab), or a one_row graph's (1, vocab) of its last row."""
        be, n, B = self.be, self.bucket, batch.n_seqs
        h = self.host
        h[:] = 0
        h[-1] = B - 1
        h[0:B] = batch.ids
        h[n:n + B] = batch.positions
        h[2 * n:2 * n + n] = self.pad_slot
        h[2 * n:2 * n + B] = batch.slots
        h[3 * n:3 * n + B] = batch.ctx_lens
        tables = h[4 * n:4 * n + n * self.width].reshape(n, self.width)
        tables[:] = -1
        tables[:B] = batch.block_tables
        with be.scope(), cp.cuda.using_allocator(self.pool.malloc):
            self.buf.set(h, stream=be.stream)
            if batch.ids_from is not None:  # a step run ahead: the ids the step before sampled, on the device
                self.buf.data.copy_from_device_async(batch.ids_from.data, 4 * B, be.stream)
            if self.graph is None and not self.eager:
                self._capture()
            if self.graph is None:
                return self.model.forward_batch(self.batch, self.cache)[:1 if self.one_row else B]
            self.graph.launch(stream=be.stream)
        return self.logits[:1 if self.one_row else B]

    def _capture(self):
        try:
            self.graph, self.logits = capture(self)
        except Exception as e:  # noqa: BLE001 - logged, and the bucket runs without a graph
            log.warning("decode graph of %d sequences not captured (%s); running it eagerly", self.bucket, e)
            self.eager, self.graph, self.logits = True, None, None


# One sequence's prefill step past the decode graphs' rows, padded up (devices.py's estimate counts
# the largest).
PREFILL_BUCKETS = (512, PREFILL_GRAPH_TOKENS)


def prefill_bucket(n: int) -> int | None:
    return next((b for b in PREFILL_BUCKETS if n <= b), None)


class PrefillGraph:
    """A prefill step of one sequence (`bucket` tokens at most, at any first position: a prefix
    hit's rest too), captured once. Ids, positions and slots (padding rows: the cache's last
    block), the block table and [first, count, last row] live in one device buffer; attention
    reads its keys through the table (attn_prefill's PAGED kernel), and only the last real
    token's logits are made. The prefill graphs of a model share one memory pool: they never
    run at once, and a replay's inputs are set and its logits copied out around its own launch."""

    def __init__(self, be, model, cache: KVCache, bucket: int, width: int, pool):
        self.be, self.model, self.cache, self.bucket, self.width, self.pool = be, model, cache, bucket, width, pool
        self.pad_slot = (cache.n_blocks - 1) * cache.block_size
        n = bucket
        self.host = np.zeros(3 * n + width + 3, np.int32)
        with be.scope():
            self.buf = cp.zeros(self.host.size, cp.int32)
        dev = {name: self.buf[i * n:(i + 1) * n] for i, name in enumerate(("ids", "positions", "slots"))}
        dev["block_tables"] = self.buf[3 * n:3 * n + width].reshape(1, width)
        dev["prefill_dims"] = self.buf[3 * n + width:3 * n + width + 2]
        dev["last_rows"] = self.buf[3 * n + width + 2:]
        # The host arrays say only the shape: n tokens of one sequence (is_decode False).
        self.batch = Batch(np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32),
                           np.array([0, n], np.int32), np.array([n], np.int32), np.zeros((1, width), np.int32),
                           cache.block_size, dev)
        self.graph, self.logits, self.eager = None, None, False

    def run(self, batch: Batch):
        """Logits (1, vocab) of the batch's last token: a copy, so the next replay of any prefill
        graph (which may reuse this one's memory) cannot change them."""
        be, n, count = self.be, self.bucket, len(batch.ids)
        h = self.host
        h[:] = 0
        h[0:count] = batch.ids
        h[n:n + count] = batch.positions
        h[2 * n:3 * n] = self.pad_slot
        h[2 * n:2 * n + count] = batch.slots
        h[3 * n:3 * n + self.width] = -1
        h[3 * n:3 * n + batch.block_tables.shape[1]] = batch.block_tables[0]
        h[3 * n + self.width:] = (batch.positions[0], count, count - 1)
        if not self.eager:
            with be.scope(), cp.cuda.using_allocator(self.pool.malloc):
                self.buf.set(h, stream=be.stream)
                if self.graph is not None or self._capture():
                    self.graph.launch(stream=be.stream)
            if self.graph is not None:
                with be.scope():
                    return self.logits.copy()
        return self.model.forward_batch(batch, self.cache)

    def _capture(self) -> bool:
        try:
            self.graph, self.logits = capture(self)
            return True
        except Exception as e:  # noqa: BLE001 - logged, and this bucket runs eagerly from now on
            log.warning("prefill graph of %d tokens not captured (%s); running it eagerly", self.bucket, e)
            self.eager = True
            return False
