"""Decode steps captured as CUDA graphs, one per batch-size bucket, and replayed per step."""
from __future__ import annotations

import logging

import cupy as cp
import numpy as np

from minferd.backend.base import KVCache
from minferd.backend.batch import Batch

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # a batch runs the graph of the next bucket up
log = logging.getLogger("minferd")


def decode_bucket(n: int) -> int:
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"a decode batch of {n} sequences: past the largest bucket {BUCKETS[-1]}")


class DecodeGraph:
    """One decode step of `bucket` sequences, captured once. Token ids, positions, slots, lengths
    and block tables live in one device buffer the step reads, so a replay costs one copy in
    and the logits out. Rows past the batch are padding: length 0, written to the cache's last
    block, which no sequence is given."""

    def __init__(self, be, model, cache: KVCache, bucket: int, width: int):
        self.be, self.model, self.cache, self.bucket, self.width = be, model, cache, bucket, width
        self.pad_slot = (cache.n_blocks - 1) * cache.block_size
        n = bucket
        self.host = np.zeros(4 * n + n * width, np.int32)
        with be.scope():  # the input buffer lives in the model's arena, like the graph's own memory
            self.buf = cp.zeros(self.host.size, cp.int32)
        dev = {name: self.buf[i * n:(i + 1) * n] for i, name in enumerate(("ids", "positions", "slots", "ctx_lens"))}
        dev["block_tables"] = self.buf[4 * n:].reshape(n, width)
        self.batch = Batch(np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32),
                           np.arange(n + 1, dtype=np.int32), np.zeros(n, np.int32), np.zeros((n, width), np.int32),
                           cache.block_size, dev)
        self.graph = None
        # Capture failed (a kernel that cannot be captured), or the model's pass reads results
        # on the host (its MoE routing): run the step as is.
        self.eager = not getattr(model, "graph_safe", True)
        self.pool = be.arena.graph_pool()  # the graph's buffers (and an eager step's, after a failed capture)

    def run(self, batch: Batch):
        be, n, B = self.be, self.bucket, batch.n_seqs
        h = self.host
        h[:] = 0
        h[0:B] = batch.ids
        h[n:n + B] = batch.positions
        h[2 * n:2 * n + n] = self.pad_slot
        h[2 * n:2 * n + B] = batch.slots
        h[3 * n:3 * n + B] = batch.ctx_lens
        tables = h[4 * n:].reshape(n, self.width)
        tables[:] = -1
        tables[:B] = batch.block_tables
        with be.scope(), cp.cuda.using_allocator(self.pool.malloc):
            self.buf.set(h, stream=be.stream)
            if self.graph is None and not self.eager:
                self._capture()
            if self.graph is None:
                return self.model.forward_batch(self.batch, self.cache)[:B]
            self.graph.launch(stream=be.stream)
        return self.logits[:B]

    def _capture(self):
        be = self.be
        try:
            be.stream.begin_capture()
            try:
                with be.capturing():
                    self.logits = self.model.forward_batch(self.batch, self.cache)
            finally:
                graph = be.stream.end_capture()
            self.graph = graph
        except Exception as e:  # noqa: BLE001 - logged, and the bucket runs without a graph
            log.warning("decode graph of %d sequences not captured (%s); running it eagerly", self.bucket, e)
            self.eager, self.graph, self.logits = True, None, None
