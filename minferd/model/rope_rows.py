"""A neox-rope model's q and k rows stored reordered, head by head, so that each rope pair is two
adjacent rows: row 2i takes row i, row 2i + 1 takes row i + d/2 (d the head's size). Run with
normal rope (pairs 2i, 2i + 1) the model computes the same products in another order of q's and
k's elements, and attention's dot products do not see the order: the logits agree to f32 rounding
(bench/results/s49/rope_pairs_check.py, the CPU model either way: 5e-5 of logits of 200).

Why: a decode step's q / k mat-vec holds adjacent rows in one warp group, so it can rotate them
and write K into the cache in its epilogue (kernels/mmvq_rope_kv.py), one graph node a layer fewer.
The backend that does so asks for the reorder (Backend.pairs_rope_rows); the loader applies it to
the file's bytes as they are uploaded, and build_model gives the model the normal-rope spec.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

_Q_K = re.compile(r"blk\.\d+\.attn_[qk]\.(weight|bias)")


def applies(spec) -> bool:
    """Whether the reorder keeps the model's results: neox rope, and no per-head norm of q and k
    (a head's norm weights would move with it, and the fused epilogue cannot norm a head)."""
    return spec.rope_type == "neox" and not spec.qk_norm and spec.head_dim % 2 == 0


def _order(spec, rows: int) -> np.ndarray:
    d = spec.head_dim
    within = np.empty(d, np.int64)
    within[0::2], within[1::2] = np.arange(d // 2), np.arange(d // 2) + d // 2
    return (np.arange(rows // d)[:, None] * d + within[None, :]).ravel()


def reordered(spec, name: str, raw: np.ndarray) -> np.ndarray:
    """The tensor's bytes (n_rows, row_bytes) with q's or k's output rows reordered (a bias's
    elements likewise); any other tensor as it is."""
    if not _Q_K.fullmatch(name):
        return raw
    rows = (spec.n_heads if ".attn_q." in name else spec.n_kv_heads) * spec.head_dim
    return np.ascontiguousarray(raw.reshape(rows, -1)[_order(spec, rows)]).reshape(raw.shape)


def as_reordered(spec):
    """The spec the model runs with once its rows are reordered: normal rope."""
    return dataclasses.replace(spec, rope_type="normal")
