"""Sampling a decode step's tokens on the device (kernels/sample.cu): each sequence's parameters
and penalty window go in, only the token ids come back (a 152k vocabulary's logits are 600 KB a
row). Rows the kernel does not cover (top_k off or past MAX_TOP_K, a whole-history penalty
window past MAX_WINDOW) are sampled on the host, by the sequence's own Sampler."""
from __future__ import annotations

import cupy as cp
import cupyx
import numpy as np

from minferd.backend.base import Sampled, reads_history
from minferd.kernels.sample import MAX_TOP_K, argmax, sample

MAX_WINDOW = 1024  # penalty ids per row the device takes; a longer repeat_last_n = -1 window goes to the host


def _window(seq) -> list[int]:
    p = seq.params
    if not reads_history(seq):
        return []
    return seq.tokens if p.repeat_last_n == -1 else seq.tokens[-p.repeat_last_n:]


def on_device(seq) -> bool:
    p = seq.params
    return (p.temperature == 0 or 0 < p.top_k <= MAX_TOP_K) and len(_window(seq)) <= MAX_WINDOW


def sample_on_device(logits, seqs, stream) -> Sampled:
    """Token ids of logits' rows (B, vocab), one per sequence (every seq must be on_device): left
    on the device for a step run ahead to read, and copied to pinned host memory behind them;
    tokens() waits for that copy alone."""
    with stream:
        out = launch(logits, seqs, stream)
        host = cupyx.empty_pinned(out.shape, np.int32)
        cp.asnumpy(out, stream=stream, out=host, blocking=False)
        done = stream.record()

    def tokens() -> list[int]:
        done.synchronize()
        return checked(host.tolist())
    return Sampled(out, tokens)


def checked(ids: list[int]) -> list[int]:
    if min(ids) < 0:
        raise ValueError("logits contain NaN or no finite maximum (the sampler refused a row)")
    return ids


def launch(logits, seqs, stream):
    """The sampling kernels of seqs' rows queued on stream (current); their ids' device array."""
    B = len(seqs)
    out = cp.empty(B, cp.int32)
    if all(s.params.temperature == 0 and not _window(s) for s in seqs):
        argmax(logits, out)
        return out
    windows = [_window(s) for s in seqs]
    hist = np.full((B, max(map(len, windows))), -1, np.int32)
    for b, w in enumerate(windows):
        hist[b, :len(w)] = w
    p = [s.params for s in seqs]
    # One uniform draw per sampled token from each sequence's own RNG, as Sampler does.
    u = [s.sampler.uniform() if s.params.temperature > 0 else 0.0 for s in seqs]
    f32 = lambda xs: cp.asarray(np.asarray(xs, np.float32))  # noqa: E731
    sample(cp.ascontiguousarray(logits), f32([x.temperature for x in p]),
           cp.asarray(np.asarray([x.top_k or 1 for x in p], np.int32)), f32([x.top_p for x in p]),
           f32([x.min_p for x in p]), f32([x.repeat_penalty for x in p]), cp.asarray(hist), f32(u), out)
    return out
