"""Where the MMQ kernel's time goes, without hardware counters: one GEMM shape timed whole
and with parts of it left out or alone, for each tile config.

  ablate 0  mmq() as shipped: x's quantization, W's unpacking, the GEMM
  ablate 1  the GEMM's per-chunk epilogue cut to the mmas' unbias (mmq.cu's MMQ_ABLATE=1:
            no weight scales, no min terms)
  unpack    W's unpacking alone (mmq_unpack)

Differences between rows price each part. --once launches each config once (for ncu).

    PYTHONPATH=. python bench/mmq_probe.py [--type Q4_K] [--shape 2048,18944,3584] [--ablate 0,1]
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mmq import time_fn  # noqa: E402  (bench/mmq.py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--shape", default="2048,18944,3584", help="M,N,K")
    ap.add_argument("--configs", default=None, help="default: all of mmq.CONFIGS")
    ap.add_argument("--ablate", default="0,1")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--once", action="store_true", help="one call per config, no timing (for ncu)")
    args = ap.parse_args()

    import cupy as cp

    from minferd.kernels import mmq as mq
    from minferd.kernels import module
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks

    qt = TYPES[args.type]
    M, N, K = (int(v) for v in args.shape.split(","))
    configs = args.configs.split(",") if args.configs else list(mq.CONFIGS)
    rng = np.random.default_rng(0)
    w = cp.asarray(random_blocks(qt, N, K, rng))
    x = cp.random.standard_normal((M, K), dtype=cp.float32)
    out = cp.empty((M, N), cp.float32)
    scratch = cp.empty(mq.scratch_bytes(qt, M, N, K), cp.uint8)
    shipped = mq._fn
    ops = 2.0 * M * N * K
    print(f"# {args.type} M={M} N={N} K={K}: median ms of {args.reps} (TOP/s)")
    print(f"{'ablate':>8s}" + "".join(f"{c:>18s}" for c in configs))
    for a in (int(v) for v in args.ablate.split(",")):
        @functools.lru_cache(maxsize=None)
        def fn(name, smem=0, a=a):
            if a == 0:
                return shipped(name, smem)
            f = module("mmq", mq.names(), (f"-DMMQ_ABLATE={a}",)).get_function(name)
            if smem > 48 * 1024:
                f.max_dynamic_shared_size_bytes = smem
            return f
        mq._fn = fn
        cells = []
        for c in configs:
            call = lambda: mq.mmq(qt, w, x, out, scratch=scratch, config=c)  # noqa: E731
            if args.once:
                call()
                cp.cuda.get_current_stream().synchronize()
                cells.append("ran")
                continue
            t = time_fn(cp, call, args.reps, 3)
            cells.append(f"{t * 1e3:7.3f} ({ops / t / 1e12:5.1f})")
        print(f"{a:8d}" + "".join(f"{c:>18s}" for c in cells), flush=True)
    mq._fn = shipped
    if not args.once:  # the unpack kernel alone, as mmq() launches it
        lay = mq._layout(qt, M, N, K)
        p = scratch.data.ptr
        rows = min(lay["rows"], N)
        t = time_fn(cp, lambda: mq.unpack_rows(qt, w, w.shape[1], 0, rows, K, lay["Kp"], np.uint64(p + lay["wq"]),
                                               np.uint64(p + lay["ws"])), args.reps, 3)
        print(f"{'unpack':>8s}{t * 1e3:11.3f} ms for {rows} of {N} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
