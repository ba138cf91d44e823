"""Throughput of the NumPy reference dequantizers (minferd/kernels/dequant_ref.py).

The CPU backend dequantizes every matmul weight at each use, so this is its floor.
Prints, per type, the time for one weight (default 640 rows x 2048, a gemma3-270m
ffn_down) on one thread, and the throughput with the rows split over a thread pool
(numpy releases the GIL in big ufuncs, so threads should scale).

    python bench/dequant_cpu.py [--rows 640] [--cols 2048] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from minferd.kernels.dequant_ref import dequantize
from minferd.kernels.quant import SUPPORTED_NAMES, TYPES, row_bytes
from minferd.kernels.quantize_ref import random_blocks


def best_time(fn, min_total_s: float = 0.3, max_reps: int = 200) -> float:
    fn()  # warm: first-touch of buffers, lazy imports
    times, t_end = [], time.perf_counter() + min_total_s
    while len(times) < max_reps and (len(times) < 5 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_type(name: str, rows: int, cols: int, threads: int, rng) -> dict:
    qt = TYPES[name]
    raw = random_blocks(qt, rows, cols, rng)
    out = np.empty((rows, cols), np.float32)
    one = best_time(lambda: dequantize(qt, raw, rows, cols, out=out))
    fresh = best_time(lambda: dequantize(qt, raw, rows, cols))  # includes allocating the result

    # Row blocks over a pool, as the CPU backend does; each block writes its slice of out.
    step = max(1, -(-rows // threads))
    spans = [(r, min(rows, r + step)) for r in range(0, rows, step)]
    with ThreadPoolExecutor(threads) as pool:
        def run_pool():
            list(pool.map(lambda s: dequantize(qt, raw[s[0]:s[1]], s[1] - s[0], cols, out=out[s[0]:s[1]]), spans))
        pooled = best_time(run_pool)
    n = rows * cols
    return {"type": name, "ms": one * 1e3, "ms_alloc": fresh * 1e3, "melem_s": n / one / 1e6,
            "melem_s_threads": n / pooled / 1e6, "gb_in_s": rows * row_bytes(qt, cols) / one / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=640)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--types", default=",".join(SUPPORTED_NAMES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    results = [bench_type(t, args.rows, args.cols, args.threads, rng) for t in args.types.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{args.rows} x {args.cols} weight, {args.threads} threads for the pooled column")
    print(f"{'type':6s} {'ms':>7s} {'ms+alloc':>9s} {'Melem/s':>9s} {'Melem/s xT':>11s} {'GB/s in':>8s}")
    for r in results:
        print(f"{r['type']:6s} {r['ms']:7.2f} {r['ms_alloc']:9.2f} {r['melem_s']:9.0f} "
              f"{r['melem_s_threads']:11.0f} {r['gb_in_s']:8.2f}")


if __name__ == "__main__":
    main()
