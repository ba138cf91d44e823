"""Where a forward pass spends its time on the CUDA backend, kernel by kernel.

    python bench/profile_ops.py MODEL.gguf [--path w16] [--tokens 1,2048] [--ctx 2176] [--json F]
    python bench/profile_ops.py MODEL.gguf --batch 1,4,16,64 [--depth 576]   # decode steps of B sequences

One token is timed as the decode graph's replay, a batch as one eager prefill pass. --batch
times the engine's decode step of B sequences (each `depth` tokens deep, its own blocks): the
graph of its bucket replayed, and the same step with the on-device sampling the engine adds. The
per-kernel times come from CUPTI through PyTorch's profiler when PyTorch is importable (the
device image has it; it sees every kernel of the process, CuPy's and cuBLAS's too, also
inside graph replays); without it, from CUDA events around each backend op (eager only).
The gap between the wall time and the kernels' sum is time the GPU sat idle (launches, Python).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import numpy as np

from minferd.backend.batch import Batch
from minferd.config import KV_BLOCK_TOKENS
from minferd.model.generate import decode_one
from minferd.model.loader import load_local
from minferd.model.sampler import SamplingParams
from minferd.pool.estimator import kv_blocks

OPS = ("matmul", "embed", "rmsnorm", "rope", "kv_write", "attention", "swiglu", "gelu_gate")


def _short(name: str) -> str:
    name = name.replace("void ", "")
    return name if len(name) <= 90 else name[:87] + "..."


def _torch_profiler():
    try:
        import torch.profiler as tp
        return tp
    except Exception:  # noqa: BLE001 - any failure means: use events instead
        return None


def run_once(lm, ids, ctx: int):
    """One measured pass: the decode graph's replay for one token, an eager prefill otherwise.
    Returns a thunk that runs it (the graph and cache made beforehand) and a cleanup."""
    be, m = lm.model.be, lm.model
    cache = m.new_cache(be.untracked(), ctx)
    if len(ids) == 1:
        m.forward(ids[:1], cache)
        be.to_host(decode_one(m, int(ids[0]), cache))  # captures the graph

        def step():
            cache.n_tokens = 1
            return be.to_host(decode_one(m, int(ids[0]), cache))
    else:
        def step():
            cache.n_tokens = 0
            return be.to_host(m.forward(ids, cache))
    return step, lambda: (be.graphs.clear(), be.free(cache))


def decode_steps(lm, n_seqs: int, depth: int, sample: bool):
    """The engine's decode step of n_seqs sequences, each `depth` tokens into its own blocks (their
    keys are zeros: the time does not depend on the values). Returns (step, cleanup)."""
    be, m = lm.model.be, lm.model
    per = -(-(depth + 1) // KV_BLOCK_TOKENS)
    cache = m.new_cache(be.untracked(), kv_blocks(n_seqs * per * KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS)
    ids = np.random.default_rng(0).integers(0, m.spec.n_vocab, n_seqs)
    batch = Batch.build([([int(ids[b])], depth, list(range(b * per, (b + 1) * per))) for b in range(n_seqs)],
                        KV_BLOCK_TOKENS, width=per)

    class Seq:  # what on-device sampling reads of a sequence
        def __init__(self, b):
            from minferd.model.sampler import Sampler
            self.params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=b)
            self.sampler, self.tokens = Sampler(self.params), [int(ids[b])]

    seqs = [Seq(b) for b in range(n_seqs)]

    def step():
        logits = be.decode(m, batch, cache)
        return be.sample(logits, seqs) if sample else be.to_host(logits[:, :8])
    return step, lambda: (be.graphs.clear(), be.free(cache))


def profile_cupti(tp, lm, n_tokens: int, ctx: int, reps: int, steps=None) -> dict:
    be = lm.model.be
    ids = np.random.default_rng(0).integers(300, 30000, n_tokens)
    step, done = steps or run_once(lm, ids, ctx)
    step()
    walls = []
    with tp.profile(activities=[tp.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            be.stream.synchronize()
            t = time.perf_counter()
            step()
            be.stream.synchronize()
            walls.append(time.perf_counter() - t)
    done()
    totals: dict = collections.defaultdict(float)
    counts: dict = collections.Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name:
            totals[_short(e.name)] += e.device_time / 1e3 / reps
            counts[_short(e.name)] += 1
    rows = sorted(({"op": k, "ms": v, "calls": counts[k] // reps} for k, v in totals.items()), key=lambda x: -x["ms"])
    return {"tokens": n_tokens, "how": "cupti", "wall_ms": 1e3 * float(np.median(walls)),
            "ops_ms": sum(totals.values()), "kernels": sum(r["calls"] for r in rows), "rows": rows}


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


def profile_events(lm, n_tokens: int, ctx: int, reps: int) -> dict:
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
            m.forward(ids[:1], cache)
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
    return {"tokens": n_tokens, "how": "events", "wall_ms": 1e3 * float(np.median(walls)),
            "ops_ms": sum(totals.values()), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--path", default="w16")
    ap.add_argument("--tokens", default="1,2048")
    ap.add_argument("--ctx", type=int, default=2176)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--batch", default=None, help="decode steps of these numbers of sequences instead")
    ap.add_argument("--depth", type=int, default=576, help="--batch: tokens each sequence has before")
    args = ap.parse_args(argv)
    tp = _torch_profiler()
    lm = load_local(args.model, args.path, device="cuda", ctx=args.ctx)
    out = []
    if args.batch:
        for n in (int(b) for b in args.batch.split(",")):
            for sample in (False, True):
                res = profile_cupti(tp, lm, n, args.ctx, args.reps, steps=decode_steps(lm, n, args.depth, sample))
                res.update(sequences=n, depth=args.depth, sampled=sample)
                out.append(res)
                print(f"\n# {args.path}, decode step of {n} sequences at depth {args.depth}"
                      f"{' + sampling' if sample else ''}: wall {res['wall_ms']:.3f} ms "
                      f"({n / res['wall_ms'] * 1e3:.0f} tok/s), kernels {res['ops_ms']:.3f} ms in "
                      f"{res.get('kernels', '?')} launches")
                for r in res["rows"][:args.top]:
                    print(f"{r['ms']:8.3f} ms {r['calls']:5d}x {100 * r['ms'] / res['ops_ms']:5.1f}%  {r['op']}")
        args.tokens = ""
    for n in (int(t) for t in args.tokens.split(",") if t):
        res = profile_cupti(tp, lm, n, args.ctx, args.reps) if tp else profile_events(lm, n, args.ctx, args.reps)
        out.append(res)
        print(f"\n# {args.path}, {n} tokens ({res['how']}): wall {res['wall_ms']:.3f} ms, "
              f"kernels {res['ops_ms']:.3f} ms in {res.get('kernels', '?')} launches")
        for r in res["rows"][:args.top]:
            print(f"{r['ms']:8.3f} ms {r['calls']:5d}x {100 * r['ms'] / res['ops_ms']:5.1f}%  {r['op']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
