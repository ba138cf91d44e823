"""Launchers of dequant.cu: GGUF rows -> f16 (the W16 cache) or gathered f32/f16 rows (embedding).

Every element equals gguf.quants.dequantize's f32 value (blocks.cuh decodes in ggml's
operation order, products rounded one at a time), rounded once to f16 for f16 outputs.
The launchers check arguments on the host and then only enqueue one kernel on the current
(or given) stream: no allocation, no synchronisation, no device reads, so they are safe
inside CUDA graph capture. CPU reference: dequant_ref.py.
"""
from __future__ import annotations

import contextlib
import functools
import math

import numpy as np

from . import kernel
from .quant import CUDA_TYPES, TYPES, QuantType, by_name, row_bytes

_THREADS = 256


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def block_align(qt: QuantType) -> int:
    """Alignment every block of a 16-aligned tensor has (block g at g * block_bytes)."""
    return math.gcd(qt.block_bytes, 16)


def _name(qt: QuantType, out_f16: bool, vec: bool) -> str:
    return f"dequant<{qt.ggml_id}, {int(out_f16)}, {int(vec)}>"


def names() -> tuple[str, ...]:
    return tuple(_name(TYPES[t], o, v) for t in CUDA_TYPES for o in (True, False) for v in (True, False))


@functools.lru_cache(maxsize=None)
def _kernel(qt: QuantType, out_f16: bool, vec: bool):
    return kernel("dequant", _name(qt, out_f16, vec), names())


def check_rows(qt: QuantType, w, K: int, what: str = "w") -> int:
    """w must be uint8 (rows, row_bytes(qt, K)) with rows packed back to back (a C-contiguous
    array or a row slice of one), at its blocks' natural alignment. Returns row_bytes."""
    if qt.name not in CUDA_TYPES:  # loads refuse such files first; this names it for direct callers
        raise ValueError(f"{qt.name}: no CUDA kernel decodes it (it runs on the CPU backend only so far)")
    rb = row_bytes(qt, K)
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] != rb:
        raise ValueError(f"{qt.name}: {what} must be uint8 (rows, {rb}) for rows of {K} elements, "
                         f"got {w.dtype} {tuple(w.shape)}")
    if w.shape[0] > 1 and w.strides != (rb, 1) or w.shape[0] <= 1 and w.strides[-1] != 1:
        raise ValueError(f"{qt.name}: {what} rows must be contiguous, got strides {w.strides}")
    if w.data.ptr % block_align(qt):
        raise ValueError(f"{qt.name}: {what} at {w.data.ptr:#x} is not {block_align(qt)}-aligned")
    return rb


def _launch(qt, w, ids, row0, out, stream):
    n, K = out.shape
    rb = check_rows(qt, w, K)
    vec = K % 8 == 0 and out.data.ptr % 16 == 0
    chunks = (K + 7) // 8
    total = n * chunks
    if total == 0:
        return
    kern = _kernel(qt, out.dtype == np.float16, vec)
    args = (w, np.int64(rb), np.int32(w.shape[0]), np.int32(K),
            ids if ids is not None else np.uint64(0), np.int32(row0), np.int32(n), out)
    grid = ((total + _THREADS - 1) // _THREADS,)
    with stream if stream is not None else contextlib.nullcontext():
        kern(grid, (_THREADS,), args)


def _check_out(qt: QuantType, out, dtypes) -> None:
    if out.ndim != 2 or out.dtype not in dtypes or not out.flags.c_contiguous:
        names = " or ".join(np.dtype(d).name for d in dtypes)
        raise ValueError(f"{qt.name}: out must be C-contiguous {names} (rows, K), got {out.dtype} {tuple(out.shape)}")
    if out.shape[1] % qt.block_elems:
        raise ValueError(f"{qt.name}: K = {out.shape[1]} is not a multiple of the {qt.block_elems}-element block")


def dequant_f16(qt, w, out, row0: int = 0, *, stream=None) -> None:
    """out[i] = f16(dequant(w[row0 + i])) for i < out.shape[0].

    qt: QuantType or name; w: cupy uint8 (rows, row_bytes) (C-contiguous or a row slice of
    such); out: cupy float16 (m, K), C-contiguous, row0 + m <= rows."""
    qt = _qt(qt)
    _check_out(qt, out, (np.float16,))
    if not 0 <= row0 or row0 + out.shape[0] > w.shape[0]:
        raise ValueError(f"{qt.name}: rows {row0}..{row0 + out.shape[0]} outside w's {w.shape[0]} rows")
    _launch(qt, w, None, int(row0), out, stream)


def dequant_rows(qt, w, ids, out, *, stream=None) -> None:
    """out[i] = dequant(w[ids[i]]) (an embedding lookup): ids cupy int32 (n,), out cupy float32
    or float16 (n, K). An id outside 0..rows-1 yields a row of NaN (ids are not read on the host)."""
    qt = _qt(qt)
    _check_out(qt, out, (np.float32, np.float16))
    if ids.dtype != np.int32 or ids.ndim != 1 or ids.shape[0] != out.shape[0] or not ids.flags.c_contiguous:
        raise ValueError(f"{qt.name}: ids must be contiguous int32 ({out.shape[0]},), got {ids.dtype} {tuple(ids.shape)}")
    _launch(qt, w, ids, 0, out, stream)
