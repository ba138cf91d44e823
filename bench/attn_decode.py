"""Speed of the decode attention kernels at Qwen2.5-7B's attention shape (hq 28, hkv 4, d 128,
f16 KV): attn_decode.cu's batched, paged kernels, with either partials kernel (tc: tensor
cores; simt: f32 FMAs) and the merge. (The per-head ops.cu pair they replaced, and the "old"
row this bench timed it in, were removed in session 15.)

Prints, per shape, the median microseconds of one call (one layer's attention) and the KV
bytes it must read over that time. Timing as bench/kernels.py: a CUDA graph of back-to-back
calls (decode runs as a graph), rotating over enough KV copies (one per "layer") that L2
never holds the next one, replayed after a warm-up; median over --reps replays. The new
kernel runs at splits_for()'s split count and at a few others (the data splits_for is tuned
by); the partials and merge kernels are also timed apart.

    PYTHONPATH=. python bench/attn_decode.py [--reps 10] [--more]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import time_graph  # noqa: E402  (bench/kernels.py: median seconds a launch of a graph)

HQ, HKV, D = 28, 4, 128
L2 = 60 << 20
BS = 16


class Bump:
    """Never reuses memory: every buffer a captured call takes stays its own."""

    def __init__(self, cp, nbytes):
        self.base, self.off, self.n = cp.cuda.alloc(nbytes), 0, nbytes

    def __call__(self, size):
        size = (size + 255) // 256 * 256
        if self.off + size > self.n:
            raise MemoryError("bench bump allocator exhausted")
        p = self.base + self.off
        self.off += size
        return p


def time_calls(cp, calls, reps: int) -> float:
    """Median microseconds per call of a graph of `calls`, every buffer its own (Bump)."""
    with cp.cuda.using_allocator(Bump(cp, 1 << 30)):
        return time_graph(cp, calls, reps) * 1e6


def kv_copies(cp, n_slots: int):
    """(K, V) pairs, one per layer, enough that together they are >= 3x the L2."""
    nbytes = 2 * n_slots * HKV * D * 2
    count = max(2, math.ceil(3 * L2 / nbytes))
    k = cp.random.standard_normal((n_slots, HKV, D), dtype=cp.float32).astype(cp.float16)
    v = cp.random.standard_normal((n_slots, HKV, D), dtype=cp.float32).astype(cp.float16)
    return [(k, v)] + [(k.copy(), v.copy()) for _ in range(count - 1)], nbytes


def bench_new(cp, B: int, ctx: int, splits_list, reps: int, kinds=("tc", "simt"), inner: int = 20):
    from minferd.kernels import attn_decode as ad
    rng = np.random.default_rng(0)
    nb = -(-ctx // BS)
    layers, nbytes = kv_copies(cp, B * nb * BS)
    bt = cp.asarray(rng.permutation(B * nb).astype(np.int32).reshape(B, nb))  # shuffled, as a paged pool is
    lens = cp.full((B,), ctx, cp.int32)
    q = cp.random.standard_normal((B, HQ, D), dtype=cp.float32)
    out = cp.empty((B, HQ * D), cp.float32)
    default = ad.KERNEL_BY_D[D]
    rows = []
    for kind in kinds:
        ad.KERNEL_BY_D[D] = kind
        best = ad.splits_for(B, HKV, ctx, d=D)
        for s in dict.fromkeys([best] + list(splits_list)):
            calls = [lambda kv=layers[i % len(layers)], s=s: ad.attn_decode(q, kv[0], kv[1], bt, lens, out,
                                                                         block_size=BS, window=0, scale=D ** -0.5,
                                                                         splits=s)
                     for i in range(inner)]
            us = time_calls(cp, calls, reps)
            rows.append((kind, s, us))
            tag = " (splits_for)" if s == best else ""
            print(f"  new  {kind:4s} splits={s:<4d}{tag:14s} {us:8.1f} us  {nbytes / us * 1e-6:5.2f} TB/s", flush=True)
        # the two kernels apart, at splits_for's count
        po = cp.empty((B, HQ, best, D), cp.float32)
        pml = cp.empty((B, HQ, best, 2), cp.float32)
        none = (np.uint64(0), np.uint64(0), np.int32(0))
        split = [lambda kv=layers[i % len(layers)]: ad._launch_split(q, kv[0], kv[1], bt, lens, best, po, pml, BS,
                                                                     0, D ** -0.5) for i in range(inner)]
        merge = [lambda: ad._launch_merge(po, pml, out, none) for _ in range(inner)]
        us_s = time_calls(cp, split, reps)
        print(f"       {kind:4s} splits={best}: split kernel {us_s:.1f} us ({nbytes / us_s * 1e-6:.2f} TB/s), "
              f"merge {time_calls(cp, merge, reps):.1f} us", flush=True)
    ad.KERNEL_BY_D[D] = default
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--more", action="store_true", help="the other shapes (B 1, 8, 32, 256) instead of the two targets")
    a = ap.parse_args()
    import cupy as cp
    dev = cp.cuda.Device()
    print(f"{cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, {dev.attributes['MultiProcessorCount']} SMs; "
          f"hq={HQ} hkv={HKV} d={D} f16 KV, block_size {BS}; one layer per call")
    shapes = [(1, 16384, (64, 128)), (64, 640, (2,))]
    if a.more:
        shapes = [(1, 4096, (64,)), (8, 4096, (8,)), (32, 2048, (2,)), (256, 512, ())]
    for B, ctx, sweep in shapes:
        print(f"B={B} ctx={ctx}")
        bench_new(cp, B, ctx, sweep, a.reps)


if __name__ == "__main__":
    main()
