"""Launcher of tcgemv_glu.cu: a short prompt's gated activation in the gate / up products' launch,
    y (M, N) f32 = act(x @ dequant(Wg).T) * (x @ dequant(Wu).T),  y16 its f16 rounding,
for 1-32 tokens (act "silu": SwiGLU, "gelu": Gemma's GeGLU). tcgemv's K loop runs on both matrices,
half a CTA's warps on each, in one split or in a cluster of splits (tcgemv's count for these CTAs);
where that count would need global partials there is no fused launch (fused_splits says None) and
the caller keeps tcgemv_group and the activation kernel. Enqueues work only (graph capture safe).
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import kernel
from .dequant import check_rows
from .mmq_small import sm_count
from .quant import TYPES, QuantType, by_name
from .tcgemv import (CLUSTERS, CONFIG, CONFIGS, NT8S, SUPPORTED, check_inputs, clustered_at, nt8, row_tiles,
                     smem_bytes, splits)

MAX_M = 32  # where tcgemv's splits meet in a cluster, or there is one (tcgemv.groups_at)
ACTS = {"silu": 0, "gelu": 1}


def kernel_name(qt: QuantType, M: int, config: str = CONFIG, cluster: int = 1) -> str:
    kw, pf = CONFIGS[config][:2]
    args = f"{qt.ggml_id}, {nt8(M)}, {row_tiles(M, qt, config)}, {kw}, {pf}"
    return f"tcgemv_glu_cl<{args}, {cluster}>" if cluster > 1 else f"tcgemv_glu<{args}>"


def names() -> tuple[str, ...]:
    out = []
    for t in sorted(SUPPORTED):
        for n in (n for n in NT8S if 8 * n <= MAX_M):
            for c, conf in CONFIGS.items():
                for cl in (1,) + (CLUSTERS if conf[4] is not False else ()):
                    name = kernel_name(TYPES[t], 8 * n, c, cl)
                    if name not in out:
                        out.append(name)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _fn(name: str, smem: int):
    return kernel("tcgemv_glu", name, names(), smem)


def rows_per_cta(M: int, qt: QuantType, config: str = CONFIG) -> int:
    """Rows of gate (and the same of up) a CTA makes: half its warps' tiles each."""
    return 16 * row_tiles(M, qt, config) * CONFIGS[config][0] // 2


def fused_splits(qt, N: int, K: int, M: int, sms: int, config: str = CONFIG) -> int | None:
    """The K splits of the fused launch (1, or a cluster's size), or None where it has none: past
    MAX_M tokens, a type tcgemv lacks, or a split count that would need global partials."""
    qt = _qt(qt)
    if not 1 <= M <= MAX_M or qt.name not in SUPPORTED or K % qt.block_elems or K % 32:
        return None
    s = splits(qt, N, K // qt.block_elems, M, sms, config, tiles=-(-N // rows_per_cta(M, qt, config)))
    return s if s == 1 or clustered_at(M, K, config) else None


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def _check_out(a, dtype, shape, what: str) -> None:
    if a.dtype != dtype or tuple(a.shape) != shape or not a.flags.c_contiguous:
        raise ValueError(f"tcgemv_glu: {what} must be C-contiguous {np.dtype(dtype).name} {shape}, "
                         f"got {a.dtype} {tuple(a.shape)}")


def glu(qt, wg, wu, x16, y, y16, act: str = "silu", *, stream=None, config: str = CONFIG,
        split: int | None = None) -> None:
    """y = act(x16 @ dequant(wg).T) * (x16 @ dequant(wu).T), y16 = y rounded to f16.

    qt: a tcgemv type; wg, wu: cupy uint8 (N, row_bytes) rows of gate and up; x16: cupy f16 (M, K),
    C-contiguous, 16-aligned, 1 <= M <= MAX_M; y: f32 (M, N); y16: f16 (M, N); act: a key of ACTS;
    split: 1 or a cluster size instead of fused_splits' count (tests, benchmarks).
    Raises ValueError where fused_splits is None."""
    qt = _qt(qt)
    M, K = check_inputs("tcgemv_glu", qt, x16, config, MAX_M)
    if act not in ACTS:
        raise ValueError(f"tcgemv_glu: act {str(act)[:20]!r} is not one of {', '.join(ACTS)}")
    rb = check_rows(qt, wg, K, "gate")
    check_rows(qt, wu, K, "up")
    if wg.shape != wu.shape:
        raise ValueError(f"tcgemv_glu: gate {tuple(wg.shape)} and up {tuple(wu.shape)} differ")
    N = wg.shape[0]
    _check_out(y, np.float32, (M, N), "y")
    _check_out(y16, np.float16, (M, N), "y16")
    import cupy
    s = fused_splits(qt, N, K, M, sm_count(cupy.cuda.Device().id), config)
    if s is None:
        raise ValueError(f"tcgemv_glu: {N} rows of K = {K} at {M} tokens would split K into global partials")
    if split is not None:
        if split not in ((1,) + CLUSTERS if clustered_at(M, K, config) else (1,)):
            raise ValueError(f"tcgemv_glu: {split} K splits: 1 or a cluster size {CLUSTERS} where they meet in one")
        s = split
    if N == 0:
        return
    nb, kw = K // qt.block_elems, CONFIGS[config][0]
    grid, block, smem = (-(-N // rows_per_cta(M, qt, config)), s), (kw * 32,), smem_bytes(M)
    args = (wg, wu, np.int32(N), np.int64(rb), np.int32(nb), np.int32(M), np.int32(K))
    with stream if stream is not None else contextlib.nullcontext():
        if s == 1:
            _fn(kernel_name(qt, M, config), smem)(grid, block, args + (x16, np.int32(ACTS[act]), y, y16),
                                                  shared_mem=smem)
        else:  # the parked sums and the added ones fit in the x buffers
            ne = 4 * row_tiles(M, qt, config) * nt8(M)
            assert 4 * (ne + -(-ne // s)) * 32 * kw <= smem
            _fn(kernel_name(qt, M, config, s), smem)(
                grid, block, args + (np.int32(-(-nb // s)), x16, np.int32(ACTS[act]), y, y16), shared_mem=smem)
