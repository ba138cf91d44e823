"""Launcher of tcgemv.cu: out (M, N) f32 = x (M, K) @ dequant(W).T (+ bias) (+ residual) for batches
of up to MAX_M tokens, W's quantized bytes decoded in registers into f16 mma fragments.

x comes as the f16 copy the cuBLAS path reads (rmsnorm and the gated activation write it; the
backend casts other inputs once, CudaMatmuls._as_f16), so a matmul is one launch. Where K is split
over CTAs the splits meet either in global partials and a second launch that adds them, the bias
and the residual (mmq_small's split sum), or, in a cluster config, inside one launch: a row
tile's 2, 4 or 8 splits are one thread-block cluster (sm_90) and add up in distributed shared memory.
Both only enqueue work on the current (or given) stream: no allocation when the caller passes the
partials, no synchronisation (safe inside CUDA graph capture).
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import kernel
from .dequant import check_rows
from .mmq_small import check_epilogue, partials, ptr, sm_count, split_sum
from .quant import TYPES, QuantType, by_name

SUPPORTED: frozenset[str] = frozenset({"IQ4_NL", "IQ4_XS", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"})
MAX_M = 64
NT8S = (1, 2, 4, 8)  # 8-token tiles: batches of <= 8 (beside mmvq, for bench/crossover.py), 16, 32, 64
# name -> (warps a CTA, each on its own rows, all sharing the CTA's staged x; blocks ahead of the
# one it decodes a warp has loads in flight for; 16-row tiles a warp holds, 0: row_tiles' choice;
# CTAs an SM the K splits aim at; splits meet in a cluster, not in global partials).
# bench/mmq_small.py times them; CONFIG runs.
# None: in a cluster where that measured faster (clustered_at). (Session 9 timed nopf (4, 0, 0, 4)
# and pf2 (4, 2, 0, 4) too: bench/NOTES.md.)
CONFIGS: dict[str, tuple[int, int, int, int, bool | None]] = {
    "base": (4, 1, 0, 4, False), "cl": (4, 1, 0, 4, True), "auto": (4, 1, 0, 4, None)}
CONFIG = "auto"
MAX_PART_BYTES = 16 << 20
CLUSTERS = (2, 4, 8)  # the portable cluster sizes: a cluster config's splits


def _qt(qt) -> QuantType:
    return by_name(qt) if isinstance(qt, str) else qt


def nt8(M: int) -> int:
    if not 1 <= M <= MAX_M:
        raise ValueError(f"tcgemv: {M} tokens, outside 1..{MAX_M}")
    return next(t for t in NT8S if 8 * t >= M)


def row_tiles(M: int, qt: QuantType, config: str = CONFIG) -> int:
    """16-row tiles a warp holds: two share each x fragment where x traffic would bind (33-64
    tokens, or as the config says), but not for Q6_K, whose two tiles' decode state passes 255
    registers (ptxas -v)."""
    if qt.name == "Q6_K":
        return 1
    return CONFIGS[config][2] or (2 if nt8(M) == 8 else 1)


def clustered_at(M: int, K: int, config: str = CONFIG) -> bool:
    """Whether the config's splits meet in a cluster at M tokens and K. auto: up to 32 tokens at
    K <= 8192 (bench/mmq_small.py, H200, 2026-12-01 s10: 3584 x 3584 at 16 tokens 8.8 us against
    9.9, 18944 x 3584 25.2 against 27.2; the 18944-wide K of ffn_down and most of 64 tokens ran
    faster on partials, whose 10 splits a cluster of at most 8 cannot match)."""
    c = CONFIGS[config][4]
    return (M <= 32 and K <= 8192) if c is None else c


def kernel_name(qt: QuantType, M: int, config: str = CONFIG, cluster: int = 1, group: bool = False) -> str:
    """The instance a launch of M tokens takes: tcgemv (one matrix), tcgemv_g (a group in one
    split) or tcgemv_cl (in a cluster of `cluster` splits, one matrix or a group)."""
    kw, pf = CONFIGS[config][:2]
    args = f"{qt.ggml_id}, {nt8(M)}, {row_tiles(M, qt, config)}, {kw}, {pf}"
    if cluster > 1:
        return f"tcgemv_cl<{args}, {cluster}>"
    return f"tcgemv_g<{args}>" if group else f"tcgemv<{args}>"


def names() -> tuple[str, ...]:
    out = []
    for t in sorted(SUPPORTED):
        for n in NT8S:
            for c, conf in CONFIGS.items():
                for cl in (1,) + (CLUSTERS if conf[4] is not False else ()):
                    for group in (False, True) if cl == 1 and groups_at(8 * n, 256, c) else (False,):
                        name = kernel_name(TYPES[t], 8 * n, c, cl, group)
                        if name not in out:
                            out.append(name)
    return tuple(out)


def smem_bytes(M: int, K_stage: int = 256) -> int:
    """The two staged x buffers a CTA holds (tcgemv.cu smem_bytes_of: rows of 256 elements padded
    by 32, which serves the 16-pad types too)."""
    return 2 * 8 * nt8(M) * (K_stage + 32) * 2


@functools.lru_cache(maxsize=None)
def _fn(name: str, smem: int):
    return kernel("tcgemv", name, names(), smem)  # 64 tokens pass the default 48 KB


def _stream(stream):
    return stream if stream is not None else contextlib.nullcontext()


def rows_per_cta(M: int, qt: QuantType, config: str = CONFIG) -> int:
    return 16 * row_tiles(M, qt, config) * CONFIGS[config][0]


def splits(qt: QuantType, N: int, nb: int, M: int, sms: int, config: str = CONFIG, tiles: int | None = None) -> int:
    """K splits (of whole blocks) per CTA's rows: the config's CTAs on every SM; with partials,
    those under MAX_PART_BYTES and no split empty; in a cluster, 1 or a cluster size (the last
    split may be empty: it adds zeros). tiles: a group's row tiles (default N's)."""
    tiles = tiles or -(-N // rows_per_cta(M, qt, config))
    s = max(1, min(nb, -(-CONFIGS[config][3] * sms // tiles)))
    if clustered_at(M, nb * qt.block_elems, config):
        return max((c for c in (1,) + CLUSTERS if c <= s))
    while s > 1 and s * M * N * 4 > MAX_PART_BYTES:
        s -= 1
    return _none_empty(nb, s)


def _none_empty(nb: int, s: int) -> int:
    """s splits of nb blocks as the launch makes them (ceil(nb / s) blocks each), less any left empty."""
    return -(-nb // -(-nb // s))


def part_bytes(M: int, N: int, K: int, qt, sms: int, config: str = CONFIG) -> int:
    qt = _qt(qt)
    s = splits(qt, N, K // qt.block_elems, M, sms, config)
    return 0 if s == 1 or clustered_at(M, K, config) else s * M * N * 4


def scratch_bound(widest: int) -> int:
    """The partials one matmul takes at most (x is the backend's f16 copy, counted as cuBLAS's)."""
    return MAX_PART_BYTES


def ctas_per_sm(qt, M: int, config: str = CONFIG) -> int:
    """CTAs of the config's kernel for M tokens one SM holds (registers and the x buffers)."""
    qt = _qt(qt)
    return _fn(kernel_name(qt, M, config), smem_bytes(M)).ctas_per_sm(32 * CONFIGS[config][0], smem_bytes(M))


def tcgemv(qt, w, x16, out, *, bias=None, residual=None, part=None, stream=None, config: str = CONFIG,
           split: int | None = None) -> None:
    """out (M, N) = x16 @ dequant(w).T (+ bias (N,)) (+ residual (M, N)).

    qt: a SUPPORTED type; w: cupy uint8 (N, row_bytes) rows (C-contiguous or a row slice);
    x16: cupy f16 (M, K) C-contiguous, 16-aligned, 1 <= M <= MAX_M, K % 32 == 0;
    part: f32 scratch of >= part_bytes(...) bytes when that is not 0 (None: allocated);
    config: a CONFIGS key, split: the K splits instead of splits()'s (benchmarks and tests; a
    cluster config takes 1 or a cluster size)."""
    tcgemv_group(qt, [w], x16, [out], biases=[bias], residual=residual, part=part, stream=stream, config=config,
                 split=split)


MAX_GROUP = 3


def groups_at(M: int, K: int, config: str = CONFIG) -> bool:
    """Whether several matrices may share a launch at M tokens and K: up to 32 tokens where splits
    meet in a cluster (a group's partials would need a split sum a matrix)."""
    return M <= 32 and clustered_at(M, K, config)


def tcgemv_group(qt, ws, x16, outs, *, biases=None, residual=None, part=None, stream=None, config: str = CONFIG,
                 split: int | None = None) -> None:
    """outs[i] = x16 @ dequant(ws[i]).T (+ biases[i]) for up to MAX_GROUP matrices of one type and K
    that read the same x (q/k/v, gate/up) in ONE launch, the K splits counted over all their row
    tiles; more than one only where groups_at(M, K); residual and part only with one matrix.
    Arguments as tcgemv's."""
    qt = _qt(qt)
    if config not in CONFIGS:
        raise ValueError(f"tcgemv: unknown config {config!r}")
    if qt.name not in SUPPORTED:
        raise ValueError(f"tcgemv: type {qt.name} not supported (supported: {', '.join(sorted(SUPPORTED))})")
    if x16.dtype != np.float16 or x16.ndim != 2 or not x16.flags.c_contiguous or x16.data.ptr % 16:
        raise ValueError(f"tcgemv: x16 must be C-contiguous 16-aligned float16 (M, K), got {x16.dtype} {tuple(x16.shape)}")
    M, K = x16.shape
    nt8(M)  # 1..MAX_M
    if K == 0 or K % 32:
        raise ValueError(f"tcgemv: K = {K} is not a positive multiple of 32")
    if K % qt.block_elems:
        raise ValueError(f"tcgemv: K = {K} is not a multiple of {qt.name}'s {qt.block_elems}-element block")
    biases = list(biases or [None] * len(ws))
    if not 1 <= len(ws) <= MAX_GROUP or len(outs) != len(ws) or len(biases) != len(ws):
        raise ValueError(f"tcgemv: 1..{MAX_GROUP} matrices with one output and one bias slot each, "
                         f"got {len(ws)} / {len(outs)} / {len(biases)}")
    if len(ws) > 1 and (residual is not None or part is not None or not groups_at(M, K, config)):
        raise ValueError(f"tcgemv: a group of {len(ws)} matrices takes no residual or partials, and shares a "
                         f"launch only where its splits meet in a cluster (not at {M} tokens, K = {K})")
    Ns = [w.shape[0] if w.ndim == 2 else -1 for w in ws]
    rb = [check_rows(qt, w, K) for w in ws][0]  # one type and K: one row size
    for out, b, N in zip(outs, biases, Ns):
        check_epilogue("tcgemv", out, b, residual, M, N)
    rpc = rows_per_cta(M, qt, config)
    tiles = [-(-N // rpc) for N in Ns]
    if sum(tiles) == 0:
        return
    import cupy
    nb = K // qt.block_elems
    if split is None:
        s = splits(qt, Ns[0], nb, M, sm_count(cupy.cuda.Device().id), config, tiles=sum(tiles))
    elif not 1 <= split <= nb or (clustered_at(M, K, config) and split not in (1,) + CLUSTERS):
        raise ValueError(f"tcgemv: {split} K splits for {nb} blocks under config {config!r}")
    else:  # a cluster takes its size as given (an empty split adds zeros), partials none empty
        s = split if clustered_at(M, K, config) else _none_empty(nb, split)
    kw, cluster = CONFIGS[config][0], clustered_at(M, K, config) and s > 1
    need = 0 if s == 1 or cluster else s * M * Ns[0] * 4
    smem = smem_bytes(M)
    grid, block = (sum(tiles), s), (kw * 32,)
    with _stream(stream):
        if cluster or len(ws) > 1:  # the group's kernels: tcgemv_cl, or tcgemv_g in one split
            pad = MAX_GROUP - len(ws)
            args = (*(list(ws) + [ws[-1]] * pad), *(np.int32(n) for n in Ns + [0] * pad),
                    np.int32(tiles[0]), np.int32(sum(tiles[:2])), *(list(outs) + [outs[-1]] * pad),
                    *(ptr(b) for b in biases + [None] * pad),
                    np.int64(rb), np.int32(nb), np.int32(M), np.int32(K), np.int32(-(-nb // s)), x16)
            if cluster:  # the sums a CTA parks for its cluster fit in its x buffers
                assert 4 * (4 * row_tiles(M, qt, config) * nt8(M)) * (32 * kw) <= smem
                _fn(kernel_name(qt, M, config, s), smem)(grid, block, args + (ptr(residual),), shared_mem=smem)
            else:
                _fn(kernel_name(qt, M, config, group=True), smem)(grid, block, args, shared_mem=smem)
        else:
            part = partials("tcgemv", part, need) if need else None
            w, out, (N,) = ws[0], outs[0], Ns
            args = (w, np.int64(rb), np.int32(nb), np.int32(N), np.int32(M), np.int32(K), np.int32(-(-nb // s)), x16,
                    out, ptr(biases[0]), ptr(residual), ptr(part))
            _fn(kernel_name(qt, M, config), smem)(grid, block, args, shared_mem=smem)
            if need:
                split_sum(part, s, M, N, biases[0], residual, out)
