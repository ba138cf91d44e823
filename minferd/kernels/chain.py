"""Launcher of chain.cu: a chain of one-column mat-vecs (Q4_K / Q6_K) run as one persistent launch,
each op waiting for the group of ops it reads. A probe for bench/chain_probe.py (does a persistent
decode kernel win back what a graph of launches loses between matrices?), not a serving path.

    table = plan([ChainOp(...), ...])        # host: the ops' items in one ticket order
    run(table_dev, table, mode, ticket, done, grid, dispatch=...)  # device: one launch

and stream_read(ws, sink): a group's weight bytes read and nothing else, one launch, the floor under
any decode made of one launch per matrix group (chain_probe.py's "read" rows).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import kernel
from .dequant import check_rows
from .launch import sm_count
from .mmvq import xq_layout
from .quant import by_name

# (type, (warps, K-split warps, rows, units)) -> chain.cu's `kind`: the one-column shapes
# mmvq_shapes.CONFIGS gives Q4_K and Q6_K at a dense model's matrix classes.
KINDS = {("Q4_K", (4, 4, 2, 1)): 0, ("Q4_K", (4, 2, 2, 1)): 1, ("Q4_K", (4, 1, 4, 1)): 2,
         ("Q6_K", (4, 4, 1, 1)): 3, ("Q6_K", (4, 2, 2, 1)): 4, ("Q6_K", (4, 2, 4, 1)): 5}
MODES = {"wait": 0, "free": 1, "prefetch": 2, "bare": 3}  # chain.cu's mode: waits kept, none, L2
# prefetch first, neither waits nor counts
DISPATCH = {"ticket": 0, "static": 4}  # who takes an item: the next ticket's CTA, or CTA item % grid
THREADS = 128  # every kind is 4 warps a CTA

OP_DTYPE = np.dtype([("W", "u8"), ("out", "u8"), ("xq", "u8"), ("xds", "u8"), ("row_bytes", "i8"),
                     ("nrows", "i4"), ("nb", "i4"), ("K", "i4"), ("kbp", "i4"), ("kind", "i4"), ("first", "i4"),
                     ("items", "i4"), ("per_item", "i4"), ("cnt", "i4"), ("wait_cnt", "i4"), ("wait_need", "i4")],
                    align=True)


@dataclasses.dataclass
class ChainOp:
    """out (1, rows) f32 = x @ dequant(w).T, x already quantized in `scratch` (mmvq's layout for one
    column of K); adds its items to counter `cnt`; waits for every item of the ops on counter
    `wait` (an earlier group) first, or for nothing (None)."""
    qt: str
    config: tuple[int, int, int, int]
    w: object
    out: object
    scratch: object
    cnt: int
    wait: int | None = None


def plan(ops: list[ChainOp]) -> np.ndarray:
    """The ops as chain.cu's table (OP_DTYPE), items numbered in op order; checks every op."""
    if not ops:
        raise ValueError("chain: no ops")
    table = np.zeros(len(ops), OP_DTYPE)
    need: dict[int, int] = {}
    first = 0
    for i, op in enumerate(ops):
        key = (op.qt, tuple(op.config))
        if key not in KINDS:
            raise ValueError(f"chain: op {i}: no kind for {op.qt} at {op.config} (have {sorted(KINDS)})")
        if op.wait is not None and op.wait not in need:
            raise ValueError(f"chain: op {i} waits on counter {op.wait}, which no earlier op adds to")
        if op.wait is not None and op.wait == op.cnt:
            raise ValueError(f"chain: op {i} waits on its own counter {op.cnt}")
        qt = by_name(op.qt)
        rows, K = op.w.shape[0], op.w.shape[1] // qt.block_bytes * qt.block_elems
        rb = check_rows(qt, op.w, K)
        if op.out.dtype != np.float32 or op.out.shape != (1, rows) or not op.out.flags.c_contiguous:
            raise ValueError(f"chain: op {i}: out must be C-contiguous float32 (1, {rows})")
        off, kbp, nbytes = xq_layout(1, K)
        if op.scratch.dtype != np.uint8 or op.scratch.nbytes < nbytes or op.scratch.data.ptr % 256:
            raise ValueError(f"chain: op {i}: scratch must be 256-aligned uint8 of >= {nbytes} bytes")
        nw, kw, r, _ = op.config
        per_item = nw // kw * r
        items = -(-rows // per_item)
        p = op.scratch.data.ptr
        table[i] = (op.w.data.ptr, op.out.data.ptr, p, p + off, rb, rows, K // qt.block_elems, K, kbp, KINDS[key],
                    first, items, per_item, op.cnt, -1 if op.wait is None else op.wait,
                    0 if op.wait is None else need[op.wait])
        need[op.cnt] = need.get(op.cnt, 0) + items
        first += items
    return table


def total_items(table: np.ndarray) -> int:
    return int(table["first"][-1] + table["items"][-1])


def counters(table: np.ndarray) -> int:
    """How many int32 counters `done` must hold."""
    return int(table["cnt"].max()) + 1


def ctas_per_sm(capped: bool = False) -> int:
    """CTAs of the kernel one SM holds: the grid that keeps every SM's slots busy is SMs x this."""
    return _fn(capped).ctas_per_sm(THREADS)


def _fn(capped: bool):
    return kernel("chain", "chain_mmvq_8" if capped else "chain_mmvq")


def run(table_dev, table: np.ndarray, mode: str, ticket, done, grid: int, capped: bool = False,
        dispatch: str = "ticket") -> None:
    """One launch over the ops of `table` (its device copy `table_dev`, uint8); ticket (1,) and done
    (counters(table),) int32 must be zero (the launch leaves them used). capped: the kernel held to
    64 registers (8 CTAs an SM; chain.cu says why). dispatch "static" needs every CTA of the grid
    resident at once (at most SMs x ctas_per_sm), since a CTA that never starts would hold items
    that the running ones wait on."""
    if mode not in MODES or dispatch not in DISPATCH:
        raise ValueError(f"chain: mode {mode!r}, one of {', '.join(MODES)}; dispatch {dispatch!r}, "
                         f"one of {', '.join(DISPATCH)}")
    if table_dev.nbytes != table.nbytes or ticket.dtype != np.int32 or done.dtype != np.int32:
        raise ValueError("chain: table_dev must be the table's bytes on the device; ticket and done int32")
    if ticket.size < 1 or done.size < counters(table):
        raise ValueError(f"chain: done holds {done.size} counters, the table uses {counters(table)}")
    if not 1 <= grid <= 1 << 20:
        raise ValueError(f"chain: grid of {grid} CTAs")
    if dispatch == "static" and grid > (most := sm_count(done.device.id) * ctas_per_sm(capped)):
        raise ValueError(f"chain: static dispatch over {grid} CTAs, more than the {most} the device holds at once")
    _fn(capped)((grid,), (THREADS,), (table_dev, np.int32(len(table)), np.int32(total_items(table)),
                                      np.int32(MODES[mode] | DISPATCH[dispatch]), ticket, done))


STREAM_THREADS, STREAM_LOADS = 256, 4  # chain.cu's: a CTA reads 16 KB, 16 bytes a load


def stream_read(ws, sink, early: bool = False) -> None:
    """Read every byte of 1-3 uint8 arrays (16-aligned, C-contiguous; a tail under 16 bytes is
    skipped) in one launch and do nothing with them. sink: uint32 (2,), sink[0] zero. early: the
    loads go out before the programmatic wait on the node before (chain.cu says why)."""
    if not 1 <= len(ws) <= 3:
        raise ValueError(f"stream_read: 1 to 3 arrays, got {len(ws)}")
    for i, w in enumerate(ws):
        if w.dtype != np.uint8 or not w.flags.c_contiguous or w.data.ptr % 16:
            raise ValueError(f"stream_read: array {i} must be C-contiguous uint8 on a 16-byte boundary")
    if sink.dtype != np.uint32 or sink.size < 2:
        raise ValueError("stream_read: sink must be uint32 of >= 2 elements")
    n16 = [w.nbytes // 16 for w in ws] + [0] * (3 - len(ws))  # absent segments: no CTAs
    ptrs = list(ws) + [ws[0]] * (3 - len(ws))
    ctas = [-(-n // (STREAM_THREADS * STREAM_LOADS)) for n in n16]
    if sum(ctas) < 1 or sum(ctas) >= 1 << 31:
        raise ValueError(f"stream_read: {sum(ctas)} CTAs")
    fn = kernel("chain", "stream_read_early" if early else "stream_read_wait")
    fn((sum(ctas),), (STREAM_THREADS,), (*ptrs, *(np.int64(n) for n in n16), np.int32(ctas[0]),
                                         np.int32(ctas[0] + ctas[1]), sink))
