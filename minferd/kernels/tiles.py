"""Prefill without an f16 copy of the weights: dequantize a tile of rows into scratch (the
dequant kernel's exact f16), multiply it through cuBLAS, next tile. On the H200 cuBLAS runs
~2.7x the f16 rate of our mma.sync kernels, so at large batches paying the dequant per tile
beats decoding in the GEMM (bench/crossover.py has the figures)."""
from __future__ import annotations

import cupy as cp

from minferd.kernels.cublas import gemm_f32
from minferd.kernels.dequant import dequant_f16


def gemm_tiles(qt, w, x16, out, tile_rows: int, workspace=None) -> None:
    """out (M, N) f32 = x16 (M, K) @ f16(dequant(w)).T, w uint8 (N, row_bytes), tile_rows rows
    of f16 at a time from the current allocator (a model's arena)."""
    n_rows, K = w.shape[0], x16.shape[1]
    if out.shape != (x16.shape[0], n_rows) or tile_rows < 1:
        raise ValueError(f"gemm_tiles: {x16.shape} x ({n_rows}, {K}).T -> {out.shape}, tile_rows {tile_rows}")
    tile = cp.empty((min(tile_rows, n_rows), K), cp.float16)
    for r0 in range(0, n_rows, tile_rows):
        r1 = min(r0 + tile_rows, n_rows)
        dequant_f16(qt, w[r0:r1], tile[:r1 - r0])
        gemm_f32(x16, tile[:r1 - r0], out[:, r0:r1], workspace)
