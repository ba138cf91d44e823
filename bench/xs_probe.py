"""The x-stationary mat-vec probe (kernels/mmvq_xs.cu) against mmvq at a model's one-column shapes.

For each type and shape, both kernels run as CUDA graphs of back-to-back launches over enough weight
copies that L2 never holds the next (bench/kernels.py's timing), random blocks of the type, x
quantized once: mmvq with its CONFIGS shape, then mmvq_xs at every compiled config that fits K and
every rows-per-CTA of --rows. Prints microseconds a launch, GB/s of weight bytes, and mmvq_xs's
best against mmvq; each xs output is checked against mmvq's on the same x first (the same unit
products summed in another order: ~1e-6 relative).

    PYTHONPATH=. python bench/xs_probe.py [--types Q4_K,Q6_K] [--models 7b] [--rows 8,16,32,64] [--reps 20]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import MODEL_SHAPES, copies_for, time_graph  # noqa: E402  (bench/kernels.py)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--models", default="7b")
    ap.add_argument("--rows", default="8,16,32,64", help="rows a CTA owns (mmvq_xs's rows_per_cta)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import cupy as cp

    from minferd.kernels import mmvq as mv
    from minferd.kernels import mmvq_xs as xs
    from minferd.kernels.quant import by_name
    from minferd.kernels.random_blocks import random_blocks
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    rows_opts = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(3)
    print(f"{'type':5s} {'rows x K':>13s} {'mmvq us':>8s} {'GB/s':>6s}   {'best xs (cfg, rows/CTA)':>24s} {'us':>6s} "
          f"{'GB/s':>6s} {'xs/mmvq':>7s}  worst rel diff", flush=True)
    for t in args.types.split(","):
        qt = by_name(t)
        for model in args.models.split(","):
            for rows, K in MODEL_SHAPES[model]:
                host = random_blocks(qt, rows, K, rng)
                ws = [cp.asarray(host)]
                ws += [ws[0].copy() for _ in range(copies_for(host.nbytes, l2) - 1)]
                x = cp.asarray(rng.standard_normal((1, K)).astype(np.float32))
                scratch = cp.empty(mv.scratch_bytes(1, K), cp.uint8)
                mv.quantize_x(x, scratch)
                outs = [cp.empty((1, rows), cp.float32) for _ in ws]
                ref = cp.empty((1, rows), cp.float32)
                mv.mmvq(qt, ws[0], x, ref, scratch=scratch, x_quantized=True)
                t_mmvq = time_graph(cp, [lambda w=w, o=o: mv.mmvq(qt, w, x, o, scratch=scratch, x_quantized=True)
                                         for w, o in zip(ws, outs)], args.reps)
                best, worst = None, 0.0
                for cfg in xs.CONFIGS:
                    if not xs.fits(qt, K, cfg):
                        continue
                    for rpc in rows_opts:
                        o = cp.full((1, rows), cp.nan, cp.float32)
                        xs.mmvq_xs(qt, ws[0], scratch, o, config=cfg, rows_per_cta=rpc)
                        d = float(cp.linalg.norm(o - ref) / cp.linalg.norm(ref))
                        worst = max(worst, d if d == d else float("inf"))
                        s = time_graph(cp, [lambda w=w, o=o, c=cfg, r=rpc: xs.mmvq_xs(qt, w, scratch, o, config=c,
                                                                                      rows_per_cta=r)
                                            for w, o in zip(ws, outs)], args.reps)
                        if best is None or s < best[0]:
                            best = (s, cfg, rpc)
                gb = host.nbytes / 1e9
                line = f"{t:5s} {rows:6d}x{K:<6d} {t_mmvq * 1e6:8.2f} {gb / t_mmvq:6.0f}   "
                if best:
                    s, cfg, rpc = best
                    line += f"{str(cfg) + ', ' + str(rpc):>24s} {s * 1e6:6.2f} {gb / s:6.0f} {s / t_mmvq:7.3f}  {worst:.1e}"
                else:
                    line += "no xs config fits K"
                print(line, flush=True)
                del ws, outs
    return 0


if __name__ == "__main__":
    sys.exit(main())
