"""The mat-vec kernels' activation format in memory (xquant.cuh writes it): one scratch buffer of
int8 planes, then (d, sum) pairs a 32-element block. mmvq, attn_decode's fused output and the
norm a mat-vec leaves behind (mmvq_norm) all lay it out by xq_layout."""
from __future__ import annotations

import numpy as np


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def xq_layout(n: int, K: int) -> tuple[int, int, int]:
    """(xds offset, xds row stride in blocks, total bytes) of the scratch: xq int8 (n, 2, K)
    (hi and lo planes), then (d, sum) f32 pairs (n, kbp), kbp a multiple of 4 so rows stay
    32-byte aligned."""
    kbp = _round_up(K // 32, 4)
    off = _round_up(2 * n * K, 256)
    return off, kbp, off + n * kbp * 8


def scratch_bytes(n: int, K: int) -> int:
    return xq_layout(n, K)[2]


def check_scratch(scratch, n, K):
    need = scratch_bytes(n, K)
    if scratch.dtype != np.uint8 or not scratch.flags.c_contiguous or scratch.nbytes < need:
        raise ValueError(f"mmvq: scratch must be contiguous uint8 of >= {need} bytes, got {scratch.dtype} {scratch.nbytes}")
    if scratch.data.ptr % 256:
        raise ValueError("mmvq: scratch must be 256-aligned")
