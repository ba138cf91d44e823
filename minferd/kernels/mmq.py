"""Launchers of mmq.cu: the quantized prefill GEMM out (M, N) f32 = x (M, K) f32 @ dequant(W).T.

Three steps, all enqueued on the current (or given) stream; nothing synchronises or reads the
device from the host, so a call can be captured in a CUDA graph:
  1. x into int8 with one scale per token row (two planes, x ~= d*(hi + lo/128), and the
     32-blocks' sums): `mmq_row_scale`, `mmq_quantize_x`;
  2. a slice of W's rows unpacked from its GGUF blocks to int8 values + per-chunk scales
     (`mmq_unpack<TYPE>`), so the GEMM's K loop only copies and multiplies;
  3. the integer tensor-core GEMM of that slice (`mmq_gemm`, mma.sync m16n8k32; m16n8k16 for
     the per-16-scale types), then the next slice.
Everything lives in one scratch buffer (scratch_bytes): x's quantized planes and sums, and one
slice of unpacked rows, at most UNPACK_BYTES (all of a 7B model's matrices but the output
head fit in one slice). The one allocation is that scratch when the caller passes none
(CuPy's current allocator: a model's arena).

Tile shapes (CONFIGS): "wide2" 128 weight rows x 64 tokens per CTA (8 warps, registers held
to 128 so two CTAs share an SM), used when it gives at least 3/4 of two CTAs per SM; else
"small", 64 x 64 (4 warps), so a short M or a small N still spreads over the GPU. "big"
(128 x 128, one CTA an SM, three stages) and "tall2" stay for bench/mmq.py --configs: on the
H200 (2026-11-30) wide2 beat big by 5-17% at every Qwen2.5-7B shape from 512 tokens, and small
won only at N = 512.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import kernel
from .dequant import check_rows
from .launch import sm_count
from .quant import TYPES, QuantType, by_name

# (warps along N, warps along M, 16-row tiles per warp, 8-token tiles per warp, CTAs per SM
# the registers are held to, shared-memory stages)
CONFIGS: dict[str, tuple[int, int, int, int, int, int]] = {
    "big": (2, 4, 4, 4, 1, 3), "small": (2, 2, 2, 4, 1, 3), "wide2": (4, 2, 2, 4, 2, 2), "tall2": (2, 4, 4, 2, 2, 2)}
# per type: (scale floats per 32-chunk, kind): kind 0 scale, 1 scale + min (per 32),
# 2 two scales (per 16), 3 two scales + two mins (per 16). Mirrors Dec<TYPE> in mmq_decoders.cuh.
_SCALES: dict[str, tuple[int, int]] = {
    "Q4_0": (1, 0), "Q4_1": (2, 1), "Q5_0": (1, 0), "Q5_1": (2, 1), "Q8_0": (1, 0),
    "Q2_K": (4, 3), "Q3_K": (2, 2), "Q4_K": (2, 1), "Q5_K": (2, 1), "Q6_K": (2, 2),
}
SUPPORTED: frozenset[str] = frozenset(_SCALES)
BK, ROWB, ALIGN = 128, 144, 128  # as mmq.cu (ALIGN: MP_ALIGN, rows of x and of unpacked W)
UNPACK_BYTES = 128 << 20         # the most unpacked W (int8 + scales) one slice may take


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def _gemm(ns: int, kind: int, config: str) -> str:
    return f"mmq_gemm<{ns}, {kind}, {', '.join(str(v) for v in CONFIGS[config])}>"


def gemm_name(qt: QuantType, config: str) -> str:
    return _gemm(*_SCALES[qt.name], config)


def unpack_name(qt: QuantType) -> str:
    return f"mmq_unpack<{qt.ggml_id}>"


def names() -> tuple[str, ...]:
    """The templates to instantiate: a GEMM per (scales, kind) x config, an unpacker per type.
    (mmq_row_scale and mmq_quantize_x are extern "C": looked up by their plain names.)"""
    gemms = [_gemm(ns, kind, c) for ns, kind in sorted(set(_SCALES.values())) for c in CONFIGS]
    return tuple(gemms + [unpack_name(TYPES[t]) for t in sorted(SUPPORTED)])


@functools.lru_cache(maxsize=None)
def _fn(name: str, smem: int = 0):
    return kernel("mmq", name, names(), smem)


def smem_bytes(qt: QuantType, config: str) -> int:
    """Dynamic shared memory of one CTA: STAGES stages of mmq.cu's Stage layout."""
    wn, wm, tn, tm, _, stages = CONFIGS[config]
    bn, bm = 16 * tn * wn, 8 * tm * wm
    ns, kind = _SCALES[qt.name]
    stage = bn * ROWB + 2 * bm * ROWB + 4 * bn * ns * 4
    stage += 4 * bm * 4 if kind == 1 else 0
    stage += 4 * bm * 8 if kind == 3 else 0
    return stages * stage


def _slice_rows(qt: QuantType, N: int, Kp: int, budget: int) -> int:
    """Rows of W unpacked at a time: all of N when the budget allows, else equal slices."""
    per_row = Kp + Kp // 32 * _SCALES[qt.name][0] * 4
    fit = max(ALIGN, budget // per_row // ALIGN * ALIGN)
    slices = -(-N // fit)
    return min(_round_up(-(-N // slices), ALIGN), fit)


def _layout(qt: QuantType, M: int, N: int, K: int, unpack_bytes: int | None = None) -> dict[str, int]:
    """Byte offsets in the scratch: xq int8 [2][Mp][Kp], xd f32 [Mp], xs f32 [Kp/32][Mp],
    xs16 f32x2 [Kp/32][Mp], wq int8 [rows][Kp], ws f32 [rows][Kp/32][NS]; and the sizes."""
    Mp, Kp = _round_up(max(M, 1), ALIGN), _round_up(K, BK)
    rows = _slice_rows(qt, max(N, 1), Kp, unpack_bytes or UNPACK_BYTES)
    nkb, ns = Kp // 32, _SCALES[qt.name][0]
    o = {"Mp": Mp, "Kp": Kp, "rows": rows, "xq": 0}
    o["xd"] = _round_up(2 * Mp * Kp, 256)
    o["xs"] = o["xd"] + _round_up(Mp * 4, 256)
    o["xs16"] = o["xs"] + _round_up(nkb * Mp * 4, 256)
    o["wq"] = o["xs16"] + _round_up(nkb * Mp * 8, 256)
    o["ws"] = o["wq"] + _round_up(rows * Kp, 256)
    o["bytes"] = o["ws"] + nkb * rows * ns * 4
    return o


def scratch_bytes(qt, M: int, N: int, K: int, unpack_bytes: int | None = None) -> int:
    return _layout(_qt(qt), M, N, K, unpack_bytes)["bytes"]


def pick_config(M: int, N: int) -> str:
    import cupy
    wn, wm, tn, tm, per_sm, _ = CONFIGS["wide2"]
    tiles = -(-M // (8 * tm * wm)) * -(-N // (16 * tn * wn))
    return "wide2" if 4 * tiles >= 3 * per_sm * sm_count(cupy.cuda.Device().id) else "small"


def _stream(stream):
    return stream if stream is not None else contextlib.nullcontext()


def _check_f32(a, shape, what):
    if a.dtype != np.float32 or a.shape != shape or not a.flags.c_contiguous:
        raise ValueError(f"mmq: {what} must be C-contiguous float32 {shape}, got {a.dtype} {tuple(a.shape)}")


def quantize_rows(x, Mp: int, Kp: int, xq, xd, xs, xs16) -> None:
    """x (M, K) f32 into the GEMMs' format for Mp >= M rows and Kp >= K columns (device
    addresses of its four arrays, _layout's shapes), on the current stream."""
    M, K = x.shape
    _fn("mmq_row_scale")((Mp,), (256,), (x, np.int32(M), np.int32(K), np.int32(Mp), xd))
    _fn("mmq_quantize_x")(((Mp * Kp // 8 + 255) // 256,), (256,),
                          (x, np.int32(M), np.int32(K), np.int32(Mp), np.int32(Kp), xq, xd, xs, xs16))


def unpack_rows(qt: QuantType, w, rb: int, n0: int, nr: int, K: int, Kp: int, wq, ws) -> None:
    """mmq_unpack of w's rows n0 .. n0+nr (rb bytes apart) into wq int8 [nr][Kp] and ws f32
    [nr][Kp/32][NS] (device addresses), on the current stream."""
    _fn(unpack_name(qt))(((nr * (Kp // 64) + 255) // 256,), (256,),
                         (np.uint64(w.data.ptr + n0 * rb), np.int64(rb), np.int32(nr),
                          np.int32(K // qt.block_elems), np.int32(Kp), wq, ws))


def mmq(qt, w, x, out, *, scratch=None, stream=None, config: str | None = None,
        unpack_bytes: int | None = None) -> None:
    """out (M, N) f32 = x (M, K) f32 @ dequant(w).T for a quantized type in SUPPORTED.

    w: cupy uint8 (N, row_bytes) rows back to back (C-contiguous or a row slice); x: cupy f32
    (M, K) C-contiguous, 16-byte aligned; out: f32 (M, N) C-contiguous. scratch: uint8, at least
    scratch_bytes(qt, M, N, K, unpack_bytes), 256-aligned (None: taken from CuPy's current
    allocator). unpack_bytes caps one slice of unpacked W (default UNPACK_BYTES). config (a
    CONFIGS key) overrides the tile shape, for benchmarks and tests."""
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
    cfg = config or (pick_config(M, N) if M and N else "small")
    if cfg not in CONFIGS:
        raise ValueError(f"mmq: unknown config {cfg!r}")
    if M == 0 or N == 0:
        return
    lay = _layout(qt, M, N, K, unpack_bytes)
    if scratch is None:
        import cupy
        with _stream(stream):
            scratch = cupy.empty(lay["bytes"], cupy.uint8)
    elif scratch.dtype != np.uint8 or not scratch.flags.c_contiguous or scratch.nbytes < lay["bytes"]:
        raise ValueError(f"mmq: scratch must be contiguous uint8 of >= {lay['bytes']} bytes, got {scratch.dtype} {scratch.nbytes}")
    elif scratch.data.ptr % 256:
        raise ValueError("mmq: scratch must be 256-aligned")
    p, Mp, Kp, rows = scratch.data.ptr, lay["Mp"], lay["Kp"], lay["rows"]
    at = {k: np.uint64(p + lay[k]) for k in ("xq", "xd", "xs", "xs16", "wq", "ws")}
    wn, wm, tn, tm, _, _ = CONFIGS[cfg]
    bn, bm = 16 * tn * wn, 8 * tm * wm
    smem = smem_bytes(qt, cfg)
    gemm = _fn(gemm_name(qt, cfg), smem)
    with _stream(stream):
        quantize_rows(x, Mp, Kp, at["xq"], at["xd"], at["xs"], at["xs16"])
        for n0 in range(0, N, rows):
            nr = min(rows, N - n0)
            unpack_rows(qt, w, rb, n0, nr, K, Kp, at["wq"], at["ws"])
            gemm(((M + bm - 1) // bm, (nr + bn - 1) // bn), (wn * wm * 32,),
                 (at["wq"], at["ws"], np.int32(nr), np.int32(M), np.int32(Mp), np.int32(Kp),
                  at["xq"], at["xd"], at["xs"], at["xs16"], np.uint64(out.data.ptr + 4 * n0), np.int64(N)),
                 shared_mem=smem)
