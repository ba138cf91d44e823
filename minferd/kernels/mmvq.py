"""Launchers of mmvq.cu: out (n, rows) = x (n, K) @ dequant(W).T for decode batches n <= 8.

Quantized W: x is first split per 32 elements into a scale and two int8 planes
(x = d*(hi + lo/254), `quantize_x`, into a small scratch buffer), then one kernel streams W's blocks once for all n columns with dp4a; float W
(F32/F16/BF16) takes an f32 kernel. Both enqueue on the current (or given) stream and never
synchronise or read the device from the host, so they can be captured in a CUDA graph. The
one allocation is the scratch for x's int8 copy: pass `scratch` (uint8, at least
`scratch_bytes(n, K)`, e.g. from the model's arena) and there is none; leave it None and it
is taken from CuPy's current allocator (fine under capture when that allocator is a
pool that does not call cudaMalloc, as the CUDA backend's arena).

`x_quantized=True` reuses the scratch as the last call with the same x left it, so q/k/v
(or gate/up), which share their input, quantize it once.

The MoE launcher over expert ids (mmvq.cu's mmvq_ids) is in mmvq_ids.py; its instances are
named here, with the module's others. mmvq_rope_kv.py launches mmvq_rope_kv (q / k / v ending in
rope and the KV write; a pending path, its instances named there).

Kernel shapes (warps per CTA, warps splitting K, rows per warp group, units in flight per
lane) are per type, batch bucket and shape class in CONFIGS (mmvq_shapes.py), chosen from
bench/kernels.py's sweep on the H200.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import kernel
from .dequant import check_rows
from .quant import TYPES, QuantType, by_name

from .mmvq_shapes import (CONFIGS, FLOAT_TYPES, IDS_CLASSES, IDS_CONFIGS, MAX_COLS, NC_BUCKETS,  # noqa: F401
                          QUANT_TYPES, SWEEP, SWEEP_N, Config, shape_class, sweep_configs)


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def bucket(n: int) -> int:
    for b in NC_BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"mmvq: batch of {n} columns, at most {MAX_COLS}")


# A launch's wide unit (cuda_matmul.WIDE_MAX_K says where): more weights a lane than the type's
# default unit, the same products summed in another order. Q6_K: 16 positions (UQ6_K16). Q4_K's
# whole 32-byte run (session 35) lost: 7B decode 402.7 -> 376.2 tok/s (bench/NOTES.md, session 36).
WIDE_UNITS = {"Q6_K": 114}


def kernel_name(qt: QuantType, nc: int, cfg: Config, wide: bool = False) -> str:
    nw, kw, r, unr = cfg
    return f"mmvq<{WIDE_UNITS[qt.name] if wide else qt.ggml_id}, {nc}, {nw}, {kw}, {r}, {unr}>"


def _float_name(qt: QuantType, nc: int, vec: int, kw: int = 1) -> str:
    return f"mmv_float<{qt.ggml_id}, {nc}, {vec}>" if kw == 1 else f"mmv_float<{qt.ggml_id}, {nc}, {vec}, {kw}>"


# K-split warps for float weights of few rows (mmv_float's KW; an MoE router: 128 rows of 2048 on 32
# CTAs, gpt-oss's 32 of 2880 on 8, each warp walking all of K alone).
FLOAT_SPLIT_KW = 4
FLOAT_SPLIT_ROWS = 256


def _ids_class(rows: int) -> str:
    """An expert's matrices are small: mmvq_ids takes the one-column shape of few or mid rows."""
    return "few" if rows <= 1024 else "mid"


def _ids_name(qt: QuantType, cfg: Config) -> str:
    nw, kw, r, unr = cfg
    return f"mmvq_ids<{qt.ggml_id}, {nw}, {kw}, {r}, {unr}>"


def _float_ids_name(qt: QuantType, vec: int) -> str:
    return f"mmv_float_ids<{qt.ggml_id}, {vec}>"


def names() -> tuple[str, ...]:
    names = []  # quantize_x is extern "C": looked up by its plain name
    for name in QUANT_TYPES:
        names += [kernel_name(TYPES[name], nc, cfg) for nc in NC_BUCKETS for cfg in CONFIGS[name][nc].values()]
        if name in WIDE_UNITS:  # one column only (cuda_matmul._wide)
            names += [kernel_name(TYPES[name], 1, cfg, True) for cfg in CONFIGS[name][1].values()]
        names += [_ids_name(TYPES[name], IDS_CONFIGS[name][c]) for c in IDS_CLASSES]
    for name in FLOAT_TYPES:
        names += [_float_name(TYPES[name], nc, v) for nc in NC_BUCKETS for v in (1, 8)]
        names += [_float_name(TYPES[name], nc, 8, FLOAT_SPLIT_KW) for nc in NC_BUCKETS]
        names += [_float_ids_name(TYPES[name], v) for v in (1, 8)]
    return tuple(dict.fromkeys(names))


_extra_names: tuple[str, ...] = ()


def add_configs(configs) -> None:
    """Compile extra (type name, n bucket, config) variants into the module; call before the
    first launch that needs them."""
    global _extra_names
    names = tuple(kernel_name(TYPES[t], nc, cfg) for t, nc, cfg in configs)
    _extra_names = tuple(dict.fromkeys(_extra_names + names))
    _fn.cache_clear()
    _fn_any.cache_clear()


def add_sweep() -> None:
    """Every SWEEP variant at n = 1 and SWEEP_N at n = 8, for every quantized type, in one
    fixed order (bench and tests then share one compiled module and its disk cache)."""
    add_configs([(t, 1, cfg) for t in QUANT_TYPES for cfg in SWEEP] +
                [(t, 8, cfg) for t in QUANT_TYPES for cfg in SWEEP_N])


@functools.lru_cache(maxsize=None)
def _fn(name: str):
    defaults = names()
    return kernel("mmvq", name, defaults + tuple(n for n in _extra_names if n not in defaults))


@functools.lru_cache(maxsize=None)
def _fn_any(name: str):
    """_fn for names(); a variant outside them in a module of its own: it compiles in seconds
    (bench threads compile many side by side) and leaves the shared module's cache key alone."""
    return _fn(name) if name in names() or name in _extra_names else kernel("mmvq", name, (name,))


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


def _check_x(x, what="x", max_rows: int | None = MAX_COLS):
    """x: C-contiguous f32 (n, K), 1 <= n <= max_rows (None: any n)."""
    if x.dtype != np.float32 or x.ndim != 2 or not x.flags.c_contiguous:
        raise ValueError(f"mmvq: {what} must be C-contiguous float32 (n, K), got {x.dtype} {tuple(x.shape)}")
    n = x.shape[0]
    if max_rows is not None and not 1 <= n <= max_rows:
        raise ValueError(f"mmvq: batch of {n} columns, expected 1..{max_rows}")


def _check_scratch(scratch, n, K):
    need = scratch_bytes(n, K)
    if scratch.dtype != np.uint8 or not scratch.flags.c_contiguous or scratch.nbytes < need:
        raise ValueError(f"mmvq: scratch must be contiguous uint8 of >= {need} bytes, got {scratch.dtype} {scratch.nbytes}")
    if scratch.data.ptr % 256:
        raise ValueError("mmvq: scratch must be 256-aligned")


def _stream(stream):
    return stream if stream is not None else contextlib.nullcontext()


def quantize_x(x, scratch, *, stream=None, max_rows: int = MAX_COLS) -> None:
    """x (n, K) f32 -> scratch: per 32 elements (d, exact sum) and int8 hi/lo planes. max_rows:
    mmvq reads at most 8; mmvq_ids reads one row a pick, so an MoE's picks may be more."""
    _check_x(x, max_rows=max_rows)
    n, K = x.shape
    if K % 32:
        raise ValueError(f"mmvq: K = {K} is not a multiple of 32")
    _check_scratch(scratch, n, K)
    off, kbp, _ = xq_layout(n, K)
    p = scratch.data.ptr
    with _stream(stream):
        _fn("quantize_x")(((n * K + 255) // 256,), (256,),
                          (x, np.int32(K), np.int32(n), np.int32(kbp), np.uint64(p), np.uint64(p + off)))


def _check_f32(a, shape, what):
    if a is not None and (a.dtype != np.float32 or a.shape != shape or not a.flags.c_contiguous):
        raise ValueError(f"mmvq: {what} must be C-contiguous float32 {shape}, got {a.dtype} {tuple(a.shape)}")


def _ptr(a) -> np.uint64:
    return np.uint64(0 if a is None else a.data.ptr)


def mmvq(qt, w, x, out, *, scratch=None, x_quantized: bool = False, stream=None, config=None,
         bias=None, residual=None, split_k: bool = False, wide: bool = False) -> None:
    """out (n, rows) f32 = x (n, K) f32 @ dequant(w).T (+ bias) (+ residual), f32 accumulation;
    n in 1..8. bias (rows,) and residual (n, rows) are f32, neither aliasing out.

    qt: QuantType or name; w: cupy uint8 (rows, row_bytes) (C-contiguous or a row slice);
    scratch: see the module doc; x_quantized: scratch already holds this x (quantized types);
    config: (warps, K-split warps, rows, units) override of CONFIGS (compiled by add_configs).
    split_k: float weights of at most FLOAT_SPLIT_ROWS rows (aligned, K % 8 == 0) take
    FLOAT_SPLIT_KW warps a row. wide: see mmvq_group."""
    qt = _qt(qt)
    if qt.name not in FLOAT_TYPES:
        mmvq_group(qt, [w], x, [out], scratch=scratch, x_quantized=x_quantized, stream=stream, config=config,
                   biases=[bias], residual=residual, wide=wide)
        return
    _check_x(x)
    n, K = x.shape
    rows = w.shape[0]
    rb = check_rows(qt, w, K)
    _check_f32(out, (n, rows), "out")
    _check_f32(bias, (rows,), "bias")
    _check_f32(residual, (n, rows), "residual")
    if rows == 0:
        return
    vec = 8 if K % 8 == 0 and rb % 16 == 0 and w.data.ptr % 16 == 0 and x.data.ptr % 16 == 0 else 1
    kw = FLOAT_SPLIT_KW if split_k and vec == 8 and rows <= FLOAT_SPLIT_ROWS else 1
    per_cta = 4 // kw
    with _stream(stream):
        _fn(_float_name(qt, bucket(n), vec, kw))(((rows + per_cta - 1) // per_cta,), (128,),
                                             (w, np.int64(rb), np.int32(rows), np.int32(K), x, np.int32(n), out,
                                              _ptr(bias), _ptr(residual)))


MAX_GROUP = 3


def mmvq_group(qt, ws, x, outs, *, scratch=None, x_quantized: bool = False, stream=None, config=None,
               biases=None, residual=None, wide: bool = False) -> None:
    """outs[i] = x @ dequant(ws[i]).T (+ biases[i]) for up to three quantized matrices of one
    type and row length that read the same x (q/k/v, gate/up), in ONE launch; residual only
    with a single matrix. The kernel shape is the one CONFIGS gives the largest matrix.
    wide: the type's wide unit (WIDE_UNITS), the same products summed in another order."""
    qt = _qt(qt)
    if qt.name in FLOAT_TYPES:
        raise ValueError(f"mmvq_group: {qt.name} is not a quantized type")
    if wide and qt.name not in WIDE_UNITS:
        raise ValueError(f"mmvq_group: no wide unit for {qt.name} (only {', '.join(WIDE_UNITS)})")
    if not 1 <= len(ws) <= MAX_GROUP or len(outs) != len(ws):
        raise ValueError(f"mmvq_group: 1..{MAX_GROUP} matrices with one output each, got {len(ws)} / {len(outs)}")
    biases = list(biases or [None] * len(ws))
    if len(biases) != len(ws) or (residual is not None and len(ws) != 1):
        raise ValueError("mmvq_group: one bias slot per matrix; a residual only with one matrix")
    _check_x(x)
    n, K = x.shape
    rb = [check_rows(qt, w, K) for w in ws][0]  # one type and K: one row size
    for w, out, b in zip(ws, outs, biases):
        _check_f32(out, (n, w.shape[0]), "out")
        _check_f32(b, (w.shape[0],), "bias")
    _check_f32(residual, (n, ws[0].shape[0]), "residual")
    nc = bucket(n)
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
    off, kbp, _ = xq_layout(n, K)
    rows = [w.shape[0] for w in ws]
    cfg = config or CONFIGS[qt.name][nc][shape_class(max(rows), K)]
    nw, kw, r, _ = cfg
    per_cta = nw // kw * r
    ctas = [(m + per_cta - 1) // per_cta for m in rows]
    if sum(ctas) == 0:
        return
    pad = MAX_GROUP - len(ws)
    W = list(ws) + [ws[-1]] * pad
    R = rows + [0] * pad
    O = list(outs) + [outs[-1]] * pad
    B = [_ptr(b) for b in biases] + [np.uint64(0)] * pad
    cta1, cta2 = ctas[0], ctas[0] + (ctas[1] if len(ctas) > 1 else 0)
    p = scratch.data.ptr
    with _stream(stream):
        (_fn_any if wide or config else _fn)(kernel_name(qt, nc, cfg, wide))(
            (sum(ctas),), (nw * 32,),
            (*W, *(np.int32(m) for m in R), np.int32(cta1), np.int32(cta2), *O, *B,
             np.int64(rb), np.int32(K // qt.block_elems), np.uint64(p), np.uint64(p + off),
             np.int32(K), np.int32(kbp), np.int32(n), _ptr(residual)))
