"""Speed of the GPU sampler (minferd/kernels/sample.py) at Qwen's vocab, B = 1, 8, 64.

Prints the median microseconds per call of
  sample   llama.cpp server's defaults (T 0.8, top_k 40, top_p 0.95, min_p 0.05) with a
           repeat penalty of 1.1 over a 64-token window
  k256     top_k 256, top_p 0.95, no penalty
  greedy   sample() with every row at temperature 0
  argmax   argmax()
each as a CUDA graph of back-to-back launches (decode runs as a graph), median over --reps
replays; the launches rotate over enough logits copies (>= 3x the L2) that the next one
is never in L2, as the LM head's output would mostly not be. `plain` is the same kernel
launched from Python without a graph (what launch overhead adds).

    PYTHONPATH=. python bench/sample.py [--vocab 152064] [--batches 1,8,64] [--reps 20] [--ctas 128,256]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import time_graph  # noqa: E402  (bench/kernels.py: median seconds a launch of a graph)


def time_plain(cp, launches, reps: int) -> float:
    times = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for f in launches:
            f()
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / len(launches))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ctas", default="", help="TARGET_CTAS values to compare, e.g. 128,256")
    args = ap.parse_args()

    import cupy as cp

    import minferd.kernels.sample as sm
    from minferd.kernels.sample import argmax, sample

    dev = cp.cuda.Device()
    l2 = int(dev.attributes["L2CacheSize"])
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    V = args.vocab
    print(f"# {name}, L2 {l2 >> 20} MiB, V = {V}, median us per call over {args.reps} graph replays", flush=True)
    for ctas in [int(c) for c in args.ctas.split(",") if c] or [sm.TARGET_CTAS]:
        sm.TARGET_CTAS = ctas
        print(f"# TARGET_CTAS {ctas}", flush=True)
        run(cp, sm, sample, argmax, V, l2, args)
    return 0


def run(cp, sm, sample, argmax, V, l2, args) -> None:
    rng = np.random.default_rng(0)
    for B in (int(b) for b in args.batches.split(",")):
        nbytes = B * V * 4
        copies = max(3, math.ceil(3 * l2 / nbytes))
        host = (rng.standard_normal((B, V), dtype=np.float32) * 2.5)
        first = cp.asarray(host)
        logits = [first] + [first.copy() for _ in range(copies - 1)]
        f32 = lambda x: cp.full(B, x, cp.float32)  # noqa: E731
        hist = cp.asarray(rng.integers(0, V, (B, 64)).astype(np.int32))
        no_hist = cp.zeros((B, 0), cp.int32)
        u = cp.asarray(rng.random(B, dtype=np.float32))
        out = cp.empty(B, cp.int32)
        cases = {
            "sample": (f32(0.8), cp.full(B, 40, cp.int32), f32(0.95), f32(0.05), f32(1.1), hist),
            "k256": (f32(1.0), cp.full(B, 256, cp.int32), f32(0.95), f32(0.0), f32(1.0), no_hist),
            "greedy": (f32(0.0), cp.full(B, 40, cp.int32), f32(1.0), f32(0.0), f32(1.0), no_hist),
        }
        line = []
        for label, (T, k, tp, mp, pen, h) in cases.items():
            launches = [lambda x=x: sample(x, T, k, tp, mp, pen, h, u, out) for x in logits]
            t = time_graph(cp, launches, args.reps)
            tp_ = time_plain(cp, launches, args.reps)
            line.append(f"{label} {t * 1e6:7.1f} (plain {tp_ * 1e6:6.1f})")
        launches = [lambda x=x: argmax(x, out) for x in logits]
        line.append(f"argmax {time_graph(cp, launches, args.reps) * 1e6:7.1f}")
        print(f"B={B:3d} S={sm.segments(B, V)[0]:2d}  " + "  ".join(line), flush=True)
        del logits, first
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    raise SystemExit(main())
