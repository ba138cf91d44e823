"""Every mmq_small config (minferd/kernels/mmq_small.py CONFIGS) and tcgemv on Qwen2.5-7B's shapes,
timed as a decode step runs it: INNER launches in one CUDA graph over weight copies that defeat
the L2 (bench/kernels.py), mmq_small's x quantization included (once per launch), beside cuBLAS on
the f16 copy (tcgemv and cuBLAS read the f16 x a decode step's rmsnorm writes). Also what each
reaches of the HBM: the quantized bytes per microsecond.

    python bench/mmq_small.py [--types Q4_K,Q6_K] [--ns 16,32,64] [--kernels small,tc] [--reps 10] [--json F]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = ((3584, 3584), (512, 3584), (18944, 3584), (3584, 18944))
INNER = 10


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--ns", default="16,32,64")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--kernels", default="small,tc", help="which to time beside cuBLAS: small (mmq_small), tc (tcgemv)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp

    from kernels import copies_for, time_graph
    from minferd.kernels import mmq_small as ms, tcgemv as tc
    from minferd.kernels.cublas import gemm_f32
    from minferd.kernels.dequant import dequant_f16
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks

    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    sms = ms.sm_count(0)
    rng = np.random.default_rng(0)
    rows = []
    kinds = args.kernels.split(",")
    names = (list(ms.CONFIGS) if "small" in kinds else []) + ([f"tc_{c}" for c in tc.CONFIGS] if "tc" in kinds else []) + ["cublas"]
    print(f"{'type':5s} {'N x K':>13s} {'n':>3s} " + " ".join(f"{c:>9s}" for c in names) + "  (us; best GB/s)")
    for name in args.types.split(","):
        qt = TYPES[name]
        for N, K in SHAPES:
            w = cp.asarray(random_blocks(qt, N, K, rng))
            w16 = cp.empty((N, K), cp.float16)
            dequant_f16(qt, w, w16)
            copies = copies_for(w16.nbytes, l2)
            ws, w16s = [w] + [w.copy() for _ in range(copies - 1)], [w16] + [w16.copy() for _ in range(copies - 1)]
            for n in (int(v) for v in args.ns.split(",")):
                x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
                x16 = x.astype(cp.float16)  # written by rmsnorm / the activation in a decode step
                y = cp.empty((n, N), cp.float32)
                xbuf = cp.empty(ms.x_bytes(n, K), cp.uint8)
                part = cp.empty(max(ms.part_bytes(n, N, K, sms), 4) // 4, cp.float32)
                us = {}
                for c in (ms.CONFIGS if "small" in kinds else ()):
                    make = lambda i, c=c: lambda: ms.mmq_small(qt, ws[i % copies], ms.quantize(x, xbuf), y,  # noqa: E731
                                                               part=part, config=c)
                    us[c] = round(time_graph(cp, [make(i) for i in range(INNER)], args.reps) * 1e6, 2)
                if name in tc.SUPPORTED and "tc" in kinds:
                    for c in tc.CONFIGS:
                        tpart = cp.empty(max(tc.part_bytes(n, N, K, qt, sms, c), 4) // 4, cp.float32)
                        launches = [lambda i=i, c=c, tpart=tpart: tc.tcgemv(qt, ws[i % copies], x16,
                                                                            y, part=tpart, config=c)
                                    for i in range(INNER)]
                        us[f"tc_{c}"] = round(time_graph(cp, launches, args.reps) * 1e6, 2)
                us["cublas"] = round(time_graph(cp, [lambda i=i: gemm_f32(x16, w16s[i % copies], y)
                                                     for i in range(INNER)], args.reps) * 1e6, 2)
                best = min(v for c, v in us.items() if c != "cublas")
                rows.append({"type": name, "N": N, "K": K, "n": n, "us": us, "best_gbs": round(w.nbytes / best / 1e3, 1)})
                print(f"{name:5s} {N:6d} x {K:<5d} {n:3d} " + " ".join(f"{us.get(c, float('nan')):9.1f}" for c in names)
                      + f"  {rows[-1]['best_gbs']:.0f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                               "unit": f"us a call, median of {args.reps} x {INNER} in a CUDA graph",
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
