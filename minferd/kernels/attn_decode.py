"""Launcher of attn_decode.cu: batched decode attention over a paged f16 KV cache, and its NumPy
reference `attn_decode_ref`.

    attn_decode(q, k_cache, v_cache, block_tables, ctx_lens, out, *, block_size, window, scale,
                splits, xq=None)

Sequence b's one query q[b] (hq, d) sits at position ctx_lens[b] - 1 and attends the keys at
positions [lo, ctx_lens[b]), lo = max(0, ctx_lens[b] - window) if window > 0 else 0; position t
lives at slot block_tables[b, t // block_size] * block_size + t % block_size of k_cache /
v_cache (n_slots, hkv, d). Query head h reads kv head h // (hq // hkv). out[b] (hq * d) =
softmax(scale * q.k) @ v per head in f32; a row with ctx_lens[b] == 0 (padding) gets zeros and
its block table is never read.

Two kernels on the current stream: split-K partials (`splits` contiguous shares of each
sequence's keys, one CTA per (split, kv head, sequence) serving the whole GQA group, by tensor
cores for d <= 128 and f32 FMAs otherwise: KERNEL_BY_D; both match f32 math to ~1e-6), then a
merge. The grid depends on the arguments alone, nothing is read back from the device and
nothing synchronises, so the call can be captured in a CUDA graph and replayed with new
ctx_lens / block table contents; pick `splits` for the largest context the graph will see
(`splits_for`). The partials buffers come from CuPy's current allocator (cp.empty): under
capture that must be a pool that does not cudaMalloc and does not hand the blocks to anyone
else while the graph lives (the CUDA backend's arena). The first call for a head dim compiles
and loads the kernels: make it outside any capture.

xq (batches of up to 8, what the mat-vec kernels take): the merge also leaves out in the
mat-vec kernels' int8 format (xquant.cuh, mmvq.py's xq_layout(B, hq * d)), so the next
projection need not quantize it. Either the uint8 scratch itself (256-aligned, at least
mmvq.scratch_bytes(B, hq * d) bytes), or the three kernel arguments already built from one,
(xq_ptr, xds_ptr, kbp), as CudaBackend._xq_args returns them.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import kernel
from .mmvq import MAX_COLS, scratch_bytes, xq_layout

HEAD_DIMS = tuple(range(32, 257, 32))  # d % 32 == 0 (the merge quantizes whole 32-blocks), d <= 256
GMAX = 8                # query heads per CTA at most (larger groups: chunks of 8)
GROUPS = tuple(range(1, GMAX + 1))  # a kernel per group size: no FMA spent on heads that are not there
MAX_SPLITS = 128        # the merge's first warp holds 4 splits per lane
MAX_BATCH = 256
MIN_SHARE = 128         # keys: splits_for never makes shares shorter (2 tiles at d <= 128)
MERGE_THREADS = 512
THREADS = 128           # a split CTA (attn_decode.cu's NT)
_ROW_PAD = 8
TC_HEAD_DIMS = (32, 64, 96, 128)  # where the tensor-core kernel exists
# The partials kernel by head dim: "tc" (tensor cores, hi/lo f16 operands) or "simt" (f32 FMAs).
KERNEL_BY_D = {d: "tc" if d in TC_HEAD_DIMS else "simt" for d in HEAD_DIMS}


def tile_keys(d: int, kind: str = "simt") -> int:
    return 64 if kind == "tc" or d <= 128 else 32


def smem_bytes(d: int, gm: int) -> int:
    """Dynamic shared memory of attn_decode_split<d, gm>: attn_decode.cu's Cfg::BYTES."""
    tk, row, nc = tile_keys(d), d + _ROW_PAD, d // 8
    gp = gm if gm <= 2 else (gm + 3) // 4 * 4
    ks = THREADS // nc
    a = max(2 * 2 * tk * row * 2, ks * gm * d * 4)  # two K/V stages, or the final key-phase partials
    return a + gm * d * 4 + 4 * gm * tk * 4 + tk * gp * 4 + (gp * 4 + 15) // 16 * 16


def smem_bytes_tc(d: int) -> int:
    """Dynamic shared memory of attn_decode_tc<d>: attn_decode.cu's CfgTC::BYTES."""
    a = max(2 * 2 * 64 * (d + _ROW_PAD) * 2, 4 * GMAX * d * 4)
    return a + 4 * 2 * GMAX * 16 * 2 + 4 * GMAX * 2 * 4


def resident(d: int) -> int:
    """Split CTAs per SM the kernel for d runs at (shared memory; registers allow 3): what
    splits_for fills the GPU with."""
    per = smem_bytes_tc(d) if KERNEL_BY_D[d] == "tc" and d in TC_HEAD_DIMS else smem_bytes(d, GMAX)
    return max(1, min(3, 233472 // (per + 1024)))  # H100/H200: 228 KB per SM, 1 KB reserved per CTA


def _split_name(d: int, gm: int) -> str:
    return f"attn_decode_split<{d}, {gm}>"


def _tc_name(d: int) -> str:
    return f"attn_decode_tc<{d}>"


def _merge_name(d: int) -> str:
    return f"attn_decode_merge<{d}>"


def names(d: int | None = None) -> tuple[str, ...]:
    """The template instances of one head dim (one module each: a model compiles only its own),
    or of all of them (bench/nvrtc_check.py)."""
    ds = HEAD_DIMS if d is None else (d,)
    return tuple(n for dd in ds
                 for n in [_split_name(dd, g) for g in GROUPS] + ([_tc_name(dd)] if dd in TC_HEAD_DIMS else [])
                 + [_merge_name(dd)])


@functools.lru_cache(maxsize=None)
def _split_fn(d: int, gm: int):
    return kernel("attn_decode", _split_name(d, gm), names(d), smem_bytes(d, gm))


@functools.lru_cache(maxsize=None)
def _tc_fn(d: int):
    return kernel("attn_decode", _tc_name(d), names(d), smem_bytes_tc(d))


@functools.lru_cache(maxsize=None)
def _merge_fn(d: int):
    return kernel("attn_decode", _merge_name(d), names(d))


def splits_for(B: int, hkv: int, max_ctx: int, n_sm: int = 132, *, d: int = 128) -> int:
    """A fixed split count for batches of B sequences over hkv kv heads (head dim d) and
    contexts up to max_ctx: one resident wave of split CTAs (resident(d) per SM; on the H200 a
    second, partial wave cost more than the longer shares of one), but no share shorter than
    MIN_SHARE keys (below that a CTA's fixed cost, its q load, the first tile's latency and the
    partial it writes, outweighs what it reads); 1..MAX_SPLITS."""
    if B < 1 or hkv < 1 or max_ctx < 0 or n_sm < 1 or d not in HEAD_DIMS:
        raise ValueError(f"splits_for: B={B}, hkv={hkv}, max_ctx={max_ctx}, n_sm={n_sm}, d={d}")
    want = resident(d) * n_sm // (B * hkv)
    by_keys = -(-max_ctx // MIN_SHARE)
    return max(1, min(MAX_SPLITS, want, by_keys))


def _fail(msg: str):
    raise ValueError(f"attn_decode: {msg}")


def _check_array(cp, a, what: str, dtype, ndim: int):
    if not isinstance(a, cp.ndarray):
        _fail(f"{what} must be a cupy array, got {type(a).__name__}")
    if a.dtype != dtype or a.ndim != ndim:
        _fail(f"{what} must be {np.dtype(dtype).name} with {ndim} dims, got {a.dtype} {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        _fail(f"{what} must be C-contiguous")
    if a.device.id != cp.cuda.Device().id:
        _fail(f"{what} is on device {a.device.id}, the current device is {cp.cuda.Device().id}")


def _xq_args(cp, xq, B: int, K: int) -> tuple:
    """The merge's (xq, xds, kbp) arguments: zeros for none."""
    if xq is None:
        return (np.uint64(0), np.uint64(0), np.int32(0))
    if B > MAX_COLS:
        _fail(f"xq is the mat-vec format of batches up to {MAX_COLS}, got B = {B}")
    off, kbp, need = xq_layout(B, K)
    if isinstance(xq, tuple):
        if len(xq) != 3:
            _fail(f"xq as arguments is (xq_ptr, xds_ptr, kbp), got {len(xq)} items")
        p, pds, kb = (int(v) for v in xq)
        if kb != kbp or p == 0 or p % 256 or pds != p + off:
            _fail(f"xq arguments ({p:#x}, {pds:#x}, {kb}) are not the layout of ({B}, {K}): "
                  f"xds at xq + {off}, kbp {kbp}, xq 256-aligned")
        return (np.uint64(p), np.uint64(pds), np.int32(kb))
    if not isinstance(xq, cp.ndarray) or xq.dtype != np.uint8 or not xq.flags.c_contiguous:
        _fail("xq must be a C-contiguous cupy uint8 scratch or an (xq_ptr, xds_ptr, kbp) tuple")
    if xq.nbytes < need:
        _fail(f"xq scratch of {xq.nbytes} bytes, ({B}, {K}) needs {scratch_bytes(B, K)}")
    if xq.data.ptr % 256:
        _fail("xq scratch must be 256-aligned")
    if xq.device.id != cp.cuda.Device().id:
        _fail(f"xq is on device {xq.device.id}, the current device is {cp.cuda.Device().id}")
    p = xq.data.ptr
    return (np.uint64(p), np.uint64(p + off), np.int32(kbp))


def attn_decode(q, k_cache, v_cache, block_tables, ctx_lens, out, *, block_size: int, window: int, scale: float,
                splits: int, xq=None, sinks=None) -> None:
    """See the module doc. q (B, hq, d) f32; k_cache, v_cache (n_slots, hkv, d) f16; block_tables
    (B, max_blocks) int32; ctx_lens (B,) int32; out (B, hq * d) f32; all C-contiguous cupy arrays
    on the current device. Raises ValueError naming the first argument that does not fit."""
    import cupy as cp
    _check_array(cp, q, "q", np.float32, 3)
    B, hq, d = q.shape
    if not 1 <= B <= MAX_BATCH:
        _fail(f"batch of {B} sequences, expected 1..{MAX_BATCH}")
    if d not in HEAD_DIMS:
        _fail(f"head dim {d}: a multiple of 32 up to 256")
    _check_array(cp, k_cache, "k_cache", np.float16, 3)
    _check_array(cp, v_cache, "v_cache", np.float16, 3)
    if k_cache.shape != v_cache.shape:
        _fail(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    n_slots, hkv, dk = k_cache.shape
    if dk != d:
        _fail(f"cache head dim {dk}, q's {d}")
    if hkv < 1 or hq % hkv:
        _fail(f"{hq} query heads over {hkv} kv heads")
    if not 1 <= n_slots < 2 ** 31:
        _fail(f"cache of {n_slots} slots")
    if k_cache.data.ptr % 16 or v_cache.data.ptr % 16:
        _fail("k_cache and v_cache must be 16-byte aligned (16-byte async copies)")
    _check_array(cp, block_tables, "block_tables", np.int32, 2)
    if block_tables.shape[0] != B or block_tables.shape[1] < 1:
        _fail(f"block_tables {tuple(block_tables.shape)}, expected ({B}, max_blocks >= 1)")
    _check_array(cp, ctx_lens, "ctx_lens", np.int32, 1)
    if ctx_lens.shape != (B,):
        _fail(f"ctx_lens {tuple(ctx_lens.shape)}, expected ({B},)")
    _check_array(cp, out, "out", np.float32, 2)
    if out.shape != (B, hq * d):
        _fail(f"out {tuple(out.shape)}, expected ({B}, {hq * d})")
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 16 \
            or block_size & (block_size - 1):
        _fail(f"block_size {block_size}: a power of two >= 16")
    max_blocks = block_tables.shape[1]
    if max_blocks * block_size > 2 ** 30:
        _fail(f"{max_blocks} blocks of {block_size} keys: positions past 2**30")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        _fail(f"window {window}: an int >= 0 (0: none)")
    if not isinstance(scale, (int, float, np.floating)) or not math.isfinite(scale):
        _fail(f"scale {scale!r}: a finite float")
    if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or not 1 <= splits <= MAX_SPLITS:
        _fail(f"splits {splits}: an int in 1..{MAX_SPLITS}")
    xargs = _xq_args(cp, xq, B, hq * d)
    sink = np.uint64(0)
    if sinks is not None:  # gpt-oss: the merge adds them, so there is one (an empty split weighs 0)
        _check_array(cp, sinks, "sinks", np.float32, 1)
        if sinks.shape != (hq,):
            _fail(f"sinks {tuple(sinks.shape)}, expected ({hq},)")
        sink, splits = np.uint64(sinks.data.ptr), max(2, splits)

    if splits == 1:  # nothing to merge: the partials kernel finishes out (and its int8 form) itself
        _launch_split(q, k_cache, v_cache, block_tables, ctx_lens, 1, None, None, block_size, window, scale,
                      out=out, xargs=xargs)
        return
    part_o = cp.empty((B, hq, splits, d), cp.float32)
    part_ml = cp.empty((B, hq, splits, 2), cp.float32)
    _launch_split(q, k_cache, v_cache, block_tables, ctx_lens, splits, part_o, part_ml, block_size, window, scale)
    _launch_merge(part_o, part_ml, out, xargs, sink)


_NONE = (np.uint64(0), np.uint64(0), np.int32(0))


def _launch_split(q, k_cache, v_cache, block_tables, ctx_lens, splits, part_o, part_ml, block_size, window, scale,
                  *, out=None, xargs=_NONE):
    """The partials kernel alone, on arguments attn_decode has checked (bench/attn_decode.py
    times it apart); with out (splits == 1) it writes the finished output instead, part_o and
    part_ml unused. Group chunks of up to GMAX query heads per CTA."""
    B, hq, d = q.shape
    n_slots, hkv = k_cache.shape[0], k_cache.shape[1]
    null = np.uint64(0)
    group = hq // hkv
    nch = -(-group // GMAX)
    qscale = np.float32(float(scale) * math.log2(math.e))  # the kernels take exp2
    args = (q, k_cache, v_cache, block_tables, ctx_lens, null if part_o is None else part_o,
            null if part_ml is None else part_ml, np.int32(hq), np.int32(hkv),
            np.int32(group), np.int32(nch), np.int32(n_slots), np.int32(block_tables.shape[1]),
            np.int32(int(block_size).bit_length() - 1), np.int32(window), qscale, np.int32(splits),
            null if out is None else out) + tuple(xargs)
    grid = (int(splits), hkv * nch, B)
    if KERNEL_BY_D[d] == "tc" and d in TC_HEAD_DIMS:
        _tc_fn(d)(grid, (THREADS,), args, shared_mem=smem_bytes_tc(d))
    else:
        gm = min(group, GMAX)
        _split_fn(d, gm)(grid, (THREADS,), args, shared_mem=smem_bytes(d, gm))


def _launch_merge(part_o, part_ml, out, xargs, sinks=np.uint64(0)):
    """The merge kernel alone: D/4 float4 columns x split groups (at least 4, so the first D
    threads exist to finish; at most what MERGE_THREADS holds, or one group per split)."""
    B, hq, splits, d = part_o.shape
    v4 = d // 4
    groups = max(4, min(MERGE_THREADS // v4, splits))
    _merge_fn(d)((B * hq,), (v4 * groups,), (part_o, part_ml, out, np.int32(hq), np.int32(splits), sinks) + tuple(xargs))


def attn_decode_ref(q, k_cache, v_cache, block_tables, ctx_lens, *, block_size: int, window: int,
                    scale: float, sinks=None) -> np.ndarray:
    """What attn_decode computes, in float64 NumPy: (B, hq * d). Takes NumPy arrays (the
    argument meanings of attn_decode)."""
    sink = None if sinks is None else np.asarray(sinks, np.float64)
    q = np.asarray(q, np.float64)
    k = np.asarray(k_cache)
    v = np.asarray(v_cache)
    bt = np.asarray(block_tables)
    lens = np.asarray(ctx_lens)
    B, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    out = np.zeros((B, hq * d), np.float64)
    for b in range(B):
        n = int(lens[b])
        if n <= 0:
            continue  # padding row: zeros, table unread
        lo = max(0, n - window) if window > 0 else 0
        pos = np.arange(lo, n)
        slots = bt[b, pos // block_size].astype(np.int64) * block_size + pos % block_size
        kb = k[slots].astype(np.float64)  # (L, hkv, d)
        vb = v[slots].astype(np.float64)
        qb = q[b].reshape(hkv, g, d)
        s = np.einsum("kgd,lkd->kgl", qb, kb) * scale
        mx = s.max(axis=-1, keepdims=True) if sink is None else \
            np.maximum(s.max(axis=-1, keepdims=True), sink.reshape(hkv, g, 1))
        p = np.exp(s - mx)
        extra = 0.0 if sink is None else np.exp(sink.reshape(hkv, g, 1) - mx)
        p /= p.sum(axis=-1, keepdims=True) + extra
        out[b] = np.einsum("kgl,lkd->kgd", p, vb).reshape(hq * d)
    return out
