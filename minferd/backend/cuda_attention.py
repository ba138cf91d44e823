"""Attention on the CUDA backend, over one layer's f16 KV ring (slots keys, position p at p % slots).

Prefill: the flash kernel (attn_prefill.cu) for its head dims, else two cuBLAS products around a
masked softmax. Decode: split-K partials over the cache, merged by a kernel that also leaves the
result in the int8 format the next mat-vec reads.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from minferd.kernels import module
from minferd.kernels.attn_prefill import HEAD_DIMS as PREFILL_HEAD_DIMS, attn_prefill

DECODE_SPLITS = 32  # split-K partitions of the decode attention (a fixed grid keeps graphs valid)


def prefill(q, k, v, slots: int, first: int, window: int, scale: float, layer: int):
    """q (n, hq, d) f32 of positions first.. first + n - 1, whose keys are already in the ring."""
    n, hq, d = q.shape
    last = first + n - 1
    lo = max(0, last + 1 - slots)
    if slots < last + 1 and slots < window + n - 1:
        raise ValueError(f"layer {layer}: a ring of {slots} slots cannot serve {n} queries with window {window}")
    if d in PREFILL_HEAD_DIMS:
        out = cp.empty((n, hq * d), cp.float32)
        attn_prefill(q, k, v, out, first=first, lo=lo, window=window, scale=scale)
        return out
    # Other head dims: two cuBLAS products around a masked softmax.
    hkv = k.shape[1]
    key_pos = cp.arange(lo, last + 1, dtype=cp.int32)
    kf = k[key_pos % slots].astype(cp.float32)  # (L, hkv, d)
    vf = v[key_pos % slots].astype(cp.float32)
    g = hq // hkv
    # Scores in f32: q.k of real activations can pass f16's 65504.
    qg = (q * np.float32(scale)).reshape(n, hkv, g, d).transpose(1, 2, 0, 3).reshape(hkv, g * n, d)
    sc = cp.matmul(qg, kf.transpose(1, 2, 0))  # (hkv, g*n, L)
    L = sc.shape[-1]
    module("ops").get_function("masked_softmax_f32")((hkv * g * n,), (256,),
                                                     (sc, np.int32(n), np.int32(L), np.int32(first), np.int32(lo),
                                                      np.int32(window)))
    o = cp.matmul(sc, vf.transpose(1, 0, 2))  # (hkv, g*n, d)
    return o.reshape(hkv, g, n, d).transpose(2, 0, 1, 3).reshape(n, hq * d)


def decode(q, k, v, positions, slots: int, window: int, scale: float, int8_x_args):
    """q (1, hq, d) f32 at the device position `positions`; int8_x_args(out) -> the merge
    kernel's trailing arguments (where it writes out's int8 form)."""
    hq, d = q.shape[1], q.shape[2]
    if d % 32 or d > 256:
        raise ValueError(f"decode attention supports head dims that are multiples of 32 up to 256, not {d}")
    hkv = k.shape[1]
    part_o = cp.empty((DECODE_SPLITS, hq, d), cp.float32)
    part_ms = cp.empty((DECODE_SPLITS, hq, 2), cp.float32)
    ops = module("ops")
    ops.get_function("attn_decode_partial")(
        (DECODE_SPLITS, hq), (128,), (q, k, v, positions, np.int32(slots), np.int32(window), np.float32(scale),
                                      np.int32(hq), np.int32(hkv), np.int32(d), np.int32(DECODE_SPLITS), part_o, part_ms))
    out = cp.empty((1, hq * d), cp.float32)
    ops.get_function("attn_decode_merge")((hq,), (d,), (part_o, part_ms, out, np.int32(hq), np.int32(d),
                                                        np.int32(DECODE_SPLITS)) + int8_x_args(out))
    return out
