"""Launchers of mmq_small.cu: out (M, N) f32 = x (M, K) f32 @ dequant(W).T (+ bias) (+ residual)
for decode batches of MIN_M..MAX_M tokens, reading W's quantized bytes once on the integer
tensor cores.

Two calls, both only enqueue work on the current (or given) stream (no allocation when the
caller passes the buffers, no synchronisation: safe inside CUDA graph capture):
  - `quantize(x, buf)`: x into mmq.cu's activation format (mmq.quantize_rows), once per input
    however many matrices read it (q/k/v, gate/up);
  - `mmq_small(qt, w, xq, out, ...)`: the GEMM, with K split over `splits(...)` CTAs per row
    tile when the rows alone cannot fill the GPU, and then one launch that adds the splits,
    the bias and the residual.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np

from . import kernel
from .dequant import check_rows
from .launch import sm_count
from .mmq import BK, ROWB, SUPPORTED, _SCALES, quantize_rows
from .quant import TYPES, QuantType, by_name

MIN_M, MAX_M = 9, 64  # below: the mat-vec kernels; above: the prefill GEMMs
WN = 4  # warps a CTA, 16 weight rows each
BN = 16 * WN
# name -> (CTAs per SM the registers are held to, shared-memory stages, K steps of raw W in
# registers ahead of the one computing). bench/mmq_small.py times them; CONFIG runs.
CONFIGS: dict[str, tuple[int, int, int]] = {"base": (3, 2, 1), "occ6": (6, 2, 1), "pf2": (3, 2, 2), "occ6pf2": (6, 2, 2)}
CONFIG = "base"
SWEPT = ("Q4_K", "Q6_K")  # the types every config is built for (the rest: CONFIG only)
TMS = (2, 4, 8)  # 8-token tiles per warp: the CTA holds BM = 8 * TM tokens (16, 32, 64)
MAX_PART_BYTES = 16 << 20  # the split partials of one matmul (mmq_small.cu: part)
CTAS_PER_SM = 4  # the split aims for this many CTAs per SM


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def tile_m(M: int) -> int:
    """Tokens per CTA: the smallest tile that holds the whole batch."""
    if not 1 <= M <= MAX_M:
        raise ValueError(f"mmq_small: {M} tokens, outside 1..{MAX_M}")
    return next(8 * tm for tm in TMS if 8 * tm >= M)


def kernel_name(qt: QuantType, tm: int, config: str = CONFIG) -> str:
    minb, stages, pf = CONFIGS[config]
    return f"mmq_small<{qt.ggml_id}, {WN}, {tm}, {minb}, {stages}, {pf}>"


def names() -> tuple[str, ...]:
    out = {kernel_name(TYPES[t], tm) for t in sorted(SUPPORTED) for tm in TMS}
    out |= {kernel_name(TYPES[t], tm, c) for t in SWEPT for tm in TMS for c in CONFIGS}
    return tuple(sorted(out))


@functools.lru_cache(maxsize=None)
def _fn(name: str, smem: int = 0):
    return kernel("mmq_small", name, names(), smem)


def smem_bytes(qt: QuantType, M: int, config: str = CONFIG) -> int:
    """The config's stages of mmq_tile.cuh's Stage layout for BN rows and tile_m(M) tokens."""
    bm = tile_m(M)
    ns, kind = _SCALES[qt.name]
    stage = BN * ROWB + 2 * bm * ROWB + 4 * BN * ns * 4
    stage += 4 * bm * 4 if kind == 1 else 0
    stage += 4 * bm * 8 if kind == 3 else 0
    return CONFIGS[config][1] * stage


@dataclass(frozen=True)
class QuantizedX:
    """x in mmq.cu's format inside `buf`: int8 planes [2][Mp][Kp], row scales [Mp], chunk sums
    [Kp/32][Mp] and half-chunk sums [Kp/32][Mp] (f32x2)."""
    M: int
    K: int
    Mp: int
    Kp: int
    buf: object  # the cupy uint8 array holding it (kept alive with it)
    xq: int
    xd: int
    xs: int
    xs16: int


def _x_layout(M: int, K: int) -> tuple[int, int, dict[str, int]]:
    Mp, Kp = tile_m(M), _round_up(K, BK)
    nkb = Kp // 32
    o = {"xq": 0}
    o["xd"] = _round_up(2 * Mp * Kp, 256)
    o["xs"] = o["xd"] + _round_up(Mp * 4, 256)
    o["xs16"] = o["xs"] + _round_up(nkb * Mp * 4, 256)
    o["bytes"] = o["xs16"] + nkb * Mp * 8
    return Mp, Kp, o


def x_bytes(M: int, K: int) -> int:
    return _x_layout(M, K)[2]["bytes"]


def splits(N: int, K: int, sms: int) -> int:
    """K splits per row tile: enough CTAs for CTAS_PER_SM on every SM, no split empty, none
    shorter than one step."""
    steps = _round_up(K, BK) // BK
    want = max(1, min(steps, -(-CTAS_PER_SM * sms // -(-N // BN))))
    return -(-steps // -(-steps // want))


def part_bytes(M: int, N: int, K: int, sms: int) -> int:
    """The partials buffer mmq_small needs (0: one split, none)."""
    s = _split_for(M, N, K, sms)
    return 0 if s == 1 else s * M * N * 4


def _split_for(M: int, N: int, K: int, sms: int) -> int:
    s = splits(N, K, sms)
    while s > 1 and s * M * N * 4 > MAX_PART_BYTES:
        s -= 1
    steps = _round_up(K, BK) // BK
    return -(-steps // -(-steps // s))


def scratch_bound(widest: int) -> int:
    """What one matmul of up to MAX_M tokens takes at most: its quantized x and the partials."""
    return x_bytes(MAX_M, widest) + MAX_PART_BYTES


def _stream(stream):
    return stream if stream is not None else contextlib.nullcontext()


def quantize(x, buf=None, *, stream=None) -> QuantizedX:
    """x (M, K) f32 C-contiguous, 16-aligned, MIN_M <= M <= MAX_M (any M >= 1 works), K % 32 == 0,
    into buf (uint8, >= x_bytes(M, K), 256-aligned; None: from CuPy's current allocator)."""
    if x.dtype != np.float32 or x.ndim != 2 or not x.flags.c_contiguous or x.data.ptr % 16:
        raise ValueError(f"mmq_small: x must be C-contiguous 16-aligned float32 (M, K), got {x.dtype} {tuple(x.shape)}")
    M, K = x.shape
    if K == 0 or K % 32:
        raise ValueError(f"mmq_small: K = {K} is not a positive multiple of 32")
    Mp, Kp, lay = _x_layout(M, K)
    if buf is None:
        import cupy
        with _stream(stream):
            buf = cupy.empty(lay["bytes"], cupy.uint8)
    elif buf.dtype != np.uint8 or not buf.flags.c_contiguous or buf.nbytes < lay["bytes"] or buf.data.ptr % 256:
        raise ValueError(f"mmq_small: buf must be contiguous 256-aligned uint8 of >= {lay['bytes']} bytes")
    p = buf.data.ptr
    q = QuantizedX(M, K, Mp, Kp, buf, p + lay["xq"], p + lay["xd"], p + lay["xs"], p + lay["xs16"])
    with _stream(stream):
        quantize_rows(x, Mp, Kp, *(np.uint64(a) for a in (q.xq, q.xd, q.xs, q.xs16)))
    return q


def _check_f32(a, shape, what: str) -> None:
    if a.dtype != np.float32 or tuple(a.shape) != shape or not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous float32 {shape}, got {a.dtype} {tuple(a.shape)}")


def check_epilogue(kernel: str, out, bias, residual, M: int, N: int) -> None:
    """out (M, N) and the optional bias (N,) and residual (M, N): what the split-K kernels write
    and add (tcgemv's checks too)."""
    _check_f32(out, (M, N), f"{kernel}: out")
    if bias is not None:
        _check_f32(bias, (N,), f"{kernel}: bias")
    if residual is not None:
        _check_f32(residual, (M, N), f"{kernel}: residual")


def partials(kernel: str, part, need: int):
    """The partials of a split K: the caller's (checked) or, with none given, allocated."""
    import cupy
    if part is None:
        return cupy.empty(need // 4, cupy.float32)
    if part.dtype != np.float32 or not part.flags.c_contiguous or part.nbytes < need:
        raise ValueError(f"{kernel}: part must be contiguous float32 of >= {need} bytes")
    return part


def ptr(a) -> np.uint64:
    return np.uint64(0 if a is None else a.data.ptr)


def mmq_small(qt, w, xq: QuantizedX, out, *, bias=None, residual=None, part=None, stream=None,
              config: str = CONFIG) -> None:
    """out (M, N) = xq's x @ dequant(w).T (+ bias (N,)) (+ residual (M, N)).

    qt: a type in SUPPORTED; w: cupy uint8 (N, row_bytes) rows (C-contiguous or a row slice);
    part: f32 scratch of >= part_bytes(M, N, K) bytes when that is not 0 (None: allocated);
    config: a CONFIGS key (other than CONFIG only for the SWEPT types: benchmarks, tests)."""
    qt = _qt(qt)
    if config != CONFIG and (config not in CONFIGS or qt.name not in SWEPT):
        raise ValueError(f"mmq_small: config {config!r} is not built for {qt.name}")
    if qt.name not in SUPPORTED:
        raise ValueError(f"mmq_small: type {qt.name} not supported (supported: {', '.join(sorted(SUPPORTED))})")
    M, K = xq.M, xq.K
    if K % qt.block_elems:
        raise ValueError(f"mmq_small: K = {K} is not a multiple of {qt.name}'s {qt.block_elems}-element block")
    N = w.shape[0] if w.ndim == 2 else -1
    rb = check_rows(qt, w, K)
    check_epilogue("mmq_small", out, bias, residual, M, N)
    if N == 0:
        return
    import cupy
    s = _split_for(M, N, K, sm_count(cupy.cuda.Device().id))
    need = 0 if s == 1 else s * M * N * 4
    with _stream(stream):
        part = partials("mmq_small", part, need) if need else None
        smem = smem_bytes(qt, M, config)
        steps = -(-(xq.Kp // BK) // s)
        _fn(kernel_name(qt, tile_m(M) // 8, config), smem)(
            (1, -(-N // BN), s), (WN * 32,),
            (w, np.int64(rb), np.int32(K // qt.block_elems), np.int32(N), np.int32(M), np.int32(xq.Mp),
             np.int32(xq.Kp), np.int32(steps), np.uint64(xq.xq), np.uint64(xq.xd), np.uint64(xq.xs),
             np.uint64(xq.xs16), out, ptr(bias), ptr(residual), ptr(part)),
            shared_mem=smem)
        if need:
            split_sum(part, s, M, N, bias, residual, out)


def split_sum(part, s: int, M: int, N: int, bias, residual, out) -> None:
    """out (M, N) = the s partials part[z][m][n] summed in order, + bias + residual (None: none),
    on the current stream (tcgemv's splits too)."""
    _fn("mmq_split_sum")(((M * N + 255) // 256,), (256,),
                         (part, np.int32(s), np.int32(M), np.int32(N), ptr(bias), ptr(residual), out))
