"""One tcgemv launch per config on one shape, for a profiler (ncu) to read: nothing timed here.

    ncu --kernel-name regex:tcgemv ... python bench/tc_once.py [--type Q4_K] [--shape 18944,3584] [--m 16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--shape", default="18944,3584", help="N,K")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--configs", default=None, help="tcgemv CONFIGS keys (default: all)")
    args = ap.parse_args(argv)
    import cupy as cp

    from minferd.kernels import tcgemv as tc
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks

    qt = TYPES[args.type]
    N, K = (int(v) for v in args.shape.split(","))
    rng = np.random.default_rng(0)
    w = cp.asarray(random_blocks(qt, N, K, rng))
    x16 = cp.asarray(rng.standard_normal((args.m, K)).astype(np.float16))
    y = cp.empty((args.m, N), cp.float32)
    for c in (args.configs.split(",") if args.configs else tc.CONFIGS):
        tc.tcgemv(qt, w, x16, y, config=c)
        print(c, tc.kernel_name(qt, args.m, c))
    cp.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
