"""tcgemv's K splits, swept: each split count of each 7B / 8B shape at 16-64 tokens, timed as a
step runs it (INNER launches in one CUDA graph over weight copies that defeat the L2), beside the
count splits() picks, with the CTAs an SM holds (CUDA's occupancy) and the waves that makes.

A split count sets the grid: tiles x splits CTAs, each walking nb / splits blocks of K. Too few
and the SMs idle; one CTA past a whole wave and the last wave runs nearly empty; so the question
is which count to launch, and whether "waves" predicts it. (Session 19, H200: splits() picks
within ~5% of the best count nearly everywhere, and waves do not predict the best:
bench/results/s19/call1-tc-splits.log.)

    python bench/tc_splits.py [--types Q4_K,Q6_K] [--ns 16] [--models 7b,8b] [--configs base,cl]
        [--config NAME=KW,PF,RT,CTAS ...] [--reps 10] [--json F]

--config adds a config to tcgemv.CONFIGS in this process only (splits meet as "auto" decides): warps
a CTA, blocks a warp fetches ahead, 16-row tiles a warp holds, CTAs an SM the splits aim at.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"7b": ((3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)),
          "8b": ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336))}
INNER = 10


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--ns", default="16")
    ap.add_argument("--models", default="7b,8b")
    ap.add_argument("--configs", default="base,cl")
    ap.add_argument("--config", action="append", default=[], help="NAME=KW,PF,RT,CTAS: a config to try")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp

    from kernels import copies_for, time_graph
    from minferd.kernels import tcgemv as tc
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks

    for spec in args.config:
        name, _, vals = spec.partition("=")
        kw, pf, rt, ctas = (int(v) for v in vals.split(","))
        tc.CONFIGS[name] = (kw, pf, rt, ctas, None)
        args.configs += f",{name}"
    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    sms = tc.sm_count(0)
    rng = np.random.default_rng(0)
    rows = []
    print("type  N x K          n  config tiles CTAs/SM  picked (us)  | splits: us (waves)")
    for name in args.types.split(","):
        qt = TYPES[name]
        for N, K in (s for m in args.models.split(",") for s in SHAPES[m]):
            w = cp.asarray(random_blocks(qt, N, K, rng))
            copies = copies_for(w.nbytes, l2)
            ws = [w] + [w.copy() for _ in range(copies - 1)]
            nb = K // qt.block_elems
            for n in (int(v) for v in args.ns.split(",")):
                x16 = cp.asarray(rng.standard_normal((n, K)).astype(np.float16))
                y = cp.empty((n, N), cp.float32)
                part = cp.empty(nb * n * N, cp.float32)
                for c in args.configs.split(","):
                    clustered = tc.clustered_at(n, K, c)
                    tiles = -(-N // tc.rows_per_cta(n, qt, c))
                    occ = tc.ctas_per_sm(qt, n, c)
                    picked = tc.splits(qt, N, nb, n, sms, c)
                    cands = (1,) + tc.CLUSTERS if clustered else sorted({*range(1, 13), nb // 4, nb // 2, picked})
                    us = {}
                    for s in (s for s in cands if 1 <= s <= nb):
                        launches = [lambda i=i, s=s: tc.tcgemv(qt, ws[i % copies], x16, y, part=part, config=c, split=s)
                                    for i in range(INNER)]
                        us[s] = round(time_graph(cp, launches, args.reps) * 1e6, 2)
                    best = min(us, key=us.get)
                    rows.append({"type": name, "N": N, "K": K, "n": n, "config": c, "tiles": tiles, "occupancy": occ,
                                 "picked": picked, "best": best, "us": us,
                                 "best_gbs": round(w.nbytes / us[best] / 1e3, 1)})
                    waves = lambda s: f"{tiles * s / max(1, occ * sms):.2f}"  # noqa: E731
                    print(f"{name:5s} {N:5d} x {K:<5d} {n:3d} {c:6s} {tiles:5d} {occ:3d}"
                          f" {picked:4d} ({us.get(picked, 0):.1f}) best {best} ({us[best]:.1f} us,"
                          f" {rows[-1]['best_gbs']:.0f} GB/s) | "
                          + " ".join(f"{s}:{v:.1f}({waves(s)})" for s, v in us.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                               "unit": f"us a call, median of {args.reps} x {INNER} in a CUDA graph",
                                               "sms": sms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
