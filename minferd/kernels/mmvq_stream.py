"""Launcher of mmvq.cu's mmvq_stream: out (1, rows) = x (1, K) @ dequant(W).T (+ bias) (+ residual)
for one decode column, W's rows brought into shared memory by the copy engine (cp.async.bulk) in
items of RB rows, a ring of `stages` items a CTA, `ctas_per_sm` persistent CTAs an SM; x (its
int8 planes and scales) copied once a CTA into shared memory too.

Same arguments and checks as mmvq.mmvq_group (up to three matrices of one type and K reading one
x), the same products summed in another order (mmvq_rows with 8 warps over an item's rows). The
types are those whose rows are whole 16-byte runs (STREAM_TYPES: the bulk copy's alignment).
"""
from __future__ import annotations

import functools

import numpy as np

from . import kernel
from .mmq_small import sm_count
from .mmvq import STREAM_RBS, STREAM_TYPES, STREAM_UNRS, _ptr, _qt, _stream, group_inputs, names, segments, stream_name, xq_layout

# (bytes an item at most, items in flight a CTA, CTAs an SM, units a lane a trip):
# bench/mmvq_stream.py sweeps them.
Config = tuple[int, int, int, int]
CONFIG: Config = (16384, 4, 2, 1)
MAX_STAGES = 15  # the kernel's barriers (one a stage, one for x) fit in its first 128 bytes
SMEM_MAX = 226 * 1024  # sm_90's 227 KB a CTA, less mmvq_rows' static reduction buffer


def supports(qt, row_bytes: int, ptrs) -> bool:
    """Whether mmvq_stream takes these matrices: a streamed type, whole 16-byte rows, 16-aligned."""
    return _qt(qt).name in STREAM_TYPES and row_bytes % 16 == 0 and all(p % 16 == 0 for p in ptrs)


def layout(row_bytes: int, K: int, config: Config = CONFIG) -> tuple[int, int, int, int]:
    """(rows an item, bytes of x's copy, bytes a stage, dynamic shared memory) for rows of row_bytes."""
    item_max, stages = config[:2]
    rb = max([r for r in STREAM_RBS if r * row_bytes <= item_max] or [1])
    stage = -(-rb * row_bytes // 128) * 128
    x_bytes = -(-(2 * K + K // 4) // 128) * 128
    return rb, x_bytes, stage, 128 + x_bytes + stages * stage


@functools.lru_cache(maxsize=None)
def _fn(name: str):
    return kernel("mmvq", name, names(), SMEM_MAX)


def mmvq_stream(qt, ws, x, outs, *, scratch=None, x_quantized: bool = False, stream=None, biases=None,
                residual=None, config: Config = CONFIG) -> None:
    qt = _qt(qt)
    if qt.name not in STREAM_TYPES:
        raise ValueError(f"mmvq_stream: {qt.name} is not streamed (only {', '.join(STREAM_TYPES)})")
    n, K, rb, biases, scratch = group_inputs("mmvq_stream", qt, ws, x, outs, scratch, x_quantized, stream, biases,
                                             residual, max_rows=1)
    if not supports(qt, rb, [w.data.ptr for w in ws]):
        raise ValueError(f"mmvq_stream: rows of {rb} bytes at 16-aligned addresses only")
    rows_item, x_bytes, stage, smem = layout(rb, K, config)
    stages, per_sm, unr = config[1:]
    if not 1 <= stages <= MAX_STAGES or smem > SMEM_MAX or per_sm < 1 or unr not in STREAM_UNRS:
        raise ValueError(f"mmvq_stream: config {config} needs {smem} bytes of shared memory ({stages} stages)")
    off = xq_layout(n, K)[0]
    items = [-(-w.shape[0] // rows_item) for w in ws]
    if sum(items) == 0:
        return
    import cupy as cp
    grid = min(sum(items), per_sm * sm_count(cp.cuda.Device().id))
    p = scratch.data.ptr
    with _stream(stream):
        _fn(stream_name(qt, rows_item, unr))(
            (grid,), (256,),
            (*segments(ws, outs, biases, items), np.int32(sum(items)),
             np.int64(rb), np.int32(K // qt.block_elems), np.uint64(p), np.uint64(p + off),
             np.int32(K), _ptr(residual), np.int32(stages), np.int32(stage), np.int32(x_bytes)), shared_mem=smem)
