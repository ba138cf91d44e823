"""A decode step captured once as a CUDA graph per (model, cache) and replayed per token."""
from __future__ import annotations

import cupy as cp
import numpy as np

from minferd.backend.base import KVCache


class DecodeGraph:
    """One decode step captured once: token id and position live in device buffers the step
    reads, so a replay needs only two tiny copies in and the logits out."""

    def __init__(self, be, model, cache: KVCache):
        self.be, self.model, self.cache = be, model, cache
        with be.scope():  # the input buffers live in the model's arena, like the graph's own
            self.tok = cp.zeros((1,), cp.int32)
            self.pos = cp.zeros((1,), cp.int32)
        self.graph = None
        self.keep = []

    def run(self, token: int):
        be, cache = self.be, self.cache
        host = np.array([token, cache.n_tokens], np.int32)
        with be.scope():
            self.tok.set(host[:1], stream=be.stream)
            self.pos.set(host[1:], stream=be.stream)
            if self.graph is None:
                self._capture()
            self.graph.launch(stream=be.stream)
        cache.n_tokens += 1
        return self.logits

    def _capture(self):
        be, model, cache = self.be, self.model, self.cache
        n_tokens = cache.n_tokens
        be.arena.recording = self.keep
        try:
            be.stream.begin_capture()
            try:
                self.logits = model.forward(self.tok, cache, positions=self.pos)
            finally:
                self.graph = be.stream.end_capture()
        finally:
            be.arena.recording = None
            cache.n_tokens = n_tokens  # capture only recorded the step; the launch runs it
