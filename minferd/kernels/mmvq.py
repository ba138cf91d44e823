"""Launchers of mmvq.cu: out (n, rows) = x (n, K) @ dequant(W).T for decode batches n <= 8.

Quantized W: x is first rounded to int8 per 32 elements (`quantize_x`, into a small scratch
buffer), then one kernel streams W's blocks once for all n columns with dp4a; float W
(F32/F16/BF16) takes an f32 kernel. Both enqueue on the current (or given) stream and never
synchronise or read the device from the host, so they can be captured in a CUDA graph. The
one allocation is the scratch for x's int8 copy: pass `scratch` (uint8, at least
`scratch_bytes(n, K)`, e.g. from the model's arena) and there is none; leave it None and it
is taken from CuPy's current allocator (fine under capture when that allocator is a
pool that does not call cudaMalloc, as the CUDA backend's arena).

`x_quantized=True` reuses the scratch as the last call with the same x left it, so q/k/v
(or gate/up), which share their input, quantize it once.

Kernel shapes (warps per CTA, rows per warp, units in flight per lane) are per type and
batch bucket in CONFIGS, chosen from bench/kernels.py's sweep on the H200.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import module
from .dequant import check_rows
from .quant import TYPES, QuantType, by_name

NC_BUCKETS = (1, 2, 4, 8)  # kernels are compiled for these column counts; n=3 runs the 4 one
MAX_COLS = NC_BUCKETS[-1]
FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = tuple(n for n in TYPES if n not in FLOAT_TYPES)

# (warps per CTA, rows per warp, units in flight per lane), by type, for n == 1 and n > 1.
_DEFAULT_1 = (4, 1, 4)
_DEFAULT_N = (4, 1, 2)
CONFIGS: dict[str, dict[int, tuple[int, int, int]]] = {
    name: {1: _DEFAULT_1, 2: _DEFAULT_N, 4: _DEFAULT_N, 8: _DEFAULT_N} for name in QUANT_TYPES
}


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def bucket(n: int) -> int:
    for b in NC_BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"mmvq: batch of {n} columns, at most {MAX_COLS}")


def kernel_name(qt: QuantType, nc: int, cfg: tuple[int, int, int] | None = None) -> str:
    if qt.name in FLOAT_TYPES:
        raise ValueError("float types have no (warps, rows, units) config")
    nw, r, unr = cfg or CONFIGS[qt.name][nc]
    return f"mmvq<{qt.ggml_id}, {nc}, {nw}, {r}, {unr}>"


def _float_name(qt: QuantType, nc: int, vec: int) -> str:
    return f"mmv_float<{qt.ggml_id}, {nc}, {vec}>"


def _default_names() -> tuple[str, ...]:
    names = []  # quantize_x is extern "C": looked up by its plain name
    for name in QUANT_TYPES:
        names += [kernel_name(TYPES[name], nc) for nc in NC_BUCKETS]
    for name in FLOAT_TYPES:
        names += [_float_name(TYPES[name], nc, v) for nc in NC_BUCKETS for v in (1, 8)]
    return tuple(dict.fromkeys(names))


_extra_names: tuple[str, ...] = ()


def add_configs(configs) -> None:
    """Compile extra (type name, n bucket, (warps, rows, units)) variants into the module
    (bench/kernels.py's sweep); call before the first launch that needs them."""
    global _extra_names
    names = tuple(kernel_name(TYPES[t], nc, cfg) for t, nc, cfg in configs)
    _extra_names = tuple(dict.fromkeys(_extra_names + names))
    _fn.cache_clear()


@functools.lru_cache(maxsize=None)
def _fn(name: str):
    defaults = _default_names()
    return module("mmvq", defaults + tuple(n for n in _extra_names if n not in defaults)).get_function(name)


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def _layout(n: int, K: int) -> tuple[int, int, int]:
    """(xds offset, xds row stride in blocks, total bytes) of the scratch: xq int8 (n, K),
    then (d, sum) f32 pairs (n, kbp), kbp a multiple of 4 so rows stay 32-byte aligned."""
    kbp = _round_up(K // 32, 4)
    off = _round_up(n * K, 256)
    return off, kbp, off + n * kbp * 8


def scratch_bytes(n: int, K: int) -> int:
    return _layout(n, K)[2]


def _check_x(x, what="x"):
    if x.dtype != np.float32 or x.ndim != 2 or not x.flags.c_contiguous:
        raise ValueError(f"mmvq: {what} must be C-contiguous float32 (n, K), got {x.dtype} {tuple(x.shape)}")
    n = x.shape[0]
    if not 1 <= n <= MAX_COLS:
        raise ValueError(f"mmvq: batch of {n} columns, expected 1..{MAX_COLS}")


def _check_scratch(scratch, n, K):
    need = scratch_bytes(n, K)
    if scratch.dtype != np.uint8 or not scratch.flags.c_contiguous or scratch.nbytes < need:
        raise ValueError(f"mmvq: scratch must be contiguous uint8 of >= {need} bytes, got {scratch.dtype} {scratch.nbytes}")
    if scratch.data.ptr % 256:
        raise ValueError("mmvq: scratch must be 256-aligned")


def _stream(stream):
    return stream if stream is not None else contextlib.nullcontext()


def quantize_x(x, scratch, *, stream=None) -> None:
    """x (n, K) f32 -> scratch: int8 per 32 elements with (d, exact sum) per block."""
    _check_x(x)
    n, K = x.shape
    if K % 32:
        raise ValueError(f"mmvq: K = {K} is not a multiple of 32")
    _check_scratch(scratch, n, K)
    off, kbp, _ = _layout(n, K)
    p = scratch.data.ptr
    with _stream(stream):
        _fn("quantize_x")(((n * K + 255) // 256,), (256,),
                          (x, np.int32(K), np.int32(n), np.int32(kbp), np.uint64(p), np.uint64(p + off)))


def mmvq(qt, w, x, out, *, scratch=None, x_quantized: bool = False, stream=None, config=None) -> None:
    """out (n, rows) f32 = x (n, K) f32 @ dequant(w).T, f32 accumulation; n in 1..8.

    qt: QuantType or name; w: cupy uint8 (rows, row_bytes) (C-contiguous or a row slice);
    scratch: see the module doc; x_quantized: scratch already holds this x (quantized types);
    config: (warps, rows, units) override of CONFIGS (bench sweeps)."""
    qt = _qt(qt)
    _check_x(x)
    n, K = x.shape
    rows = w.shape[0]
    rb = check_rows(qt, w, K)
    if out.dtype != np.float32 or out.shape != (n, rows) or not out.flags.c_contiguous:
        raise ValueError(f"mmvq: out must be C-contiguous float32 {(n, rows)}, got {out.dtype} {tuple(out.shape)}")
    if rows == 0:
        return
    nc = bucket(n)
    if qt.name in FLOAT_TYPES:
        vec = 8 if K % 8 == 0 and rb % 16 == 0 and w.data.ptr % 16 == 0 and x.data.ptr % 16 == 0 else 1
        with _stream(stream):
            _fn(_float_name(qt, nc, vec))(((rows + 3) // 4,), (128,),
                                          (w, np.int64(rb), np.int32(rows), np.int32(K), x, np.int32(n), out))
        return
    if scratch is None:
        if x_quantized:
            raise ValueError("mmvq: x_quantized needs the scratch that holds it")
        import cupy as cp
        with _stream(stream):
            scratch = cp.empty(scratch_bytes(n, K), cp.uint8)
    if not x_quantized:
        quantize_x(x, scratch, stream=stream)
    else:
        _check_scratch(scratch, n, K)
    off, kbp, _ = _layout(n, K)
    nw, r, unr = config or CONFIGS[qt.name][nc]
    p = scratch.data.ptr
    with _stream(stream):
        _fn(kernel_name(qt, nc, (nw, r, unr)))(
            ((rows + nw * r - 1) // (nw * r),), (nw * 32,),
            (w, np.int64(rb), np.int32(rows), np.int32(K // qt.block_elems), np.uint64(p), np.uint64(p + off),
             np.int32(K), np.int32(kbp), np.int32(n), out))
