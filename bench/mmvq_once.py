"""One mmvq launch (decode's mat-vec, n columns) per type on one shape, for a profiler (ncu) to
read: nothing timed here.

    ncu --kernel-name regex:mmvq ... python bench/mmvq_once.py [--types Q4_K,Q6_K] [--shape 3584,18944] [--n 1]

--reads adds, after each type's mat-vec, a device copy and a sum of the same weight bytes (CuPy's own
kernels: what plain streaming of those bytes looks like to the same counters).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--shape", default="3584,18944", help="rows,K")
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--wide", action="store_true", help="also the type's wide unit (mmvq.WIDE_UNITS), after the default")
    ap.add_argument("--reads", action="store_true", help="also a copy and a sum of the same bytes")
    args = ap.parse_args(argv)
    import cupy as cp

    from minferd.kernels import mmvq
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks

    rows, K = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((args.n, K)).astype(np.float32))
    out = cp.empty((args.n, rows), cp.float32)
    for name in args.types.split(","):
        w = cp.asarray(random_blocks(TYPES[name], rows, K, rng))
        for wide in (False, True) if args.wide and name in mmvq.WIDE_UNITS else (False,):
            mmvq.mmvq(TYPES[name], w, x, out, wide=wide)
            print(name, rows, K, args.n, "wide" if wide else "")
        if args.reads:
            cp.copyto(cp.empty_like(w), w)
            flat = w.ravel()
            (flat.view(cp.uint32) if flat.nbytes % 4 == 0 else flat).sum(dtype=cp.uint64)
    cp.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
