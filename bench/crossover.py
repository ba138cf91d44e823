"""The prefill gate table: every matmul kernel timed on Qwen2.5-7B's matrix shapes from 1 to
2048 tokens, per weight type. The backend picks, per matmul, the fastest kernel its plan allows
from this table (minferd/backend/gates.py); issue 6: "shape gates measured, not guessed".

    python bench/crossover.py [--types Q4_K,Q6_K] [--models 7b,0.5b] [--ns 1,2,...,2048] [--table F] [--json F] [--graph]

Kernels: mmvq (mat-vec, n <= 8, quantized bytes), small (mmq_small: int8 mma, quantized bytes
read once, n <= 64), tc (tcgemv: f16 mma, weights decoded in registers, n <= 64), cublas (the f16 copy: W16 plans only), tiles
(dequantize row tiles into scratch + cuBLAS), fused_b (f16 mma, B decoded in registers), mmq
(int8 mma). CUDA events around INNER calls in a row, median of --reps after warm-up; the input
conversion each needs (int8 quantization, the f16 cast) is counted in it. (The committed table
of 2026-11-29 timed one call at a time: its entries under ~100 us are launch-bound.)

--graph times each kernel as a decode step runs it: INNER launches captured in one CUDA graph
(bench/kernels.py's time_graph), rotating over enough copies of the weight that the L2 never
holds the next one. Without it, back-to-back calls from Python: a 6-40 us kernel is then timed
at the ~30 us Python takes to launch it and its input conversion, and a small weight stays in
the L2. Decode batches (n <= 64) should be decided from --graph rows.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NS = "1,2,4,8,12,16,24,32,48,64,96,128,256,512,1024,2048"
KERNELS = ("mmvq", "small", "tc", "cublas", "tiles", "fused_b", "mmq")
INNER = 10  # calls per timed sample


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default=NS)
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--models", default="7b", help="whose matrix shapes (bench/kernels.py's sets, the output matrix "
                                                   "left out): 7b, 0.5b (the 0.5B's 896-wide ones), ...")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--table", default=None, help="write the gate table the backend reads")
    ap.add_argument("--json", default=None)
    ap.add_argument("--graph", action="store_true", help="time inside CUDA graphs over L2-defeating weight copies")
    ap.add_argument("--merge", default=None, help="a gate table whose rows of the measured (type, shape, n) "
                                                  "this run replaces, the rest kept (e.g. --graph --ns 1,..,64)")
    args = ap.parse_args(argv)

    import cupy as cp

    from minferd.devices import DEQUANT_ROWS
    from minferd.kernels.cublas import gemm_f32
    from minferd.kernels.dequant import dequant_f16
    from minferd.kernels.gemm_f16 import SUPPORTED as FUSED_B_TYPES, fused_b
    from minferd.kernels.mmq import SUPPORTED as MMQ_TYPES, mmq
    from minferd.kernels.mmq_small import MAX_M as SMALL_MAX, SUPPORTED as SMALL_TYPES, mmq_small, part_bytes, \
        quantize, sm_count, x_bytes
    from minferd.kernels.mmvq import MAX_COLS, mmvq
    from minferd.kernels.tcgemv import SUPPORTED as TC_TYPES, part_bytes as tc_part_bytes, tcgemv
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks
    from minferd.kernels.tiles import gemm_tiles

    def timed(f) -> float:
        # INNER calls back to back between two events: the GPU's time per call, not the
        # ~6 us Python launch a lone small kernel would be measured at.
        for _ in range(3):
            f()
        e0, e1, ts = cp.cuda.Event(), cp.cuda.Event(), []
        for _ in range(args.reps):
            e0.record()
            for _ in range(INNER):
                f()
            e1.record()
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / INNER)
        return statistics.median(ts)

    from kernels import MODEL_SHAPES, copies_for, time_graph  # bench/kernels.py
    shapes = [sh for m in args.models.split(",") for sh in MODEL_SHAPES[m] if sh[0] < 65536]  # no output matrix
    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    sms = sm_count(0)

    def graphed(make, ws, w16s) -> float:
        """make(w, w16) -> a launch; INNER of them over the weight copies, in one graph."""
        return time_graph(cp, [make(ws[i % len(ws)], w16s[i % len(ws)]) for i in range(INNER)], args.reps)

    rng, rows = np.random.default_rng(0), []
    print(f"{'type':5s} {'N x K':>13s} {'n':>4s} " + " ".join(f"{k:>9s}" for k in KERNELS) + "  (us)")
    for name in args.types.split(","):
        qt = TYPES[name]
        for N, K in shapes:
            if K % qt.block_elems:  # the 0.5B's 896-wide rows take no 256-element blocks
                continue
            w = cp.asarray(random_blocks(qt, N, K, rng))
            w16 = cp.empty((N, K), cp.float16)
            dequant_f16(qt, w, w16)
            copies = copies_for(w16.nbytes, l2) if args.graph else 1
            ws, w16s = [w] + [w.copy() for _ in range(copies - 1)], [w16] + [w16.copy() for _ in range(copies - 1)]
            for n in (int(v) for v in args.ns.split(",")):
                x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
                y = cp.empty((n, N), cp.float32)
                makers = {"cublas": lambda w, w16: lambda: gemm_f32(x.astype(cp.float16), w16, y),
                          "tiles": lambda w, w16: lambda: gemm_tiles(qt, w, x.astype(cp.float16), y, DEQUANT_ROWS)}
                if n <= MAX_COLS:
                    makers["mmvq"] = lambda w, w16: lambda: mmvq(qt, w, x, y)
                if name in FUSED_B_TYPES:
                    makers["fused_b"] = lambda w, w16: lambda: fused_b(qt, w, x.astype(cp.float16), y)
                if name in MMQ_TYPES:
                    makers["mmq"] = lambda w, w16: lambda: mmq(qt, w, x, y)
                if name in SMALL_TYPES and n <= SMALL_MAX:  # quantize x each call, as cublas casts it
                    xbuf = cp.empty(x_bytes(n, K), cp.uint8)
                    part = cp.empty(max(part_bytes(n, N, K, sms), 4) // 4, cp.float32)
                    makers["small"] = lambda w, w16: lambda: mmq_small(qt, w, quantize(x, xbuf), y, part=part)
                if name in TC_TYPES and n <= SMALL_MAX:  # x cast to f16 each call, as for cublas
                    tpart = cp.empty(max(tc_part_bytes(n, N, K, qt, sms), 4) // 4, cp.float32)
                    makers["tc"] = lambda w, w16: lambda: tcgemv(qt, w, x.astype(cp.float16), y, part=tpart)
                us = {}
                for k, make in makers.items():
                    try:
                        us[k] = round(graphed(make, ws, w16s) * 1e6 if args.graph else timed(make(w, w16)), 2)
                    except Exception as e:  # noqa: BLE001 - a kernel that cannot be captured: say so, go on
                        print(f"  {k} at n={n}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                rows.append({"type": name, "N": N, "K": K, "n": n, "us": us})
                print(f"{name:5s} {N:6d} x {K:<5d} {n:4d} " + " ".join(f"{us.get(k, float('nan')):9.1f}" for k in KERNELS),
                      flush=True)
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    head = json.dumps({"device": gpu, "made_by": f"python bench/crossover.py --table {args.table}",
                       "unit": f"microseconds a call, median of {args.reps} x {INNER} calls"
                               + (" in a CUDA graph, weights rotating past the L2" if args.graph else "")},
                      indent=1)[:-2]
    text = head + ',\n "rows": [\n' + ",\n".join("  " + json.dumps(r) for r in rows) + "\n ]\n}\n"
    for path in (args.table, args.json):
        if path:
            Path(path).write_text(text)
    if args.merge:
        Path(args.merge).write_text(merged(json.loads(Path(args.merge).read_text()), json.loads(text), args))
    return 0


def merged(old: dict, new: dict, args) -> str:
    """old's rows with those new measured again replaced, in (type, N, K, n) order; the provenance
    of both in made_by and unit."""
    key = lambda r: (r["type"], r["N"], r["K"], r["n"])  # noqa: E731
    fresh = {key(r) for r in new["rows"]}
    rows = sorted([r for r in old["rows"] if key(r) not in fresh] + new["rows"], key=key)
    ns = sorted({r["n"] for r in new["rows"]})
    prefix = f"rows n in {ns}: "

    def others(text: str) -> str:  # a merge of the same rows again replaces its own provenance
        return text.split("; the others: ", 1)[1] if text.startswith(prefix) and "; the others: " in text else text
    head = {"device": new["device"],
            "made_by": f"{prefix}python bench/crossover.py --merge{' --graph' if args.graph else ''} "
                       f"--ns {args.ns}, {time.strftime('%Y-%m-%d')}; the others: {others(old.get('made_by', '?'))}",
            "unit": f"{prefix}{new['unit']}; the others: {others(old.get('unit', '?'))}"}
    return json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n' + ",\n".join("  " + json.dumps(r) for r in rows) + "\n ]\n}\n"


if __name__ == "__main__":
    sys.exit(main())
