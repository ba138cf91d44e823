"""Throughput of the NumPy reference dequantizers (minferd/kernels/dequant_ref.py).

The CPU backend dequantizes every matmul weight at each use, in row blocks of about
2^18 elements spread over a thread pool, so that is what this measures, per type:
  whole   one call for the whole weight into a reused buffer (default 640 x 2048, a
          gemma3-270m ffn_down)
  blocks  the same weight as 2^18-element row blocks, one thread
  pool    the row blocks over --threads threads (numpy releases the GIL in big ufuncs)
Figures are best-of-N wall time, in million elements per second.

    PYTHONPATH=. python bench/dequant_cpu.py [--rows 640] [--cols 2048] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from minferd.kernels.dequant_ref import dequantize
from minferd.kernels.quant import SUPPORTED_NAMES, TYPES
from minferd.kernels.random_blocks import random_blocks

BLOCK_ELEMS = 1 << 18  # as minferd/backend/cpu.py


def best_time(fn, min_total_s: float = 0.3, max_reps: int = 200) -> float:
    fn()  # warm: first touch of buffers
    times, t_end = [], time.perf_counter() + min_total_s
    while len(times) < max_reps and (len(times) < 5 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_type(name: str, rows: int, cols: int, pool: ThreadPoolExecutor, rng) -> dict:
    qt = TYPES[name]
    raw = random_blocks(qt, rows, cols, rng)
    out = np.empty((rows, cols), np.float32)
    step = max(1, BLOCK_ELEMS // cols)
    spans = [(r, min(rows, r + step)) for r in range(0, rows, step)]

    def block(span):  # a fresh result per block, used and dropped, as the backend's matmul does
        r0, r1 = span
        dequantize(qt, raw[r0:r1], r1 - r0, cols)

    whole = best_time(lambda: dequantize(qt, raw, rows, cols, out=out))
    blocks = best_time(lambda: [block(s) for s in spans])
    pooled = best_time(lambda: list(pool.map(block, spans)))
    n = rows * cols / 1e6
    return {"type": name, "whole_ms": whole * 1e3, "whole": n / whole,
            "blocks": n / blocks, "pool": n / pooled}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=640)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--types", default=",".join(SUPPORTED_NAMES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with ThreadPoolExecutor(args.threads) as pool:
        results = [bench_type(t, args.rows, args.cols, pool, rng) for t in args.types.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{args.rows} x {args.cols} weight; row blocks of {BLOCK_ELEMS} elements; pool of {args.threads}")
    print(f"{'type':6s} {'whole ms':>9s} {'whole M/s':>10s} {'blocks M/s':>11s} {'pool M/s':>9s}")
    for r in results:
        print(f"{r['type']:6s} {r['whole_ms']:9.2f} {r['whole']:10.0f} {r['blocks']:11.0f} {r['pool']:9.0f}")


if __name__ == "__main__":
    main()
