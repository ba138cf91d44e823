"""Where a forward pass spends its time on the CUDA backend: every backend op timed with CUDA
events (eager, not the decode graph), summed by op and, for matmuls, by weight type and shape.

    python bench/profile_ops.py MODEL.gguf [--path w16] [--tokens 1,2048] [--ctx 2176] [--json F]

Event pairs add a little time of their own per op, so the sum exceeds the pass's wall time by
a few percent; compare ops with each other, and the total with bench.py's figures.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import numpy as np

from minferd.model.loader import load_local

OPS = ("matmul", "embed", "rmsnorm", "rope", "kv_write", "attention", "swiglu", "gelu_gate")


def instrument(be, cp, records):
    """Wrap the backend's ops: each call records (label, start event, end event)."""
    for op in OPS:
        fn = getattr(be, op)

        def timed(*args, _fn=fn, _op=op, **kw):
            label = _op
            if _op == "matmul":
                w = args[1]
                label = f"matmul {w.qtype.name} {w.n_rows}x{w.row_elems}" + (" w16" if w.w16 is not None else "")
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(be.stream)
            out = _fn(*args, **kw)
            end.record(be.stream)
            records.append((label, start, end))
            return out

        setattr(be, op, timed)


def profile(lm, n_tokens: int, ctx: int, reps: int = 3) -> dict:
    import cupy as cp
    be, m = lm.model.be, lm.model
    records: list = []
    instrument(be, cp, records)
    ids = np.random.default_rng(0).integers(300, 30000, n_tokens)
    totals: dict = collections.defaultdict(float)
    counts: dict = collections.Counter()
    walls = []
    for r in range(reps + 1):  # the first pass warms up (compiles, caches)
        cache = m.new_cache(be.untracked(), ctx)
        if n_tokens == 1:
            m.forward(ids[:1], cache)  # a token in the cache, then the measured one
        records.clear()
        be.stream.synchronize()
        t = time.perf_counter()
        be.to_host(m.forward(ids, cache))
        be.stream.synchronize()
        wall = time.perf_counter() - t
        be.free(cache)
        if r == 0:
            continue
        walls.append(wall)
        for label, s, e in records:
            totals[label] += cp.cuda.get_elapsed_time(s, e) / reps
            counts[label] += 1
    rows = sorted(({"op": k, "ms": v, "calls": counts[k] // reps} for k, v in totals.items()), key=lambda x: -x["ms"])
    return {"tokens": n_tokens, "wall_ms": 1e3 * float(np.median(walls)), "ops_ms": sum(totals.values()), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--path", default="w16")
    ap.add_argument("--tokens", default="1,2048")
    ap.add_argument("--ctx", type=int, default=2176)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    lm = load_local(args.model, args.path, device="cuda", ctx=args.ctx)
    out = []
    for n in (int(t) for t in args.tokens.split(",")):
        res = profile(lm, n, args.ctx)
        out.append(res)
        print(f"\n# {n} tokens: wall {res['wall_ms']:.2f} ms, ops {res['ops_ms']:.2f} ms")
        for r in res["rows"][:25]:
            print(f"{r['op']:40s} {r['ms']:9.3f} ms  {r['calls']:5d} calls  {100 * r['ms'] / res['ops_ms']:5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
