"""Launcher of attn_prefill.cu: causal (and sliding-window) GQA attention of a prefill chunk
against the f16 KV cache, scores never leaving registers. Enqueues one kernel on the current
stream; no allocation, no synchronisation. CPU reference: backend/cpu.py's attention."""
from __future__ import annotations

import functools
import math

import numpy as np

from . import kernel

BQ = 64  # queries per CTA
KEY_TILE = {32: 64, 64: 64, 96: 64, 128: 64, 256: 32}  # head dim -> keys per shared tile
HEAD_DIMS = tuple(KEY_TILE)
_ROW_PAD = 8


def _name(d: int, paged: bool = False) -> str:
    return f"attn_prefill<{d}, {KEY_TILE[d]}, {'true' if paged else 'false'}>"


def names() -> tuple[str, ...]:
    return tuple(_name(d, paged) for d in HEAD_DIMS for paged in (False, True))


def smem_bytes(d: int) -> int:
    return (BQ + 2 * KEY_TILE[d]) * (d + _ROW_PAD) * 2


@functools.lru_cache(maxsize=None)
def _fn(d: int, paged: bool = False):
    return kernel("attn_prefill", _name(d, paged), names(), smem_bytes(d))  # past 48 KB for d >= 128


def _check(q, K, V, out) -> None:
    n, hq, d = q.shape
    hkv = K.shape[1]
    if d not in KEY_TILE:
        raise ValueError(f"attn_prefill: head dim {d}, supported {HEAD_DIMS}")
    if q.dtype != np.float32 or not q.flags.c_contiguous:
        raise ValueError(f"attn_prefill: q must be C-contiguous float32, got {q.dtype}")
    if K.dtype != np.float16 or V.dtype != np.float16 or K.shape != V.shape or K.shape[2] != d \
            or not (K.flags.c_contiguous and V.flags.c_contiguous):
        raise ValueError(f"attn_prefill: K, V must be C-contiguous float16 (slots, hkv, {d}), got {K.shape} {V.shape}")
    if hq % hkv:
        raise ValueError(f"attn_prefill: {hq} query heads over {hkv} kv heads")
    if out.dtype != np.float32 or out.shape != (n, hq * d) or not out.flags.c_contiguous:
        raise ValueError(f"attn_prefill: out must be C-contiguous float32 {(n, hq * d)}")


def _sinks_ptr(sinks, hq: int) -> np.uint64:
    """sinks: None, or (hq,) f32 on the device: a logit per query head in its softmax's denominator."""
    if sinks is None:
        return np.uint64(0)
    if sinks.dtype != np.float32 or sinks.shape != (hq,) or not sinks.flags.c_contiguous:
        raise ValueError(f"attention sinks must be C-contiguous float32 ({hq},), got {sinks.dtype} {tuple(sinks.shape)}")
    return np.uint64(sinks.data.ptr)


def attn_prefill(q, K, V, out, *, first: int, lo: int, window: int, scale: float, sinks=None) -> None:
    """out (n, hq * d) f32 = attention of q (n, hq, d) f32 at positions first..first+n-1 over the
    cached keys lo..first+n-1 (slot p % slots of K, V: (slots, hkv, d) f16); window 0 = none;
    sinks (hq,) f32: gpt-oss's extra logit per head (see _sinks_ptr)."""
    _check(q, K, V, out)
    n, hq, d = q.shape
    slots, hkv = K.shape[0], K.shape[1]
    if not 0 <= lo <= first or first + n - lo > slots:
        raise ValueError(f"attn_prefill: keys {lo}..{first + n - 1} do not fit a ring of {slots} slots")
    qscale = np.float32(scale * math.log2(math.e))  # the kernel takes exp2
    _fn(d)(((n + BQ - 1) // BQ, hq), (128,),
           (q, K, V, out, np.int32(n), np.int32(hq), np.int32(hkv), np.int32(slots), np.int32(first),
            np.int32(lo), np.int32(window), qscale, np.uint64(0), np.int32(0), np.uint64(0), _sinks_ptr(sinks, hq)),
           shared_mem=smem_bytes(d))


def attn_prefill_paged(q, K, V, out, table, dims, *, block_size: int, window: int, scale: float, sinks=None) -> None:
    """out (n, hq * d) f32 = attention of one sequence's queries q (n, hq, d) f32 over its keys
    through `table` (int32 block ids; K, V: (blocks * block_size, hkv, d) f16), with first and the
    number of real queries read from the device: dims (int32) = [first, count]. Rows from count
    to n are zeros. A captured graph replays it for other prompts; the caller keeps count <= n
    and first + count <= len(table) * block_size (the host cannot check values on the device)."""
    _check(q, K, V, out)
    n, hq, d = q.shape
    if table.dtype != np.int32 or table.ndim != 1 or not table.flags.c_contiguous:
        raise ValueError(f"attn_prefill_paged: table must be a C-contiguous int32 vector, got {table.dtype} {table.shape}")
    if dims.dtype != np.int32 or dims.size < 2:
        raise ValueError(f"attn_prefill_paged: dims must be int32 [first, count], got {dims.dtype} {dims.shape}")
    if block_size < 1 or K.shape[0] % block_size:
        raise ValueError(f"attn_prefill_paged: {K.shape[0]} slots are not whole blocks of {block_size}")
    qscale = np.float32(scale * math.log2(math.e))
    _fn(d, True)(((n + BQ - 1) // BQ, hq), (128,),
                 (q, K, V, out, np.int32(n), np.int32(hq), np.int32(K.shape[1]), np.int32(K.shape[0]), np.int32(0),
                  np.int32(0), np.int32(window), qscale, table, np.int32(block_size), dims, _sinks_ptr(sinks, hq)),
                 shared_mem=smem_bytes(d))
