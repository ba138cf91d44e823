"""Launchers of moe.cu: an MoE layer's routing and its weighted sum on the device.

`topk` is backend/moe.py's `route` (its CPU reference) without the trip to the host: each
token's k experts by the router's logits, in descending order (ties to the lower id), and
their softmax weights, renormalized over the k where `norm`. `combine` adds each token's k
expert outputs, weighted, to its residual. Neither synchronises, so both can be captured.
"""
from __future__ import annotations

import numpy as np

from . import kernel

MAX_EXPERTS = 1024  # moe.cu keeps a token's logits in shared memory
MAX_K = 32


def _check_f32(a, what: str, ndim: int = 2):
    if a.dtype != np.float32 or a.ndim != ndim or not a.flags.c_contiguous:
        raise ValueError(f"moe: {what} must be C-contiguous float32 of {ndim} dims, got {a.dtype} {tuple(a.shape)}")


def topk(logits, k: int, norm: bool = True):
    """logits (n, E) f32 -> (ids (n * k,) int32, weights (n * k,) f32), token t's at t*k .. t*k+k-1."""
    import cupy as cp
    _check_f32(logits, "logits")
    n, E = logits.shape
    if not 1 <= E <= MAX_EXPERTS or not 1 <= k <= min(E, MAX_K):
        raise ValueError(f"moe: top {k} of {E} experts (at most {MAX_EXPERTS} experts and {MAX_K} picks, k <= E)")
    ids = cp.empty(n * k, cp.int32)
    wts = cp.empty(n * k, cp.float32)
    if n:
        kernel("moe", "moe_topk")((n,), (128,), (logits, np.int32(E), np.int32(k), np.int32(bool(norm)), ids, wts))
    return ids, wts


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
