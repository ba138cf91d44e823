"""The rmsnorm between two decode mat-vecs, folded into both (mmvq_norm.cuh says how; the pending
path deferred_norm): mmvq_group's `norm_out` makes the launch that writes x leave rmsnorm(x) * w
behind unscaled, its `norm_in` makes the launches that read it apply the scale. Here: the two as
data, and their kernel arguments, checked before a launch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .xq import check_scratch, xq_layout


@dataclass(frozen=True)
class NormIn:
    """x comes as x * w unscaled: its 32-element blocks' sums of squares of x, ss (n, kbp) f32
    (kbp: xq_layout's), and the norm's eps."""
    ss: object
    eps: float


@dataclass(frozen=True)
class NormOut:
    """What a launch writing x (n, rows) leaves for the norm with weight (rows,) f32: x * weight
    in the mat-vec format (scratch, xq_layout(n, rows)), ss (n, kbp) f32, and the blocks' counters
    (uint32, >= rows / 32, all zero between launches: kept for good, a graph holds them)."""
    weight: object
    scratch: object
    ss: object
    counters: object


def ss_shape(n: int, K: int) -> tuple[int, int]:
    return n, xq_layout(n, K)[1]


def _check_ss(ss, n: int, K: int) -> None:
    shape = ss_shape(n, K)
    if ss.dtype != np.float32 or ss.shape != shape or not ss.flags.c_contiguous:
        raise ValueError(f"mmvq: the norm's block sums must be C-contiguous float32 {shape}, got {ss.dtype} {tuple(ss.shape)}")


def in_args(norm: NormIn | None, n: int, K: int) -> tuple:
    """mmvq's (xss, eps)."""
    if norm is None:
        return np.uint64(0), np.float32(0.0)
    _check_ss(norm.ss, n, K)
    if not 0.0 < norm.eps < 1.0:
        raise ValueError(f"mmvq: the norm's eps must be in (0, 1), got {norm.eps}")
    return np.uint64(norm.ss.data.ptr), np.float32(norm.eps)


def out_args(norm: NormOut | None, n: int, rows: int, n_matrices: int) -> tuple:
    """mmvq's (ncnt, nw, nxq, nxds, nss, nkbp)."""
    if norm is None:
        return (np.uint64(0),) * 5 + (np.int32(0),)
    if n_matrices != 1 or rows % 32:
        raise ValueError(f"mmvq: a norm after the product needs one matrix of whole 32-row blocks, got {n_matrices} of {rows} rows")
    w, cnt = norm.weight, norm.counters
    if w.dtype != np.float32 or w.shape != (rows,) or not w.flags.c_contiguous:
        raise ValueError(f"mmvq: the norm's weight must be C-contiguous float32 ({rows},), got {w.dtype} {tuple(w.shape)}")
    if cnt.dtype != np.uint32 or cnt.ndim != 1 or cnt.size < rows // 32 or not cnt.flags.c_contiguous:
        raise ValueError(f"mmvq: the norm's counters must be contiguous uint32 of >= {rows // 32}, got {cnt.dtype} {cnt.size}")
    check_scratch(norm.scratch, n, rows)
    _check_ss(norm.ss, n, rows)
    off, kbp, _ = xq_layout(n, rows)
    p = norm.scratch.data.ptr
    return (np.uint64(cnt.data.ptr), np.uint64(w.data.ptr), np.uint64(p), np.uint64(p + off),
            np.uint64(norm.ss.data.ptr), np.int32(kbp))
