"""Speed of the quantized prefill GEMM (minferd/kernels/mmq.py) at Qwen2.5-7B's matrix shapes.

For M in --ms (tokens) and each (N, K) weight shape it times
  mmq      out (M, N) = x (M, K) @ dequant(W).T for --types, x's quantization included,
           with the automatic tile config (--configs adds each config forced)
  cublas   cupy.matmul of f16 x (M, K) and f16 W.T (cuBLAS), for scale
and prints ms and TOP/s (2*M*N*K operations / time). Timing: CUDA events around each call
on one stream, median of --reps calls after --warmup calls. W is random valid blocks
(random_blocks.random_blocks); one buffer per shape (the GEMM is compute-bound: L2 reuse of
W between calls changes little).

    PYTHONPATH=. python bench/mmq.py [--types Q4_K,Q6_K,Q8_0] [--ms 512,2048] [--json F]
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

SHAPES = [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]


def time_fn(cp, f, reps: int, warmup: int) -> float:
    """Median seconds of f() between two events on the current stream."""
    for _ in range(warmup):
        f()
    cp.cuda.get_current_stream().synchronize()
    ts = []
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(reps):
        e0.record()
        f()
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    ap.add_argument("--ms", default="512,2048")
    ap.add_argument("--configs", action="store_true", help="also time every tile config forced")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp

    from minferd.kernels import mmq as mq
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks

    dev = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    types = [t for t in args.types.split(",") if t]
    ms = [int(m) for m in args.ms.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    print(f"# {name}, median of {args.reps} after {args.warmup} warm-up calls", flush=True)
    t0 = time.time()
    for N, K in SHAPES:
        ws = {t: cp.asarray(random_blocks(TYPES[t], N, K, rng)) for t in types}
        w16 = cp.random.standard_normal((N, K), dtype=cp.float32).astype(cp.float16)
        for M in ms:
            ops = 2.0 * M * N * K
            x = cp.random.standard_normal((M, K), dtype=cp.float32)
            out = cp.empty((M, N), cp.float32)
            scratch = cp.empty(max(mq.scratch_bytes(TYPES[t], M, N, K) for t in types), cp.uint8)

            def rec(label, t, **extra):
                row = {"what": label, "M": M, "N": N, "K": K, "ms": t * 1e3, "tops": ops / t / 1e12, **extra}
                rows.append(row)
                print(f"{label:22s} M={M:5d} N={N:6d} K={K:6d} {t * 1e3:8.3f} ms {ops / t / 1e12:7.1f} TOP/s", flush=True)

            for t in types:
                qt = TYPES[t]
                for cfg in [None] + (list(mq.CONFIGS) if args.configs else []):
                    tt = time_fn(cp, lambda: mq.mmq(qt, ws[t], x, out, scratch=scratch, config=cfg), args.reps, args.warmup)
                    used = cfg or mq.pick_config(M, N)
                    rec(f"mmq {t} {used}{'' if cfg is None else '*'}", tt, type=t, config=used, forced=cfg is not None)
            x16 = x.astype(cp.float16)
            tt = time_fn(cp, lambda: cp.matmul(x16, w16.T), args.reps, args.warmup)
            rec("cublas f16", tt, type="F16")
        del ws, w16
        cp.get_default_memory_pool().free_all_blocks()

    # summary: TOP/s per shape, default config
    print(f"\n# TOP/s (2*M*N*K / median time), x quantization included; {time.time() - t0:.0f} s")
    labels = []
    for r in rows:
        if "forced" in r and r["forced"]:
            continue
        lab = r["what"] if r["type"] == "F16" else f"mmq {r['type']}"
        if lab not in labels:
            labels.append(lab)
    cols = [(M, N, K) for M in ms for N, K in SHAPES]
    print(f"{'':16s}" + "".join(f"{f'{M}:{N}x{K}':>17s}" for M, N, K in cols) + f"{'mean':>8s}")
    for lab in labels:
        cells, vals = [], []
        for M, N, K in cols:
            m = [r for r in rows if r["M"] == M and r["N"] == N and r["K"] == K and not r.get("forced")
                 and (r["what"] == lab if r["type"] == "F16" else f"mmq {r['type']}" == lab)]
            if m:
                cells.append(f"{m[0]['ms']:7.3f}ms {m[0]['tops']:6.1f}")
                vals.append(m[0]["tops"])
            else:
                cells.append("")
        mean = f"{statistics.mean(vals):8.1f}" if vals else ""
        print(f"{lab:16s}" + "".join(f"{c:>17s}" for c in cells) + mean)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "reps": args.reps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
