"""Prefill and decode throughput of one model per matmul path, in llama-bench's shape.

    python bench/bench.py MODEL.gguf [--paths mmq,w16,mmq@tiles] [-p 128,512] [-n 32] [-r 3] [--json F]

A path is a plan (w16, mmq, fused_b), optionally @kernel to run every prefill matmul on one
kernel the plan allows (mmq, fused_b, tiles; by default the gate table picks per matmul).

Prefill runs as the serving engine steps a prompt (--via run: the backend's step in chunks of the
model's batch, so the CUDA backend's prefill graphs; since session 16, before which it was the
eager pass, --via forward). MODEL may be gemma3-270m (the model that installs from PyPI). Each test runs -r times; the
table gives the median and the spread (min..max) in tokens per second, plus the load time and
the bytes each path holds. Figures from one run are comparable with each other, not across
machines or runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from minferd.backend.batch import Batch
from minferd.model.generate import decode_one, prefill
from minferd.model.loader import load_local


def _tokens(n: int, n_vocab: int, seed: int) -> np.ndarray:
    # Ordinary ids away from the control tokens at both ends of most vocabularies.
    return np.random.default_rng(seed).integers(300, min(n_vocab, 30000), n)


def run_prompt(lm, ids, cache, via: str):
    """A prompt's prefill from position 0 of cache: `run`, as the engine steps it (be.run, in chunks
    of the model's batch: prefill graphs where the backend has them); `forward`, the model's eager
    pass (model.forward). Returns the last token's logits on the host."""
    m, be = lm.model, lm.model.be
    cache.n_tokens = 0
    if via == "forward":
        return prefill(m, ids, cache)
    for s in range(0, len(ids), m.max_batch):
        chunk = ids[s:s + m.max_batch]
        logits = be.to_host(be.run(m, Batch.solo(chunk, s, cache), cache))
    cache.n_tokens = len(ids)
    return logits[-1]


def bench_prefill(lm, n_tokens: int, reps: int, via: str = "run") -> list[float]:
    """One cache for all repetitions, as a server keeps one: its graphs are captured by a first,
    untimed prefill (a server's first request), then replayed."""
    be, s = lm.model.be, lm.spec
    cache = lm.model.new_cache(be.untracked(), n_tokens)
    out = []
    try:
        run_prompt(lm, _tokens(n_tokens, s.n_vocab, 99), cache, via)
        for r in range(reps):
            t = time.perf_counter()
            run_prompt(lm, _tokens(n_tokens, s.n_vocab, r), cache, via)
            out.append(n_tokens / (time.perf_counter() - t))
    finally:
        be.free(cache)
    return out


def bench_decode(lm, n_tokens: int, reps: int, depth: int = 0, via: str = "run") -> list[float]:
    """tok/s of n_tokens decoded one at a time after a prompt of `depth` tokens (llama-bench -d);
    one cache for all repetitions (its decode graph captured once)."""
    be, s = lm.model.be, lm.spec
    cache = lm.model.new_cache(be.untracked(), depth + n_tokens + 1)
    out = []
    try:
        for r in range(reps):
            ids = _tokens(depth + n_tokens + 1, s.n_vocab, 100 + r)
            run_prompt(lm, ids[:depth + 1], cache, via)
            t = time.perf_counter()
            for tok in ids[depth + 1:]:
                be.to_host(decode_one(lm.model, int(tok), cache))
            out.append(n_tokens / (time.perf_counter() - t))
    finally:
        be.free(cache)
    return out


def held_bytes(lm) -> dict:
    w = lm.model.w.values()
    return {"weights": int(sum(x.data.nbytes for x in w)),
            "w16": int(sum(x.w16.nbytes for x in w if x.w16 is not None))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--paths", default="mmq,w16")
    ap.add_argument("-p", default="128", help="prompt lengths, comma-separated")
    ap.add_argument("-n", type=int, default=32, help="tokens to decode")
    ap.add_argument("-r", type=int, default=3, help="repeats")
    ap.add_argument("-d", default="0", help="decode depths: tokens of prompt before the timed ones, comma-separated")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--ctx", type=int, default=None, help="context the scratch is sized for")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--via", choices=("run", "forward"), default="run",
                    help="prefill as the engine steps it (run: graphs where the backend has them) or the eager pass")
    args = ap.parse_args(argv)
    rows = []
    for spec in args.paths.split(","):
        path, _, kernel = spec.partition("@")  # mmq@tiles: the mmq plan, every prefill matmul on tiles
        depths = [int(d) for d in args.d.split(",") if d]
        ctx = args.ctx or max([int(p) for p in args.p.split(",") if p] + [max(depths) + args.n + 1])
        lm = load_local(args.model, path, args.threads, args.device, ctx)
        lm.model.be.prefill_kernel = kernel or None
        mem = held_bytes(lm)
        tests = [(f"pp{p}", bench_prefill, int(p), ()) for p in args.p.split(",") if p] + \
                [(f"tg{args.n}" + (f"@d{d}" if d else ""), bench_decode, args.n, (d,)) for d in depths if args.n]
        for name, fn, n, more in tests:
            # warm-up: a prefill of the same length (its kernels, cuBLAS plans and arena chunks
            # are first used there; a short one ran the mat-vec path and left pp512's first rep cold)
            fn(lm, n if fn is bench_prefill else min(n, 8), 1, *more, via=args.via)
            ts = fn(lm, n, args.r, *more, via=args.via)
            rows.append({"model": lm.file.path.name, "path": spec, "test": name,
                         "tok_s_median": statistics.median(ts), "tok_s_min": min(ts), "tok_s_max": max(ts),
                         "load_ms": lm.load_ms, "bytes": mem, "threads": getattr(lm.model.be, "threads", None)})
            r = rows[-1]
            print(f"| {r['model']} | {spec:11s} | {name:10s} | {r['tok_s_median']:9.2f} "
                  f"({r['tok_s_min']:.2f}..{r['tok_s_max']:.2f}) | load {lm.load_ms:7.0f} ms | "
                  f"weights {mem['weights'] / 2**20:7.1f} MiB w16 {mem['w16'] / 2**20:7.1f} MiB |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
