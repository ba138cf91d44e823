"""mmvq_stream (rows into shared memory by bulk copies, persistent CTAs) against mmvq, one decode
column, at the 7B's and 8B's Q4_K shapes and groups, each config of --configs; microseconds a launch
and % of the copy ceiling. Each figure is a graph of back-to-back launches over weight copies that
together pass 3x the L2 (bench/kernels.py's time_graph), captured without and with programmatic
launch (a decode graph's nodes carry it: kernels/launch.py).

    PYTHONPATH=. python bench/mmvq_stream.py [--configs 16384:4:2:1,8192:4:4:2] [--types Q4_K] [--json F]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import CEILING, copies_for, random_weights, time_graph  # noqa: E402

# name -> the matrices (rows) of one launch, and K
SHAPES = {"7b qkv": ((3584, 512, 512), 3584), "7b o": ((3584,), 3584), "7b gate+up": ((18944, 18944), 3584),
          "7b down": ((3584,), 18944), "7b k": ((512,), 3584), "8b qkv": ((4096, 1024, 1024), 4096),
          "8b gate+up": ((14336, 14336), 4096), "8b down": ((4096,), 14336)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="16384:4:2:1,16384:4:2:2,16384:4:3:1,8192:4:4:1,8192:4:4:2,16384:6:2:2")
    ap.add_argument("--types", default="Q4_K")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import cupy as cp

    from minferd.kernels import mmvq as mv, mmvq_stream as ms
    from minferd.kernels.launch import programmatic
    from minferd.kernels.quant import TYPES, row_bytes

    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",") if c]
    l2 = int(cp.cuda.Device().attributes["L2CacheSize"])
    rows_out = []
    for tname in args.types.split(","):
        qt = TYPES[tname]
        for label, (rows, K) in SHAPES.items():
            rb = row_bytes(qt, K)
            nbytes = sum(rows) * rb
            copies = copies_for(nbytes, l2)
            sets = [[w.reshape(m, rb) for w, m in zip((random_weights(cp, m * rb, 1)[0] for m in rows), rows)]
                    for _ in range(copies)]
            x = cp.asarray(cp.random.standard_normal((1, K)), cp.float32)
            scratch = cp.empty(mv.scratch_bytes(1, K), cp.uint8)
            mv.quantize_x(x, scratch)
            outs = [cp.empty((1, m), cp.float32) for m in rows]
            line = {"type": tname, "shape": label, "bytes": nbytes}
            runs = {"mmvq": lambda ws: mv.mmvq_group(qt, ws, x, outs, scratch=scratch, x_quantized=True)}
            for c in configs:
                runs["stream " + ":".join(map(str, c))] = (
                    lambda ws, c=c: ms.mmvq_stream(qt, ws, x, outs, scratch=scratch, x_quantized=True, config=c))
            for pdl in (False, True):
                for key, f in runs.items():
                    with programmatic(pdl):
                        t = time_graph(cp, [lambda ws=ws, f=f: f(ws) for ws in sets], args.reps)
                    line[f"{key}{' pdl' if pdl else ''}"] = t * 1e6
            rows_out.append(line)
            best = {k: v for k, v in line.items() if k not in ("type", "shape", "bytes")}
            print(f"{tname} {label:12s} {nbytes / 1e6:7.1f} MB  " +
                  "  ".join(f"{k} {v:6.2f}us {nbytes / (v * 1e-6) / CEILING * 100:4.0f}%" for k, v in best.items()),
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"ceiling_Bps": CEILING, "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
