"""Where small batches should leave the mat-vec kernels: mmvq (n <= 8, streams the quantized
bytes) against each prefill kernel (cuBLAS on the f16 copy, fused_b, mmq) at n = 1..64 tokens,
on Qwen2.5-7B's Q4_K matrices. The W16 path's w16_min_tokens and the backend's MMVQ_MAX_BATCH
come from this table (issue 5: "measure the crossover and set the default from it").

    python bench/crossover.py [--ns 1,2,4,8,12,16,32,64] [--reps 50] [--json F]

CUDA events around each call, median of --reps after warm-up; x conversions (quantize_x, the
f16 cast) are counted in the kernel that needs them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,2,4,8,12,16,32,64")
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import cupy as cp

    from minferd.kernels.cublas import gemm_f32
    from minferd.kernels.dequant import dequant_f16
    from minferd.kernels.gemm_f16 import fused_b
    from minferd.kernels.mmq import mmq
    from minferd.kernels.mmvq import MAX_COLS, mmvq
    from minferd.kernels.quant import TYPES
    from minferd.kernels.quantize_ref import random_blocks

    def timed(f) -> float:
        for _ in range(5):
            f()
        e0, e1, ts = cp.cuda.Event(), cp.cuda.Event(), []
        for _ in range(args.reps):
            e0.record()
            f()
            e1.record()
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        return statistics.median(ts)

    qt, rng, rows = TYPES[args.type], np.random.default_rng(0), []
    print(f"{'N x K':>13s} {'n':>3s} " + " ".join(f"{k:>9s}" for k in ("mmvq", "cublas", "fused_b", "mmq")) + "  (us)")
    for N, K in SHAPES:
        w = cp.asarray(random_blocks(qt, N, K, rng))
        w16 = cp.empty((N, K), cp.float16)
        dequant_f16(qt, w, w16)
        for n in (int(v) for v in args.ns.split(",")):
            x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
            y = cp.empty((n, N), cp.float32)
            us = {"cublas": timed(lambda: gemm_f32(x.astype(cp.float16), w16, y)),
                  "fused_b": timed(lambda: fused_b(qt, w, x.astype(cp.float16), y)),
                  "mmq": timed(lambda: mmq(qt, w, x, y))}
            if n <= MAX_COLS:
                us["mmvq"] = timed(lambda: mmvq(qt, w, x, y))
            rows.append({"type": args.type, "N": N, "K": K, "n": n, "us": us})
            print(f"{N:6d} x {K:<5d} {n:3d} " + " ".join(f"{us.get(k, float('nan')):9.1f}"
                                                       for k in ("mmvq", "cublas", "fused_b", "mmq")), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
