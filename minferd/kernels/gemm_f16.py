"""Launchers of gemm_f16.cu: out (M, N) f32 = x (M, K) f16 @ W (N, K).T on the tensor cores.

`gemm_w16` takes W as an f16 matrix (the resident copy dequant_f16 makes); `fused_b` takes
W as its raw GGUF rows and dequantizes tiles on the fly inside the GEMM. Both run one kernel
template with the same mma order, so fused_b's output is bit-identical to gemm_w16's on
dequant_f16's copy of the same rows (tests/cuda/test_fused_b.py checks it for every type).

Both check arguments on the host, then only enqueue one kernel on the current (or given)
stream: no allocation, no synchronisation, no device reads (safe inside CUDA graph capture).

Tile configs (CTA rows BM x columns BN, warp tile WM x WN, CTAs per SM the registers are
capped for): "L" for large problems (fewest decode instructions per flop: each CTA's B tile
is decoded once for 256 rows of x), "M", "M8" and "S" for problems too small to fill 132
SMs with "L" tiles (M8 also helps Q6_K/Q8_0 at 512 tokens; w16 prefers M everywhere). `pick_config` estimates each config's time from the waves it needs and the
throughput measured per config and CTAs per SM (RATES, bench/gemm_f16.py on the H200).
"""
from __future__ import annotations

import contextlib
import functools
import math

import numpy as np

from . import kernel
from .dequant import check_rows
from .launch import sm_count
from .quant import CUDA_TYPES, TYPES, QuantType, by_name

BK = 32  # k elements per main-loop step (gemm_f16.cu)
NS = 4   # cp.async ring depth (gemm_f16.cu)
W16 = -1  # the kernel's B-loader id of the f16 matrix

# name -> (BM, BN, WM, WN, MINB)
Config = tuple[int, int, int, int, int]
CONFIGS: dict[str, Config] = {
    "L": (256, 128, 64, 64, 1),  # 8 warps, 1 CTA per SM
    "M": (128, 128, 64, 64, 2),  # 4 warps, 2 CTAs per SM
    "M8": (128, 128, 64, 32, 2),  # 8 warps, 2 CTAs per SM (128 registers: Q6_K/Q8_0 spill a little)
    "S": (64, 64, 32, 32, 4),    # 4 warps, up to 4 CTAs per SM
}
# Throughput of each config with c CTAs resident per SM, as TFLOP/s were every SM so busy
# (index c - 1), by B loader: measured by bench/gemm_f16.py --sweep on the H200 (2026-11-29;
# c = 1 from shapes with fewer tiles than SMs, the largest c from the 2048 x 18944 x 3584 shape).
# Only pick_config reads them. Types without their own row use Q6_K's (the slowest decoder,
# which favours the large tile that is fastest once the GPU is full).
RATES: dict[str, dict[str, tuple[float, ...]]] = {
    "w16":  {"L": (319,), "M": (257, 341), "M8": (226, 325), "S": (128, 219, 236, 253)},
    "Q4_K": {"L": (287,), "M": (186, 254), "M8": (183, 241), "S": (101, 137, 155, 174)},
    "Q6_K": {"L": (244,), "M": (105, 144), "M8": (125, 161), "S": (68, 97, 107, 118)},
    "Q8_0": {"L": (282,), "M": (145,), "M8": (165,), "S": (82, 126, 157)},  # M, M8: 1 CTA/SM (smem)
}

SUPPORTED: frozenset[str] = frozenset(CUDA_TYPES)
_SMEM_PER_SM = 228 * 1024  # H100/H200: 228 KB per SM, 1 KB of it reserved per CTA
_SMEM_MAX_BLOCK = 227 * 1024


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def _raw_stride(qt: QuantType) -> int:
    """Geo<T>::RS of gemm_f16.cu: smem bytes per row of one staged chunk."""
    kc = 128 if qt.block_elems == 1 else 256
    cb = kc // qt.block_elems * qt.block_bytes
    al = math.gcd(qt.block_bytes, 16)
    return (cb + 16 - al + 15) // 16 * 16


def smem_bytes(qt: QuantType | None, cfg: Config) -> int:
    """Dynamic shared memory of one CTA: x ring, B tiles, raw chunks (qt None: the W16 loader)."""
    bm, bn = cfg[0], cfg[1]
    a = NS * bm * 64
    if qt is None:
        return a + NS * bn * 64
    return a + 2 * bn * 64 + 2 * bn * _raw_stride(qt)


def _bt(qt: QuantType | None) -> int:
    return W16 if qt is None else qt.ggml_id


def kernel_name(qt: QuantType | None, cfg: Config) -> str:
    bm, bn, wm, wn, minb = cfg
    return f"gemm_f16<{_bt(qt)}, {bm}, {bn}, {wm}, {wn}, {minb}>"


def names() -> tuple[str, ...]:
    out = [kernel_name(None, c) for c in CONFIGS.values()]
    out += [kernel_name(TYPES[t], c) for t in CUDA_TYPES for c in CONFIGS.values()]
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _fn(name: str, smem: int):
    return kernel("gemm_f16", name, names(), smem)


def pick_config(M: int, N: int, qt: QuantType | None = None) -> str:
    """The config with the least estimated time. T tiles on S SMs run c = min(occupancy,
    ceil(T / S)) at a time per SM, in ceil(T / (S c)) waves of c tiles each, at RATES[c]."""
    import cupy
    sms = sm_count(cupy.cuda.Device().id)
    rates = RATES["w16" if qt is None else qt.name if qt.name in RATES else "Q6_K"]
    best, best_cost = "L", None
    for name, cfg in CONFIGS.items():
        bm, bn, _, _, minb = cfg
        occ = max(1, min(minb, _SMEM_PER_SM // (smem_bytes(qt, cfg) + 1024)))
        tiles = -(-M // bm) * -(-N // bn)
        c = min(occ, -(-tiles // sms), len(rates[name]))
        waves = -(-tiles // (sms * c))
        cost = waves * c * bm * bn / rates[name][c - 1]
        if best_cost is None or cost < best_cost:
            best, best_cost = name, cost
    return best


def _stream(stream):
    return stream if stream is not None else contextlib.nullcontext()


def _check_x_out(x16, out, N: int, what: str):
    if x16.dtype != np.float16 or x16.ndim != 2 or not x16.flags.c_contiguous:
        raise ValueError(f"{what}: x16 must be C-contiguous float16 (M, K), got {x16.dtype} {tuple(x16.shape)}")
    M, K = x16.shape
    if K % 8 or x16.data.ptr % 16:
        raise ValueError(f"{what}: x16 rows must be 16-byte aligned (K % 8 == 0), got K = {K} at {x16.data.ptr:#x}")
    if out.dtype != np.float32 or out.shape != (M, N) or not out.flags.c_contiguous:
        raise ValueError(f"{what}: out must be C-contiguous float32 {(M, N)}, got {out.dtype} {tuple(out.shape)}")
    return M, K


def _launch(qt, w, rb: int, x16, out, M: int, N: int, K: int, config, stream, tile_expert=None, expert_bytes=0,
            bias=None):
    if M == 0 or N == 0:
        return
    cname = config or pick_config(M, N, qt)
    cfg = CONFIGS[cname]
    bm, bn, wm, wn, _ = cfg
    smem = smem_bytes(qt, cfg)
    if smem > _SMEM_MAX_BLOCK:
        raise ValueError(f"gemm_f16: config {cname} needs {smem} bytes of shared memory")
    threads = (bm // wm) * (bn // wn) * 32
    out_vec = int(N % 2 == 0 and out.data.ptr % 8 == 0)
    args = (x16, w, np.int64(rb), out, np.int32(M), np.int32(N), np.int32(K), np.int32(out_vec),
            np.uint64(0) if tile_expert is None else tile_expert, np.int64(expert_bytes),
            np.uint64(0) if bias is None else bias)
    with _stream(stream):
        _fn(kernel_name(qt, cfg), smem)((-(-M // bm), -(-N // bn)), (threads,), args, shared_mem=smem)


def gemm_w16(x16, w16, out, *, stream=None, config: str | None = None) -> None:
    """out (M, N) f32 = x16 (M, K) f16 @ w16 (N, K) f16 .T, f32 accumulation.

    All three C-contiguous cupy arrays, K % 8 == 0; config: a CONFIGS key (default: pick_config)."""
    if w16.dtype != np.float16 or w16.ndim != 2 or not w16.flags.c_contiguous:
        raise ValueError(f"gemm_w16: w16 must be C-contiguous float16 (N, K), got {w16.dtype} {tuple(w16.shape)}")
    N = w16.shape[0]
    M, K = _check_x_out(x16, out, N, "gemm_w16")
    if w16.shape[1] != K:
        raise ValueError(f"gemm_w16: w16 has {w16.shape[1]} columns, x16 {K}")
    if w16.data.ptr % 16:
        raise ValueError(f"gemm_w16: w16 at {w16.data.ptr:#x} is not 16-aligned")
    _launch(None, w16, 2 * K, x16, out, M, N, K, config, stream)


def fused_b(qt, w, x16, out, *, stream=None, config: str | None = None) -> None:
    """out (M, N) f32 = x16 (M, K) f16 @ f16(dequant(w)).T, dequantizing w's tiles on the fly.

    qt: QuantType or name (any of SUPPORTED); w: cupy uint8 (N, row_bytes(qt, K)), C-contiguous
    or a row slice of such, at its blocks' natural alignment; x16: C-contiguous f16 (M, K),
    K % 8 == 0 (and a multiple of the block); out: C-contiguous f32 (M, N).
    Bit-identical to gemm_w16(x16, dequant_f16 copy of w, out)."""
    qt = _qt(qt)
    if qt.name not in SUPPORTED:
        raise ValueError(f"fused_b: type {qt.name} not supported")
    N = w.shape[0] if w.ndim == 2 else -1
    M, K = _check_x_out(x16, out, N, f"fused_b {qt.name}")
    rb = check_rows(qt, w, K)
    _launch(qt, w, rb, x16, out, M, N, K, config, stream)


GROUPED_CONFIG = "S"  # an MoE's expert groups are padded to its BM (64 rows): see backend/moe.py's align


def fused_b_grouped(qt, w, n_expert: int, x16, tile_expert, out, *, stream=None, bias=None) -> None:
    """An MoE prefill's projection in one launch: out (Mp, R) f32 row block t of BM rows =
    x16's rows of that block @ f16(dequant(expert tile_expert[t] of w)).T. w: the stacked experts
    (n_expert * R, row_bytes) uint8, expert e its rows e*R ..; x16 (Mp, K) f16, Mp a multiple of
    BM (GROUPED_CONFIG's); tile_expert (Mp / BM,) int32 on the device, values < n_expert, or -1
    for a tile to skip (its rows of out stay as they were). bias: f32 (n_expert, R), each tile's
    expert's row added in the epilogue (one f32 add, as adding it after would)."""
    qt = _qt(qt)
    if qt.name not in SUPPORTED:
        raise ValueError(f"fused_b_grouped: type {qt.name} not supported")
    if n_expert < 1 or w.ndim != 2 or w.shape[0] % n_expert:
        raise ValueError(f"fused_b_grouped: {tuple(w.shape)} weight rows are not {n_expert} experts' stacked")
    R = w.shape[0] // n_expert
    M, K = _check_x_out(x16, out, R, f"fused_b_grouped {qt.name}")
    rb = check_rows(qt, w, K)
    bm = CONFIGS[GROUPED_CONFIG][0]
    if M % bm or tile_expert.dtype != np.int32 or tile_expert.shape != (M // bm,):
        raise ValueError(f"fused_b_grouped: {M} rows in tiles of {bm} with tile_expert {tile_expert.dtype} "
                         f"{tuple(tile_expert.shape)}")
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (n_expert, R) or not bias.flags.c_contiguous):
        raise ValueError(f"fused_b_grouped: bias must be C-contiguous float32 {(n_expert, R)}, got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    _launch(qt, w, rb, x16, out, M, R, K, GROUPED_CONFIG, stream, tile_expert, R * rb, bias)
