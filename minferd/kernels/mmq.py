"""Launchers of mmq.cu: the quantized prefill GEMM out (M, N) f32 = x (M, K) f32 @ dequant(W).T.

x is first quantized per 32 elements into int8 (two planes, x ~= d*(hi + lo/128), and the
blocks' sums; `mmq_quantize_x`, into `scratch`), then one integer tensor-core kernel reads W's
GGUF blocks straight from global memory, unpacks them to int8 + per-chunk scales in shared
memory and runs mma.sync m16n8k32 (m16n8k16 for the per-16-scale types). Both launches are
enqueued on the current (or given) stream; nothing synchronises or reads the device from the
host, so the pair can be captured in a CUDA graph. The one allocation is the scratch when the
caller passes none (CuPy's current allocator).

Tile shapes (CONFIGS): "big" 128 weight rows x 128 tokens per CTA (8 warps, one CTA per SM),
used when it gives at least 3/4 of a CTA per SM; else "small", 64 x 64 (4 warps, two per SM),
so a short M or a small N still spreads over the GPU. Measured on the H200 (bench/mmq.py
--configs, 2026-11-30): big wins from 112 CTAs (M=512, N=3584) up; small wins at 16-64 CTAs
(N=512).
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import module
from .dequant import check_rows
from .quant import TYPES, QuantType, by_name

# (warps along N, warps along M, 16-row tiles per warp, 8-token tiles per warp)
CONFIGS: dict[str, tuple[int, int, int, int]] = {"big": (2, 4, 4, 4), "small": (2, 2, 2, 4)}
# per type: (scale floats per 32-chunk, kind): kind 0 scale, 1 scale + min (per 32),
# 2 two scales (per 16), 3 two scales + two mins (per 16). Mirrors Dec<TYPE> in mmq.cu.
_SCALES: dict[str, tuple[int, int]] = {
    "Q4_0": (1, 0), "Q4_1": (2, 1), "Q5_0": (1, 0), "Q5_1": (2, 1), "Q8_0": (1, 0),
    "Q2_K": (4, 3), "Q3_K": (2, 2), "Q4_K": (2, 1), "Q5_K": (2, 1), "Q6_K": (2, 2),
}
SUPPORTED: frozenset[str] = frozenset(_SCALES)
PLANES = 2                                  # the default: x as hi + lo/128 (see mmq.cu's header)
ONE_PLANE_TYPES = ("Q4_K", "Q6_K", "Q8_0")  # also compiled with one plane, for bench/mmq.py
BK, ROWB, MP_ALIGN, KP_ALIGN = 128, 144, 128, 128  # as mmq.cu


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def kernel_name(qt: QuantType, config: str, planes: int) -> str:
    wn, wm, tn, tm = CONFIGS[config]
    return f"mmq<{qt.ggml_id}, {wn}, {wm}, {tn}, {tm}, {planes}>"


def names() -> tuple[str, ...]:
    out = [kernel_name(TYPES[t], c, PLANES) for t in sorted(SUPPORTED) for c in CONFIGS]
    out += [kernel_name(TYPES[t], c, 1) for t in ONE_PLANE_TYPES for c in CONFIGS]
    return tuple(out)  # mmq_quantize_x is extern "C": looked up by its plain name


@functools.lru_cache(maxsize=None)
def _fn(name: str, smem: int = 0):
    f = module("mmq", names()).get_function(name)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    return f


def smem_bytes(qt: QuantType, config: str, planes: int) -> int:
    """Dynamic shared memory of one CTA: two stages of mmq.cu's Stage layout."""
    wn, wm, tn, tm = CONFIGS[config]
    bn, bm = 16 * tn * wn, 8 * tm * wm
    ns, kind = _SCALES[qt.name]
    stage = bn * ROWB + planes * bm * ROWB + 4 * bn * ns * 4 + 4 * bm * 4
    stage += 4 * bm * 4 if kind == 1 else 0
    stage += 4 * bm * 8 if kind == 3 else 0
    return 2 * stage


def _layout(M: int, K: int) -> tuple[int, int, int, int, int, int, int]:
    """(Mp, Kp, xd offset, xs offset, xs16 offset, plane stride of the sums, total bytes):
    xq int8 [2][Mp][Kp], xd f32 [Kp/32][Mp], xs f32 [2][Kp/32][Mp], xs16 f32x2 [2][Kp/32][Mp]."""
    Mp, Kp = _round_up(max(M, 1), MP_ALIGN), _round_up(K, KP_ALIGN)
    nkb = Kp // 32
    o_d = _round_up(2 * Mp * Kp, 256)
    o_s = o_d + _round_up(nkb * Mp * 4, 256)
    o_s16 = o_s + _round_up(2 * nkb * Mp * 4, 256)
    return Mp, Kp, o_d, o_s, o_s16, nkb * Mp, o_s16 + 2 * nkb * Mp * 8


def scratch_bytes(M: int, K: int) -> int:
    return _layout(M, K)[-1]


@functools.lru_cache(maxsize=None)
def _sm_count(dev: int) -> int:
    import cupy
    return int(cupy.cuda.Device(dev).attributes["MultiProcessorCount"])


def pick_config(M: int, N: int) -> str:
    import cupy
    wn, wm, tn, tm = CONFIGS["big"]
    tiles = -(-M // (8 * tm * wm)) * -(-N // (16 * tn * wn))
    return "big" if 4 * tiles >= 3 * _sm_count(cupy.cuda.Device().id) else "small"


def _stream(stream):
    return stream if stream is not None else contextlib.nullcontext()


def _check_f32(a, shape, what):
    if a.dtype != np.float32 or a.shape != shape or not a.flags.c_contiguous:
        raise ValueError(f"mmq: {what} must be C-contiguous float32 {shape}, got {a.dtype} {tuple(a.shape)}")


def mmq(qt, w, x, out, *, scratch=None, stream=None, config: str | None = None, planes: int = PLANES) -> None:
    """out (M, N) f32 = x (M, K) f32 @ dequant(w).T for a quantized type in SUPPORTED.

    w: cupy uint8 (N, row_bytes) rows back to back (C-contiguous or a row slice); x: cupy f32
    (M, K) C-contiguous, 16-byte aligned; out: f32 (M, N) C-contiguous. scratch: uint8, at least
    scratch_bytes(M, K), 256-aligned (None: taken from CuPy's current allocator). config
    ("big"/"small") and planes (1: one int8 plane, as llama.cpp; only ONE_PLANE_TYPES) override
    the defaults, for benchmarks and tests."""
    qt = _qt(qt)
    if qt.name not in SUPPORTED:
        raise ValueError(f"mmq: type {qt.name} not supported (supported: {', '.join(sorted(SUPPORTED))})")
    if x.ndim != 2:
        raise ValueError(f"mmq: x must be 2-D (M, K), got shape {tuple(x.shape)}")
    M, K = x.shape
    _check_f32(x, (M, K), "x")
    if K == 0 or K % qt.block_elems:
        raise ValueError(f"mmq: K = {K} is not a positive multiple of {qt.name}'s {qt.block_elems}-element block")
    if x.data.ptr % 16:
        raise ValueError("mmq: x must be 16-byte aligned")
    N = w.shape[0] if w.ndim == 2 else -1
    rb = check_rows(qt, w, K)
    _check_f32(out, (M, N), "out")
    if planes not in (1, 2) or planes == 1 and qt.name not in ONE_PLANE_TYPES:
        raise ValueError(f"mmq: planes={planes} is not compiled for {qt.name}")
    cfg = config or (pick_config(M, N) if M and N else "small")
    if cfg not in CONFIGS:
        raise ValueError(f"mmq: unknown config {cfg!r}")
    if M == 0 or N == 0:
        return
    Mp, Kp, o_d, o_s, o_s16, pstride, need = _layout(M, K)
    if scratch is None:
        import cupy
        with _stream(stream):
            scratch = cupy.empty(need, cupy.uint8)
    elif scratch.dtype != np.uint8 or not scratch.flags.c_contiguous or scratch.nbytes < need:
        raise ValueError(f"mmq: scratch must be contiguous uint8 of >= {need} bytes, got {scratch.dtype} {scratch.nbytes}")
    elif scratch.data.ptr % 256:
        raise ValueError("mmq: scratch must be 256-aligned")
    p = scratch.data.ptr
    wn, wm, tn, tm = CONFIGS[cfg]
    bn, bm = 16 * tn * wn, 8 * tm * wm
    smem = smem_bytes(qt, cfg, planes)
    sel = pstride * (planes - 1)  # the sums matching the planes the kernel reads
    with _stream(stream):
        _fn("mmq_quantize_x")(((Mp * Kp // 8 + 255) // 256,), (256,),
                              (x, np.int32(M), np.int32(K), np.int32(Mp), np.int32(Kp), np.uint64(p),
                               np.uint64(p + o_d), np.uint64(p + o_s), np.uint64(p + o_s16)))
        _fn(kernel_name(qt, cfg, planes), smem)(
            ((M + bm - 1) // bm, (N + bn - 1) // bn), (wn * wm * 32,),
            (w, np.int64(rb), np.int32(N), np.int32(K // qt.block_elems), np.int32(M), np.int32(Mp), np.int32(Kp),
             np.uint64(p), np.uint64(p + o_d), np.uint64(p + o_s + 4 * sel), np.uint64(p + o_s16 + 8 * sel), out),
            shared_mem=smem)
