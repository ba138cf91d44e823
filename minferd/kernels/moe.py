"""Launchers of moe.cu: an MoE layer's routing, its picks' layout and its weighted sum on the device.

`topk` is backend/moe.py's `route` (its CPU reference) without the trip to the host: each
token's k experts by the router's logits, in descending order (ties to the lower id), and
their softmax weights, renormalized over the k where `norm`. `align` is backend/moe.py's
`align` (its reference) on the device: the picks by expert in whole tiles of the grouped GEMM,
sized for the most rows any routing can take (`layout_rows`), so nothing comes back to size it.
`combine` adds each token's k expert outputs, weighted, to its residual. None synchronises, so
all can be captured.
"""
from __future__ import annotations

import numpy as np

from . import kernel

MAX_EXPERTS = 1024  # moe.cu keeps a token's logits in shared memory
MAX_K = 32
ALIGN_THREADS = 256  # moe.cu's


def _check_f32(a, what: str, ndim: int = 2):
    if a.dtype != np.float32 or a.ndim != ndim or not a.flags.c_contiguous:
        raise ValueError(f"moe: {what} must be C-contiguous float32 of {ndim} dims, got {a.dtype} {tuple(a.shape)}")


WARP_EXPERTS = 256  # moe_topk_warp's most experts (topk.cuh's 32 * TOPK_WARP_PER)


def topk(logits, k: int, norm: bool = True, warp: bool = False):
    """logits (n, E) f32 -> (ids (n * k,) int32, weights (n * k,) f32), token t's at t*k .. t*k+k-1.
    warp: one warp a token where E <= WARP_EXPERTS (moe_topk_warp: no barriers; the same picks,
    the weights a few ulp apart)."""
    import cupy as cp
    _check_f32(logits, "logits")
    n, E = logits.shape
    if not 1 <= E <= MAX_EXPERTS or not 1 <= k <= min(E, MAX_K):
        raise ValueError(f"moe: top {k} of {E} experts (at most {MAX_EXPERTS} experts and {MAX_K} picks, k <= E)")
    ids = cp.empty(n * k, cp.int32)
    wts = cp.empty(n * k, cp.float32)
    if n and warp and E <= WARP_EXPERTS:
        kernel("moe", "moe_topk_warp")(((n + 3) // 4,), (128,),
                                       (logits, np.int32(n), np.int32(E), np.int32(k), np.int32(bool(norm)), ids, wts))
    elif n:
        kernel("moe", "moe_topk")((n,), (128,), (logits, np.int32(E), np.int32(k), np.int32(bool(norm)), ids, wts))
    return ids, wts


def layout_rows(picks: int, n_expert: int, bm: int) -> int:
    """The most rows align's layout of `picks` over n_expert experts can take: each expert that has
    picks pads them to whole tiles of bm (at most bm - 1 rows more), rounded to a whole tile."""
    return -(-(picks + min(n_expert, picks) * (bm - 1)) // bm) * bm


def align(ids, n_expert: int, k: int, bm: int):
    """ids (n * k,) int32 on the device, each < n_expert (topk's) -> (rows (R,), tile_expert
    (R / bm,), pick_row (n * k,)), all int32, R = layout_rows(n * k, n_expert, bm): backend/moe.py's
    align(ids.reshape(n, k), n_expert, bm, R) without leaving the device."""
    import cupy as cp
    if ids.dtype != np.int32 or ids.ndim != 1 or not ids.flags.c_contiguous or ids.size % k:
        raise ValueError(f"moe: align takes C-contiguous int32 picks, {k} a token, got {ids.dtype} {tuple(ids.shape)}")
    if not 1 <= n_expert <= MAX_EXPERTS or not 1 <= k <= min(n_expert, MAX_K) or bm < 1:
        raise ValueError(f"moe: align of {k} picks a token over {n_expert} experts in tiles of {bm}")
    P = ids.size
    R = layout_rows(P, n_expert, bm)
    rows, tiles, pick_row = cp.empty(R, cp.int32), cp.empty(R // bm, cp.int32), cp.empty(P, cp.int32)
    if P:
        cnt = cp.empty(n_expert, cp.int32)
        kernel("moe", "moe_count")((n_expert,), (ALIGN_THREADS,), (ids, np.int32(P), cnt))
        kernel("moe", "moe_place")((n_expert,), (ALIGN_THREADS,),
                                   (ids, np.int32(P), np.int32(k), np.int32(n_expert), np.int32(bm), cnt,
                                    np.int32(R), rows, tiles, pick_row))
    return rows, tiles, pick_row


def combine(y, wts, k: int, residual=None):
    """out (n, H) = residual + sum over token t's k picks of wts[p] * y[p] (y (n * k, H) f32)."""
    import cupy as cp
    _check_f32(y, "y")
    P, H = y.shape
    if P % k or wts.shape != (P,) or wts.dtype != np.float32:
        raise ValueError(f"moe: {P} picks of {k} a token with {tuple(wts.shape)} {wts.dtype} weights")
    n = P // k
    if residual is not None:
        _check_f32(residual, "residual")
        if residual.shape != (n, H):
            raise ValueError(f"moe: residual {tuple(residual.shape)}, expected {(n, H)}")
    out = cp.empty((n, H), cp.float32)
    if n:
        kernel("moe", "moe_combine")((-(-n * H // 256),), (256,),
                                     (y, wts, np.int32(n), np.int32(k), np.int32(H),
                                      np.uint64(0 if residual is None else residual.data.ptr), out))
    return out
