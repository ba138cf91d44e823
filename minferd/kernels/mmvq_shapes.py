"""mmvq's kernel shapes: (warps per CTA, warps splitting K, rows per warp group, units in flight
per lane) by type, column bucket and shape class, measured by bench/kernels.py's sweep on the
H200, and the variants that sweep times. mmvq.py launches with them (and re-exports them)."""
from __future__ import annotations

from .quant import CUDA_TYPES

NC_BUCKETS = (1, 2, 4, 8)  # kernels are compiled for these column counts; n=3 runs the 4 one
MAX_COLS = NC_BUCKETS[-1]
FLOAT_TYPES = ("F32", "F16", "BF16")

# Kernel shape (warps per CTA, warps splitting one row's K, rows per warp group, units in
# flight per lane) by type, batch (1, 2 where measured, else the n = 8 column for 2..8) and shape class (see
# shape_class): the fastest variant of bench/kernels.py --sweep on the H200 (2026-11-29, each
# one checked by tests/cuda/test_mmvq.py::test_mmvq_every_config in the same run). What the
# sweep showed: 2-4 rows per warp group win where rows are many (one x load serves them all:
# x, 2 bytes per element per column, is most of the L1 traffic); splitting K over 2-8 warps
# wins where rows are few (k/v: 512 rows cannot fill 132 SMs) or K is long (ffn_down);
# more than one unit in flight per lane rarely pays once warps are plentiful. Two columns (a 2-token
# prompt, a decode step of 2 sequences; 3-8 rows run tcgemv where it decodes the type) have shapes
# of their own for Q4_K and Q6_K: bench/kernels.py --ns 2 --sweep (s26, bench/results/s26/
# call2-matvec.log), over the 8-column shapes Q4_K 18944x3584 22.6 -> 21.5 us, 3584x18944 21.6 ->
# 20.7, the output 141.6 -> 134.6; Q6_K 3584x18944 40.2 -> 34.8, 18944x3584 34.2 -> 32.4, k/v 4.1
# -> 3.8. The other types take their 8-column shapes at 2-8.
Config = tuple[int, int, int, int]
CLASSES = ("few", "mid", "wide", "tall", "huge")
QUANT_TYPES = tuple(n for n in CUDA_TYPES if n not in FLOAT_TYPES)
_MEASURED: dict[str, dict[int, dict[str, Config]]] = {
    "Q4_0": {1: {"few": (8, 8, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 2, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)},
             8: {"few": (8, 8, 1, 1), "mid": (4, 4, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)}},
    "Q4_1": {1: {"few": (8, 8, 1, 1), "mid": (4, 4, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)},
             8: {"few": (8, 8, 1, 1), "mid": (4, 4, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)}},
    "Q5_0": {1: {"few": (8, 8, 1, 1), "mid": (4, 2, 2, 1), "wide": (8, 8, 1, 1), "tall": (4, 2, 2, 1), "huge": (4, 1, 2, 1)},
             8: {"few": (8, 8, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)}},
    "Q5_1": {1: {"few": (8, 8, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 4, 1, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)},
             8: {"few": (8, 8, 1, 1), "mid": (4, 4, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 2, 2, 1), "huge": (4, 2, 2, 1)}},
    "Q8_0": {1: {"few": (8, 8, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 4, 1, 2), "tall": (4, 4, 2, 1), "huge": (4, 1, 4, 1)},
             8: {"few": (8, 8, 1, 1), "mid": (4, 4, 2, 1), "wide": (8, 8, 1, 1), "tall": (4, 4, 2, 1), "huge": (4, 2, 2, 1)}},
    "Q2_K": {1: {"few": (4, 4, 2, 1), "mid": (4, 2, 4, 1), "wide": (4, 4, 2, 1), "tall": (4, 2, 4, 1), "huge": (4, 1, 4, 1)},
             8: {"few": (4, 4, 1, 1), "mid": (4, 4, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)}},
    "Q3_K": {1: {"few": (4, 4, 1, 1), "mid": (4, 4, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 2, 4, 1), "huge": (4, 1, 4, 1)},
             8: {"few": (4, 4, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)}},
    "Q4_K": {1: {"few": (4, 4, 2, 1), "mid": (4, 2, 2, 1), "wide": (4, 2, 2, 1), "tall": (4, 2, 2, 1), "huge": (4, 1, 4, 1)},
             2: {"few": (4, 4, 2, 1), "mid": (4, 2, 2, 1), "wide": (4, 2, 2, 1), "tall": (4, 2, 4, 1), "huge": (4, 2, 4, 1)},
             8: {"few": (4, 4, 2, 1), "mid": (4, 2, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 2, 2, 1), "huge": (4, 1, 4, 1)}},
    "Q5_K": {1: {"few": (4, 4, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 2, 2, 1), "huge": (4, 1, 2, 1)},
             8: {"few": (4, 4, 2, 1), "mid": (4, 4, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)}},
    "Q6_K": {1: {"few": (4, 4, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 2, 2, 1), "tall": (4, 2, 4, 1), "huge": (4, 2, 4, 1)},
             2: {"few": (4, 4, 2, 1), "mid": (4, 2, 2, 1), "wide": (4, 2, 4, 1), "tall": (4, 2, 4, 1), "huge": (4, 1, 4, 1)},
             8: {"few": (8, 4, 1, 1), "mid": (4, 2, 2, 1), "wide": (4, 4, 2, 1), "tall": (4, 1, 4, 1), "huge": (4, 1, 4, 1)}},
}
# Not swept yet: the table types borrow the shapes of their layouts' twins (IQ4_NL is Q4_0's
# layout; MXFP4 the same 32-element nibbles behind a 1-byte scale; IQ4_XS a 256-element block of
# nibbles like Q4_K's).
_MEASURED.update(IQ4_NL=_MEASURED["Q4_0"], MXFP4=_MEASURED["Q4_0"], IQ4_XS=_MEASURED["Q4_K"])
CONFIGS: dict[str, dict[int, dict[str, Config]]] = {
    name: {nc: _MEASURED[name].get(nc, _MEASURED[name][MAX_COLS]) for nc in NC_BUCKETS} for name in QUANT_TYPES
}
# mmvq_ids' kernel shape (one column) by type and class of an expert's rows (_ids_class): an
# MoE decode's products are k picks of small matrices (768-2880 rows), latency- not byte-bound.
IDS_CLASSES = ("few", "mid")
# Defaults: the one-column shapes of the dense table, but where bench/moe_ids.py measured better
# on the H200 (s15, bench/results/s15-ids): one warp a row group, not K split over warps (an
# expert's rows are short: the 30b-a3b's K is 2048 and 768). At the 30b-a3b's shapes: gate+up
# 10.65 -> 7.47 us, down 7.78 -> 5.78 (Q4_K) and 11.56 -> 8.52 (Q6_K); its tg128 300.5 -> 335.6
# (s16, llama.cpp 309.3). MXFP4 (gpt-oss) gained ~3% at the kernel and nothing whole: kept.
IDS_CONFIGS: dict[str, dict[str, Config]] = {name: {c: CONFIGS[name][1][c] for c in IDS_CLASSES} for name in QUANT_TYPES}
IDS_CONFIGS["Q4_K"].update(few=(8, 1, 4, 1), mid=(8, 1, 2, 1))
IDS_CONFIGS["Q6_K"].update(mid=(4, 1, 8, 1))
# The variants bench/kernels.py --sweep times (and tests/cuda checks, so any may become a default).
SWEEP: tuple[Config, ...] = ((4, 1, 1, 1), (4, 1, 2, 1), (4, 1, 1, 2), (4, 1, 2, 2), (4, 2, 1, 2), (4, 2, 2, 1),
                             (4, 4, 1, 1), (4, 4, 1, 2), (8, 8, 1, 1), (4, 1, 4, 1), (4, 2, 4, 1), (4, 4, 2, 1))
SWEEP_N: tuple[Config, ...] = ((4, 1, 1, 1), (4, 1, 2, 1), (4, 4, 1, 1), (8, 4, 1, 1), (8, 8, 1, 1), (4, 1, 4, 1),
                               (4, 2, 2, 1), (4, 4, 2, 1))


def shape_class(rows: int, K: int) -> str:
    """few: k/v projections (512 rows cannot fill the GPU); mid: 3584-row squares; wide:
    ffn_down (long K, few rows); tall: gate/up; huge: the output / embedding matrix."""
    if rows <= 1024:
        return "few"
    if rows < 8192:
        return "wide" if K >= 8192 else "mid"
    return "tall" if rows < 65536 else "huge"


def sweep_configs(n: int) -> tuple[Config, ...]:
    """The variants a sweep times at n columns: SWEEP at 1, SWEEP_N at 8, both between."""
    return SWEEP if n == 1 else SWEEP_N if n == MAX_COLS else tuple(dict.fromkeys(SWEEP_N + SWEEP))
