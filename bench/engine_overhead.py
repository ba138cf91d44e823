"""The engine's host-side cost of one decode step of B sequences, without a model: schedule,
Batch.build, postprocess (block registration and add_token: stop strings, UTF-8, the streamed
piece) and the hand-off to the clients' queues. On the GPU these run while nothing else does
between two graph replays (bench/results/s8-serve2: a 64-sequence step is 8.6 ms through the
daemon against 7.9 in the profiler), so every 0.1 ms here is ~1% of batched throughput.

    python bench/engine_overhead.py MODEL.gguf [--batch 16,64] [--steps 200]

MODEL only lends its tokenizer (the real gemma3's 262k vocabulary is the heaviest).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minferd.backend.batch import Batch  # noqa: E402
from minferd.engine.blocks import BlockManager  # noqa: E402
from minferd.engine.scheduler import Scheduler  # noqa: E402
from minferd.engine.sequence import Sequence  # noqa: E402
from minferd.model.gguf_file import GGUFFile  # noqa: E402
from minferd.model.sampler import SamplingParams  # noqa: E402
from minferd.model.tokenizer import Tokenizer  # noqa: E402


def run(tok, B: int, steps: int, prompt: int = 512) -> dict[str, float]:
    bm = BlockManager(B * (prompt + steps) // 16 + 64, 16)
    sch = Scheduler(bm, 2048, 256)
    rng = np.random.default_rng(0)
    seqs = [Sequence(rng.integers(0, 1000, prompt).tolist(), SamplingParams(temperature=0.0, max_tokens=10 ** 6),
                     prompt + steps + 1, tok) for _ in range(B)]
    for s in seqs:
        sch.add(s)
    while sch.waiting or any(s.n_uncomputed > 1 for s in seqs):  # prefill, untimed
        for s, n in sch.schedule():
            s.n_computed += n
            bm.register(s)
            if s.n_uncomputed == 0:
                s.add_token(5)
    t = dict.fromkeys(("schedule", "build", "postprocess", "flush"), 0.0)
    for _ in range(steps):
        t0 = time.perf_counter()
        step = sch.schedule()
        t1 = time.perf_counter()
        Batch.build([(s.tokens[s.n_computed:s.n_computed + n], s.n_computed, s.block_table) for s, n in step], 16,
                    width=64)
        t2 = time.perf_counter()
        for s, n in step:
            s.n_computed += n
            bm.register(s)
            s.add_token(int(rng.integers(100, 900)))
        t3 = time.perf_counter()
        for s, _ in step:
            s.flush()
        t4 = time.perf_counter()
        for k, a, b in (("schedule", t0, t1), ("build", t1, t2), ("postprocess", t2, t3), ("flush", t3, t4)):
            t[k] += b - a
    return {k: v / steps * 1e3 for k, v in t.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--batch", default="16,64")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    g = GGUFFile(args.model)
    tok = Tokenizer.from_reader(g)
    g.close()
    for B in (int(b) for b in args.batch.split(",")):
        r = run(tok, B, args.steps)
        print(f"B={B:3d}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()) + f" ms a step (total {sum(r.values()):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
