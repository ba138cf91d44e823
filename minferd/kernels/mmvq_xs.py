"""Launcher of mmvq_xs.cu: the one-column mat-vec with x held in registers (x-stationary). A probe
for bench/xs_probe.py (does a lane that keeps its x and walks rows stream the weights faster than
mmvq's lanes that walk K?), not a serving path.

    mmvq_xs(qt, w, scratch, out, config=(warps, units a thread, rows a trip), rows_per_cta=16)

x is quantized into `scratch` first (mmvq.quantize_x: one column, mmvq's layout)."""
from __future__ import annotations

import functools

import numpy as np

from . import kernel
from .dequant import check_rows
from .mmvq import FLOAT_TYPES, _check_scratch, _ptr, _qt, xq_layout

MAX_ROWS = 64  # mmvq_xs.cu's XS_MAX_ROWS
# (warps, units a thread, rows a trip) the probe compiles, for K's units to fill NT x UPT: 4 warps
# for K = 3584's 112 Q4_K units, 10 x 2 for K = 18944's 592; RB 1 or 2 rows a trip.
CONFIGS = ((4, 1, 1), (4, 1, 2), (4, 2, 1), (8, 1, 1), (8, 1, 2), (10, 2, 1), (20, 1, 1), (16, 1, 1))
TYPES = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")
UNITS = {"Q4_K": 8, "Q6_K": 8, "Q5_0": 2, "Q8_0": 2}  # units a block (the units' U, mmvq_units*.cuh)


def kernel_name(qt, cfg) -> str:
    nw, upt, rb = cfg
    return f"mmvq_xs<{_qt(qt).ggml_id}, {nw}, {upt}, {rb}>"


def probe_names() -> tuple[str, ...]:
    """Not names(): a probe's instances stay out of `minferd warmup` and a model's load (precompile)."""
    return tuple(kernel_name(t, c) for t in TYPES for c in CONFIGS)


@functools.lru_cache(maxsize=None)
def _fn(name: str):
    return kernel("mmvq_xs", name, probe_names())


def fits(qt, K: int, cfg) -> bool:
    """Every unit of a row has a thread: K's units fit the CTA's threads x units a thread."""
    qt = _qt(qt)
    nw, upt, _ = cfg
    return K // qt.block_elems * UNITS[qt.name] <= nw * 32 * upt


def mmvq_xs(qt, w, scratch, out, *, config, rows_per_cta: int, residual=None, stream=None) -> None:
    """out (1, rows) f32 = x @ dequant(w).T (+ residual), x already quantized in `scratch` for K."""
    qt = _qt(qt)
    if qt.name in FLOAT_TYPES or qt.name not in TYPES:
        raise ValueError(f"mmvq_xs: {qt.name} is not one of the probe's types ({', '.join(TYPES)})")
    if tuple(config) not in CONFIGS:
        raise ValueError(f"mmvq_xs: config {config} is not compiled (have {CONFIGS})")
    rows = w.shape[0]
    K = w.shape[1] // qt.block_bytes * qt.block_elems
    rb = check_rows(qt, w, K)
    if not fits(qt, K, config):
        raise ValueError(f"mmvq_xs: K = {K}'s units do not fit config {config}")
    if not 1 <= rows_per_cta <= MAX_ROWS:
        raise ValueError(f"mmvq_xs: rows_per_cta {rows_per_cta}, expected 1..{MAX_ROWS}")
    for a, what in ((out, "out"), (residual, "residual")):
        if a is not None and (a.dtype != np.float32 or a.shape != (1, rows) or not a.flags.c_contiguous):
            raise ValueError(f"mmvq_xs: {what} must be C-contiguous float32 (1, {rows})")
    _check_scratch(scratch, 1, K)
    if rows == 0:
        return
    off, _, _ = xq_layout(1, K)
    p = scratch.data.ptr
    nw = config[0]
    launch = _fn(kernel_name(qt, config))
    args = (w, np.int32(rows), np.int32(rows_per_cta), out, np.int64(rb), np.int32(K // qt.block_elems),
            np.uint64(p), np.uint64(p + off), np.int32(K), _ptr(residual))
    grid = ((rows + rows_per_cta - 1) // rows_per_cta,)
    if stream is None:
        launch(grid, (nw * 32,), args)
    else:
        with stream:
            launch(grid, (nw * 32,), args)
