"""mmvq_ids (an MoE decode's expert products) at the real presets' shapes, every kernel shape timed.

    PYTHONPATH=. python bench/moe_ids.py [--presets 30b-a3b,20b] [--reps 20] [--json BEST.json]

Each shape is a graph of launches over distinct experts (as a decode step's layers read distinct
bytes; the same experts again would be L2 hits), timed per launch. Every variant's output is
checked against the default's. --json writes the best variant per type and class of rows, in the
form MINFERD_IDS_CONFIGS reads (the A/B of a bench before the table in kernels/mmvq.py changes).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import time_graph  # noqa: E402  (bench/kernels.py)

# (preset, what, type, rows, K, n_expert, k, gate+up paired, biased)
SHAPES = {
    "30b-a3b": [("gate+up", "Q4_K", 768, 2048, 128, 8, True, False),
                ("down", "Q4_K", 2048, 768, 128, 8, False, False),
                ("down", "Q6_K", 2048, 768, 128, 8, False, False)],
    "20b": [("gate+up", "MXFP4", 2880, 2880, 32, 4, True, True),
            ("down", "MXFP4", 2880, 2880, 32, 4, False, True)],
}
VARIANTS = ((4, 1, 1, 1), (4, 1, 2, 1), (4, 1, 4, 1), (4, 2, 2, 1), (4, 2, 4, 1), (4, 4, 1, 1), (4, 4, 2, 1),
            (8, 1, 2, 1), (8, 1, 4, 1), (8, 2, 4, 1), (8, 4, 2, 1), (8, 8, 1, 1), (4, 1, 8, 1), (4, 1, 2, 2),
            (2, 1, 4, 1), (2, 1, 2, 1))


def main() -> None:
    import cupy as cp

    from minferd.kernels import mmvq as mv
    from minferd.kernels.mmvq_ids import ids_config, mmvq_ids
    from minferd.kernels.quant import TYPES, row_bytes
    from minferd.kernels.random_blocks import random_blocks

    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="30b-a3b,20b")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    shapes = [s for p in args.presets.split(",") for s in SHAPES[p]]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:  # each variant its own small module
        list(pool.map(mv._fn_any, {mv._ids_name(TYPES[s[1]], v) for s in shapes for v in VARIANTS}))
    totals: dict[tuple[str, str], dict[tuple, float]] = {}
    for what, tname, rows, K, E, k, paired, biased in shapes:
        qt = TYPES[tname]
        w = cp.asarray(random_blocks(qt, E * rows, K, rng))
        w2 = cp.asarray(random_blocks(qt, E * rows, K, rng)) if paired else None
        bias = cp.asarray(rng.standard_normal((E, rows)).astype(np.float32)) if biased else None
        xdiv = k if paired else 1
        n = k // xdiv
        x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
        scratch = cp.empty(mv.scratch_bytes(n, K), cp.uint8)
        mv.quantize_x(x, scratch)
        perm = rng.permutation(E).astype(np.int32)
        ids = [cp.asarray(np.roll(perm, -j * k)[:k]) for j in range(max(1, E // k))]  # distinct experts a launch
        out, out2 = cp.empty((k, rows), cp.float32), (cp.empty((k, rows), cp.float32) if paired else None)
        moved = k * (2 if paired else 1) * rows * row_bytes(qt, K)

        def run(cfg, i=0):
            mmvq_ids(qt, w, E, x, ids[i], xdiv, out, scratch=scratch, w2=w2, out2=out2, bias=bias,
                     bias2=bias if paired else None, config=cfg)

        default = ids_config(qt, rows)
        run(default)
        want = cp.asnumpy(out)
        cls = mv._ids_class(rows)
        print(f"# {what} {tname} {k} picks x {rows} rows x K {K}{' (paired)' if paired else ''}: "
              f"{moved / 1e6:.1f} MB a launch, class {cls}, default {default}")
        for cfg in VARIANTS:
            run(cfg)
            got = cp.asnumpy(out)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max())):
                raise SystemExit(f"{tname} {cfg}: output differs from the default's "
                                 f"(max diff {float(np.abs(got - want).max()):.3e})")
            s = time_graph(cp, [lambda cfg=cfg, i=i: run(cfg, i) for i in range(len(ids))], args.reps)
            totals.setdefault((tname, cls), {}).setdefault(cfg, 0.0)
            totals[tname, cls][cfg] += s
            mark = " <- default" if cfg == default else ""
            print(f"  {cfg}: {s * 1e6:6.2f} us  {moved / s / 1e9:6.0f} GB/s{mark}")
    best: dict[str, dict[str, list[int]]] = {}
    for (tname, cls), by_cfg in sorted(totals.items()):
        cfg = min(by_cfg, key=by_cfg.get)
        default = mv.IDS_CONFIGS[tname][cls]
        print(f"# best {tname} {cls}: {cfg} {by_cfg[cfg] * 1e6:.2f} us against the default {default} "
              f"{by_cfg.get(default, float('nan')) * 1e6:.2f} us")
        best.setdefault(tname, {})[cls] = list(cfg)
    if args.json:
        Path(args.json).write_text(json.dumps(best, indent=1))


if __name__ == "__main__":
    main()
