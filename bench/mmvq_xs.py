"""mmvq_xs (x in registers, kernels/mmvq_xs.cu) against mmvq at one decode column, on the launches a
7B / 8B decode token makes (q/k/v and gate/up as one launch each, as the backend groups them), and
every (UPL, R, rows a CTA) shape of mmvq_xs that fits: the data mmvq_xs.CONFIGS comes from. --pick F
writes, by type and shape class, the config whose launches of that class sum to least, where that sum
is under 98% of mmvq's (else null: mmvq keeps the class), for MINFERD_MMVQ_XS_CONFIGS.

Timing as bench/kernels.py's: a CUDA graph of back-to-back launches over enough weight copies that
L2 never holds the next one, median of --reps replays; GB/s counts the weights only.

    PYTHONPATH=. python bench/mmvq_xs.py [--models 05b,7b,8b] [--reps 20] [--json F] [--pick F]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import CEILING, copies_for, random_weights, time_graph  # noqa: E402

# (label, type, rows of each matrix in the launch, K)
CASES = {
    "05b": [("down", "Q4_K", (896,), 4864), ("down", "Q6_K", (896,), 4864)],  # its 896-wide rows are Q5_0 / Q8_0
    "7b": [("qkv", "Q4_K", (3584, 512, 512), 3584), ("o", "Q4_K", (3584,), 3584),
           ("gate+up", "Q4_K", (18944, 18944), 3584), ("down", "Q4_K", (3584,), 18944),
           ("down", "Q6_K", (3584,), 18944), ("v", "Q6_K", (512,), 3584), ("output", "Q6_K", (152064,), 3584)],
    "8b": [("qkv", "Q4_K", (4096, 1024, 1024), 4096), ("gate+up", "Q4_K", (14336, 14336), 4096),
           ("down", "Q4_K", (4096,), 14336), ("down", "Q6_K", (4096,), 14336), ("output", "Q6_K", (128256,), 4096)],
}
RPCS = (4, 8, 16, 32, 64)
WIN = 0.98  # a class goes to mmvq_xs only where its launches take under this share of mmvq's time


def pick(report: list[dict]) -> dict[str, dict[str, list | None]]:
    """{type: {class: the config with the least summed time over the class's launches, or None}}."""
    from minferd.kernels.mmvq_shapes import shape_class
    groups: dict[tuple[str, str], list[dict]] = {}
    for rec in report:
        groups.setdefault((rec["type"], shape_class(max(rec["rows"]), rec["K"])), []).append(rec)
    picks: dict[str, dict[str, list | None]] = {}
    for (t, cls), recs in sorted(groups.items()):
        timed = [{tuple(c): us for c, us in rec["sweep"]} for rec in recs]
        common = set.intersection(*(set(d) for d in timed))
        total = {c: sum(d[c] for d in timed) for c in common}
        best = min(total, key=total.get) if total else None
        won = best is not None and total[best] < WIN * sum(rec["mmvq_us"] for rec in recs)
        picks.setdefault(t, {})[cls] = list(best) if won else None
    return picks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="7b,8b")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--pick", default=None, help="write the picks by type and class here (MINFERD_MMVQ_XS_CONFIGS)")
    args = ap.parse_args()

    import cupy as cp

    from minferd.kernels import mmvq as mv, mmvq_xs as xs
    from minferd.kernels.launch import programmatic
    from minferd.kernels.quant import TYPES, row_bytes

    l2 = int(cp.cuda.Device().attributes["L2CacheSize"])
    report = []
    print(f"# median of {args.reps}; GB/s of weights; % of the {CEILING / 1e12:.1f} TB/s copy ceiling", flush=True)
    for model in args.models.split(","):
        for label, tname, rows, K in CASES[model]:
            qt = TYPES[tname]
            rb = row_bytes(qt, K)
            wbytes = sum(rows) * rb
            sets = [[w[: m * rb].reshape(m, rb) for m in rows] for w in random_weights(cp, max(rows) * rb, copies_for(wbytes, l2))]
            x = cp.random.standard_normal((1, K), dtype=cp.float32)
            scratch = cp.empty(mv.scratch_bytes(1, K), cp.uint8)
            mv.quantize_x(x, scratch)
            outs = [cp.empty((1, m), cp.float32) for m in rows]

            def launches(stationary=False, cfg=None):
                return [lambda ws=ws: mv.mmvq_group(qt, ws, x, outs, scratch=scratch, x_quantized=True,
                                                    stationary=stationary, config=cfg) for ws in sets]

            with programmatic():
                base = time_graph(cp, launches(), args.reps)
                swept = {}
                for upl, r in xs.VARIANTS:
                    for rpc in RPCS:
                        cfg = (upl, r, rpc)
                        if rpc % r == 0 and xs.fits(qt, K, max(rows), cfg):
                            swept[cfg] = time_graph(cp, launches(True, cfg), args.reps)
                default = time_graph(cp, launches(True), args.reps) if xs.fits(qt, K, max(rows)) else None
            best = min(swept, key=swept.get) if swept else None
            pct = lambda t: 100 * wbytes / t / CEILING  # noqa: E731
            rec = {"model": model, "label": label, "type": tname, "rows": rows, "K": K, "mmvq_us": base * 1e6,
                   "xs_default_us": default and default * 1e6, "xs_best": best and list(best),
                   "xs_best_us": best and swept[best] * 1e6, "sweep": [[list(c), t * 1e6] for c, t in swept.items()]}
            report.append(rec)
            print(f"{model} {label:8s} {tname} {'+'.join(map(str, rows)):>13s}x{K:<5d} mmvq {base * 1e6:7.1f} us ({pct(base):4.1f}%)"
                  + (f"  xs default {default * 1e6:7.1f}" if default else "")
                  + (f"  best {best}: {swept[best] * 1e6:7.1f} us ({pct(swept[best]):4.1f}%)" if best else "  (no xs shape fits)"),
                  flush=True)
            print("    " + " ".join(f"{c}:{t * 1e6:.1f}" for c, t in swept.items()), flush=True)
            sets = None
            cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.pick:
        picks = pick(report)
        print("picks:", json.dumps(picks), flush=True)
        Path(args.pick).write_text(json.dumps(picks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
