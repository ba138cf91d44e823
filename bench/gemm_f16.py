"""Time gemm_f16.cu's GEMMs at the 7B prefill shapes: gemm_w16 (f16 W), fused_b (raw Q4_K,
Q6_K, Q8_0 rows dequantized inside the GEMM) and cupy.matmul (cuBLAS f16, for scale).

    python bench/gemm_f16.py [--sweep] [--reps 20] [--json FILE]

M in {512, 2048} tokens x (N, K) in the Qwen2.5-7B projections. Each figure is the median
over --reps timed repetitions (after warm-up) of CUDA events around --inner back-to-back
launches, divided by --inner; TFLOP/s = 2*M*N*K / time. --sweep also times every tile
config of gemm_f16 (the data behind gemm_f16.py's RATES and pick_config).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)]  # (N, K): q/o, k/v, gate/up, down
MS = (512, 2048)
FUSED_TYPES = ("Q4_K", "Q6_K", "Q8_0")


def timeit(cp, fn, reps: int, inner: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / inner)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--sweep", action="store_true", help="also time every tile config")
    ap.add_argument("--json", help="write all figures to this file")
    args = ap.parse_args(argv)

    import cupy as cp
    from minferd.kernels import gemm_f16 as g
    from minferd.kernels.dequant import dequant_f16
    from minferd.kernels.quant import TYPES
    from minferd.kernels.random_blocks import random_blocks

    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    print(f"device: {dev['name'].decode()}, {dev['multiProcessorCount']} SMs", flush=True)
    # registers / local memory (spills) of the kernels this bench runs, as NVRTC built them
    for t in [None] + list(FUSED_TYPES):
        for c, cfg in sorted(g.CONFIGS.items()):
            qt = None if t is None else TYPES[t]
            k = g._fn(g.kernel_name(qt, cfg), g.smem_bytes(qt, cfg))
            print(f"  {t or 'w16':5s} {c}: {k.num_regs} registers, {k.local_size_bytes} B local, "
                  f"{g.smem_bytes(qt, cfg)} B smem", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for N, K in SHAPES:
        raws = {t: cp.asarray(random_blocks(TYPES[t], N, K, rng)) for t in FUSED_TYPES}
        w16 = cp.empty((N, K), cp.float16)
        dequant_f16(TYPES["Q4_K"], raws["Q4_K"], w16)
        w16t = w16.T
        for M in MS:
            x16 = cp.asarray(rng.standard_normal((M, K)).astype(np.float16))
            out = cp.empty((M, N), cp.float32)
            flops = 2.0 * M * N * K
            cases = [("cublas", None, lambda: cp.matmul(x16, w16t)),
                     ("w16", "auto", lambda: g.gemm_w16(x16, w16, out))]
            for t in FUSED_TYPES:
                cases.append((t, "auto", lambda t=t: g.fused_b(t, raws[t], x16, out)))
            if args.sweep:
                for c in sorted(g.CONFIGS):
                    cases.append(("w16", c, lambda c=c: g.gemm_w16(x16, w16, out, config=c)))
                    for t in FUSED_TYPES:
                        cases.append((t, c, lambda t=t, c=c: g.fused_b(t, raws[t], x16, out, config=c)))
            for what, cfg, fn in cases:
                ms = timeit(cp, fn, args.reps, args.inner)
                picked = g.pick_config(M, N, None if what == "w16" else TYPES.get(what)) if cfg == "auto" else cfg
                rows.append({"M": M, "N": N, "K": K, "what": what, "config": cfg, "picked": picked,
                             "ms": ms, "tflops": flops / ms / 1e9})
                print(f"  M={M:5d} N={N:6d} K={K:6d} {what:7s} {str(cfg):5s} ({picked}) "
                      f"{ms:8.4f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)

    # Summary table: default configs.
    cols = ["cublas", "w16"] + list(FUSED_TYPES)
    print("\nms and TFLOP/s (default config; cublas = cupy.matmul f16):")
    print(f"{'M':>5} {'N':>6} {'K':>6} " + " ".join(f"{c:>17s}" for c in cols))
    for M in MS:
        for N, K in SHAPES:
            cells = []
            for c in cols:
                r = next(r for r in rows if r["M"] == M and r["N"] == N and r["K"] == K and r["what"] == c
                         and r["config"] in (None, "auto"))
                cells.append(f"{r['ms']:7.3f} {r['tflops']:5.0f}{'' if r['picked'] is None else '/' + r['picked']:>3s}")
            print(f"{M:5d} {N:6d} {K:6d} " + " ".join(f"{c:>17s}" for c in cells))
    for c in cols:
        sel = [r for r in rows if r["what"] == c and r["config"] in (None, "auto")]
        tot_flops = sum(2.0 * r["M"] * r["N"] * r["K"] for r in sel)
        tot_ms = sum(r["ms"] for r in sel)
        print(f"  {c:7s} all shapes: {tot_ms:7.3f} ms, {tot_flops / tot_ms / 1e9:6.1f} TFLOP/s overall")
    if args.sweep:
        print("\nper-config TFLOP/s:")
        for M in MS:
            for N, K in SHAPES:
                line = []
                for c in sorted(g.CONFIGS):
                    for what in ["w16"] + list(FUSED_TYPES):
                        r = next(r for r in rows if r["M"] == M and r["N"] == N and r["K"] == K
                                 and r["what"] == what and r["config"] == c)
                        line.append(f"{c}:{what}={r['tflops']:.0f}")
                print(f"{M:5d} {N:6d} {K:6d} " + " ".join(line))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
