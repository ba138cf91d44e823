"""mmvq.cu's MoE decode products: each pick's row of x times its expert's rows, the expert id read
on the device (moe.topk's), so a decode step that routes on the device can be captured. Its
instances are named with the module's others (mmvq.names()); this file is the launcher.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from minferd.config import valve

from .dequant import check_rows
from .mmvq import (FLOAT_TYPES, IDS_CLASSES, IDS_CONFIGS, QUANT_TYPES, Config, _check_f32, _check_scratch,
                   _check_x, _float_ids_name, _fn, _fn_any, _ids_class, _ids_name, _ptr, _qt, _stream,
                   xq_layout)


@functools.lru_cache(maxsize=None)
def _overrides() -> dict:
    """MINFERD_IDS_CONFIGS: a JSON file {type: {few|mid: [warps, K-split warps, rows, units]}}
    (bench/moe_ids.py --json writes one) read once: the A/B of a sweep's picks before they land."""
    path = valve("MINFERD_IDS_CONFIGS")
    if path is None:
        return {}
    table = json.loads(Path(path).read_text())
    out = {}
    for t, by_class in table.items():
        for c, cfg in by_class.items():
            if t not in QUANT_TYPES or c not in IDS_CLASSES or len(cfg) != 4 or not all(isinstance(v, int) and v > 0 for v in cfg) \
                    or cfg[0] % cfg[1] or cfg[0] > 32:
                raise ValueError(f"MINFERD_IDS_CONFIGS {path}: {t!r} {c!r} {str(cfg)[:40]} is not a type, "
                                 f"class ({', '.join(IDS_CLASSES)}) and [warps, K-split warps, rows, units]")
            out[t, c] = tuple(cfg)
    return out


def ids_config(qt, rows: int) -> Config:
    """mmvq_ids' kernel shape for qt's experts of `rows` rows."""
    c = _ids_class(rows)
    return _overrides().get((qt.name, c)) or IDS_CONFIGS[qt.name][c]


def mmvq_ids(qt, w, n_expert: int, x, ids, xdiv: int, out, *, scratch=None, stream=None, w2=None, out2=None,
             bias=None, bias2=None, config: Config | None = None) -> None:
    """An MoE's decode products: out[p] (rows,) = x[p // xdiv] @ dequant(expert ids[p] of w).T for
    every pick p, the expert read on the device (graph-safe routing). w: the stacked experts as
    (n_expert * rows, row_bytes) uint8, expert e its rows e*rows ..; x (n, K) f32; ids (P,)
    int32 (values < n_expert: moe.topk's); out (P, rows) f32. Quantized types read x in the
    mat-vec format from `scratch` (quantize_x's, or the activation kernel's for its output);
    float types read x itself. w2 (of w's type and shape) into out2 (of out's) in the same
    launch: gate and up. bias (bias2): the experts' f32 biases (n_expert, rows), or None: each pick
    adds its expert's row, as one f32 add after the product (gpt-oss). config: a kernel shape
    other than ids_config's (bench/moe_ids.py's sweep)."""
    if (w2 is None) != (out2 is None) or (w2 is not None and (w2.shape != w.shape or w2.dtype != w.dtype)):
        raise ValueError(f"mmvq_ids: w2 and out2 come together, w2 of w's shape {tuple(w.shape)}")
    qt = _qt(qt)
    _check_x(x, max_rows=None)
    n, K = x.shape
    if n_expert < 1 or w.ndim != 2 or w.shape[0] % n_expert:
        raise ValueError(f"mmvq_ids: {tuple(w.shape)} weight rows are not {n_expert} experts' stacked")
    rows, rb = w.shape[0] // n_expert, check_rows(qt, w, K)
    P = ids.shape[0] if ids.ndim == 1 else -1
    if ids.dtype != np.int32 or P < 0 or xdiv < 1 or (P and (P - 1) // xdiv >= n):
        raise ValueError(f"mmvq_ids: ids {ids.dtype} {tuple(ids.shape)} with xdiv {xdiv} for {n} rows of x")
    _check_f32(out, (P, rows), "out")
    _check_f32(out2, (P, rows), "out2")
    _check_f32(bias, (n_expert, rows), "bias")
    _check_f32(bias2, (n_expert, rows), "bias2")
    if w2 is not None:
        check_rows(qt, w2, K)
    elif bias2 is not None:
        raise ValueError("mmvq_ids: bias2 is w2's")
    pair, w2p, out2p = 1 + (w2 is not None), _ptr(w2), _ptr(out2)
    bp, b2p = _ptr(bias), _ptr(bias2)
    if P == 0 or rows == 0:
        return
    eb = np.int64(rows * rb)
    if qt.name in FLOAT_TYPES:
        aligned = all(a.data.ptr % 16 == 0 for a in (w, x) + (() if w2 is None else (w2,)))
        vec = 8 if K % 8 == 0 and rb % 16 == 0 and aligned else 1
        with _stream(stream):
            _fn(_float_ids_name(qt, vec))((-(-rows // 4), P, pair), (128,),
                                          (w, w2p, eb, np.int32(rows), ids, np.int32(xdiv), out, out2p, bp, b2p,
                                           np.int64(rb), np.int32(K), x))
        return
    if scratch is None:
        raise ValueError("mmvq_ids: a quantized type reads x from its scratch (quantize_x)")
    _check_scratch(scratch, n, K)
    off, kbp, _ = xq_layout(n, K)
    nw, kw, r, unr = cfg = config or ids_config(qt, rows)
    per_cta = nw // kw * r
    p = scratch.data.ptr
    with _stream(stream):
        _fn_any(_ids_name(qt, cfg))((-(-rows // per_cta), P, pair), (nw * 32,),
                                    (w, w2p, eb, np.int32(rows), ids, np.int32(xdiv), out, out2p, bp, b2p, np.int64(rb),
                                     np.int32(K // qt.block_elems), np.uint64(p), np.uint64(p + off), np.int32(K),
                                     np.int32(kbp)))
