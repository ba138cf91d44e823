"""Launcher of mmvq.cu's mmvq_rope_kv: a decode step's q / k / v products (one to three matrices of
one quantized type and K that read the same x, as mmvq_group's) ending in the step's rope and KV
cache write, which ops.cu's rope_kv does as a node of its own otherwise: one decode graph node a
layer fewer (s37 measured the 7B's 28 rope_kv nodes at 3.6% of its token). The arithmetic is
rope_kv's, in its order (kernels/rope.cuh), so the two ways agree bit for bit.

Each matrix has a mode: ROPE (q: rotated, written to its f32 out), ROPE_K (k: rotated, written f16
to the K cache at each column's slot), V (v: written f16 to the V cache), OUT (a plain product).
A rope pair is two adjacent rows (2i, 2i + 1) of a head, which one warp group holds when its
rows per group are even: a neox model's q / k rows are stored reordered so (model/rope_rows.py).
A kernel shape whose rows per group are odd takes the mid class's (even) shape or, where that is
odd too, `shape` says None and the caller keeps the unfused way.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import kernel
from .dequant import check_rows
from .mmvq import (CONFIGS, MAX_GROUP, QUANT_TYPES, WIDE_UNITS, Config, _check_f32, _check_scratch, _check_x, _ptr,
                   _qt, _stream, bucket, quantize_x, shape_class, xq_layout)
from .mmvq_shapes import CLASSES
from .quant import TYPES

OUT, ROPE, ROPE_K, V = 0, 1, 2, 3  # mmvq.cu's EPI_*
PAIRED = (ROPE, ROPE_K)


@dataclass(frozen=True)
class RopeCache:
    """What the epilogue reads besides the products: each column's position and cache slot (int32,
    at least n), the layer's f16 caches (n_slots, kv heads, head_dim), and rope_kv's parameters."""
    positions: object
    slots: object
    k_cache: object
    v_cache: object
    head_dim: int
    base: float
    scale: float
    freq_factors: object = None  # f32 (head_dim / 2,) or None


def kernel_name(qt, nc: int, cfg: Config, wide: bool = False) -> str:
    nw, kw, r, unr = cfg
    return f"mmvq_rope_kv<{WIDE_UNITS[qt.name] if wide else qt.ggml_id}, {nc}, {nw}, {kw}, {r}, {unr}>"


def shape(qt, n: int, rows: list[int], K: int, modes) -> Config | None:
    """The kernel shape of a launch: mmvq_group's, or the mid class's where a paired mode needs an
    even row count per warp group that the first has not; None where neither has it."""
    qt = _qt(qt)
    by_class = CONFIGS[qt.name][bucket(n)]
    cfg = by_class[shape_class(max(rows), K)]
    if any(m in PAIRED for m in modes) and cfg[2] % 2:
        cfg = by_class["mid"]
        if cfg[2] % 2:
            return None
    return cfg


def names(types=QUANT_TYPES) -> tuple[str, ...]:
    """The instances decode steps of these types launch: compiled a type at a time (kernels/
    __init__.py's parts) by load() while the path is pending; tests/unit/test_kernels_compile.py
    compiles those of a Q4_K_M model's types where CI can."""
    out = []
    for name in types:
        qt = TYPES[name]
        for n in (1, 2):
            for cls in CLASSES:
                for modes in ((ROPE, ROPE_K), (V,)):
                    cfg = shape(qt, n, [_ROWS[cls]], _K[cls], modes)
                    if cfg is not None:
                        out += [kernel_name(qt, bucket(n), cfg)]
                        if n == 1 and name in WIDE_UNITS:
                            out += [kernel_name(qt, 1, cfg, True)]
    return tuple(dict.fromkeys(out))


def load(type_names) -> None:
    """Compile and load the instances a model of these types launches now, at its load: a decode
    graph's capture would otherwise load them in the middle of a capture (CudaBackend.precompile)."""
    for name in names(tuple(t for t in type_names if t in QUANT_TYPES)):
        _fn(name)


@functools.lru_cache(maxsize=None)
def _fn(name: str):
    listed = names()
    return kernel("mmvq", name, listed if name in listed else (name,))


# A (rows, K) of each shape class (mmvq_shapes.shape_class), for names().
_ROWS = {"few": 512, "mid": 3584, "wide": 3584, "tall": 18944, "huge": 152064}
_K = {"few": 3584, "mid": 3584, "wide": 18944, "tall": 3584, "huge": 3584}


def mmvq_rope_kv(qt, ws, x, modes, outs, rc: RopeCache, *, scratch, x_quantized: bool = False, biases=None,
                 stream=None, wide: bool = False) -> None:
    """outs[i] (OUT, ROPE) or the caches (ROPE_K, V) from x @ dequant(ws[i]).T (+ biases[i]), the
    step's rope and cache write applied as modes[i] says; outs[i] may be None for the cache modes.
    scratch / x_quantized / wide as mmvq_group's (wide: the sums mmvq_group's wide launch makes)."""
    qt = _qt(qt)
    if wide and qt.name not in WIDE_UNITS:
        raise ValueError(f"mmvq_rope_kv: no wide unit for {qt.name} (only {', '.join(WIDE_UNITS)})")
    if not 1 <= len(ws) <= MAX_GROUP or len(modes) != len(ws) or len(outs) != len(ws):
        raise ValueError(f"mmvq_rope_kv: 1..{MAX_GROUP} matrices with a mode and an out slot each, "
                         f"got {len(ws)} / {len(modes)} / {len(outs)}")
    if any(m not in (OUT, ROPE, ROPE_K, V) for m in modes):
        raise ValueError(f"mmvq_rope_kv: modes are OUT, ROPE, ROPE_K or V, got {modes}")
    biases = list(biases or [None] * len(ws))
    if len(biases) != len(ws):
        raise ValueError("mmvq_rope_kv: one bias slot per matrix")
    _check_x(x)
    n, K = x.shape
    rb = [check_rows(qt, w, K) for w in ws][0]  # one type and K: one row size
    rows = [w.shape[0] for w in ws]
    hd = rc.head_dim
    for w, out, b, m in zip(ws, outs, biases, modes):
        if m in (OUT, ROPE) and out is None:
            raise ValueError("mmvq_rope_kv: an OUT or ROPE matrix needs its out")
        _check_f32(out, (n, w.shape[0]), "out")
        _check_f32(b, (w.shape[0],), "bias")
        if m in PAIRED and (hd % 2 or w.shape[0] % hd):
            raise ValueError(f"mmvq_rope_kv: rope over heads of {hd} (even) elements, got {w.shape[0]} rows")
        if m in (ROPE_K, V):
            cache = rc.k_cache if m == ROPE_K else rc.v_cache
            if cache.dtype != np.float16 or not cache.flags.c_contiguous or cache.size % w.shape[0]:
                raise ValueError(f"mmvq_rope_kv: the {'K' if m == ROPE_K else 'V'} cache must be C-contiguous "
                                 f"float16 rows of {w.shape[0]}, got {cache.dtype} {tuple(cache.shape)}")
    for a, what in ((rc.positions, "positions"), (rc.slots, "slots")):
        if a.dtype != np.int32 or a.ndim != 1 or a.size < n or not a.flags.c_contiguous:
            raise ValueError(f"mmvq_rope_kv: {what} must be contiguous int32 of >= {n}, got {a.dtype} {tuple(a.shape)}")
    if rc.freq_factors is not None:
        _check_f32(rc.freq_factors, (hd // 2,), "freq_factors")
    cfg = shape(qt, n, rows, K, modes)
    if cfg is None:
        raise ValueError(f"mmvq_rope_kv: no {qt.name} kernel shape pairs rows at {n} columns, {max(rows)} x {K}")
    if not x_quantized:
        quantize_x(x, scratch, stream=stream)
    else:
        _check_scratch(scratch, n, K)
    off, kbp, _ = xq_layout(n, K)
    nw, kw, r, _ = cfg
    per_cta = nw // kw * r
    ctas = [(m + per_cta - 1) // per_cta for m in rows]
    pad = MAX_GROUP - len(ws)
    W = list(ws) + [ws[-1]] * pad
    R = rows + [0] * pad
    O = [_ptr(o) for o in outs] + [np.uint64(0)] * pad
    B = [_ptr(b) for b in biases] + [np.uint64(0)] * pad
    packed = sum(m << (2 * i) for i, m in enumerate(modes))
    cta1, cta2 = ctas[0], ctas[0] + (ctas[1] if len(ctas) > 1 else 0)
    p = scratch.data.ptr
    with _stream(stream):
        _fn(kernel_name(qt, bucket(n), cfg, wide))(
            (sum(ctas),), (nw * 32,),
            (*W, *(np.int32(m) for m in R), np.int32(cta1), np.int32(cta2), *O, *B,
             np.int64(rb), np.int32(K // qt.block_elems), np.uint64(p), np.uint64(p + off),
             np.int32(K), np.int32(kbp), np.int32(n), np.int32(packed), rc.positions, rc.slots,
             rc.k_cache, rc.v_cache, np.int32(hd), np.float32(rc.base), np.float32(rc.scale),
             _ptr(rc.freq_factors)))
