"""Speed of the CUDA dequant and mat-vec kernels at Qwen2.5-7B's matrix shapes, per type.

For each type and shape (rows, K) it times
  mmvq      out (n, rows) = x (n, K) @ W.T, the decode kernel (n = 1 unless --ns), with x
            already quantized (as when q/k/v or gate/up share it); `+qx` adds quantize_x
  dequant   dequant_f16, W -> f16 (the W16 cache warm)
and prints GB/s (bytes the kernel must move: quantized weight + x + out; dequant: weight +
f16 out) and that as % of the copy ceiling (4.3 TB/s measured on the H200, ANCHORS.md).

Timing: each measurement is a CUDA graph of back-to-back launches (decode runs as a graph,
so this is the launch cost that matters), replayed after a warm-up; the figure is the
median over --reps replays of (graph time / launches). Launches rotate over enough weight
copies that their total is >= 3x the L2, so L2 never holds the next weight.
--sweep also times every variant (warps, K-split warps, rows, units) of the mmvq kernel in
mmvq.sweep_configs(n) at each n and reports the best per type and shape: the data
CONFIGS in minferd/kernels/mmvq_shapes.py comes from.

    PYTHONPATH=. python bench/kernels.py [--types Q4_K,Q6_K] [--ns 1,8] [--models 7b,0.5b] [--sweep] [--json F]

--models: whose matrix shapes (Qwen2.5-7B's 3584-wide, Qwen2.5-0.5B's 896-wide; issue 15 asks
>= 80% of the ceiling at both widths for Q4_K, Q6_K, Q8_0 and Q5_0; 30b / 20b: the MoE presets'
dense matrices, which the 7B-tuned shape classes serve).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import statistics
import sys
import time

# (rows, K) of each model's matrices: q/o, k/v, gate/up, down, the output
MODEL_SHAPES = {"7b": [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944), (152064, 3584)],
                "0.5b": [(896, 896), (128, 896), (4864, 896), (896, 4864), (151936, 896)],
                # the MoE presets' dense matrices (q, k/v, o, output): issue 17's decode is ~23% these
                "30b": [(4096, 2048), (512, 2048), (2048, 4096), (151936, 2048)],
                "20b": [(4096, 2880), (512, 2880), (2880, 4096), (201088, 2880)]}
ORDER = ("Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "F16", "BF16", "F32")
CEILING = 4.3e12  # bytes/s, device-to-device copy on the H200 (read + write)


def capture(cp, launches):
    """(stream, graph) of `launches` (callables), each run once first: compiles on first use,
    never inside capture."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for f in launches:
            f()
        stream.synchronize()
        stream.begin_capture()
        for f in launches:
            f()
        graph = stream.end_capture()
    return stream, graph


def replay_ms(cp, stream, graph, reps: int) -> float:
    """Median milliseconds a replay of `graph`, after warm-ups."""
    with stream:
        graph.launch(stream)
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            graph.launch(stream)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1))
    return statistics.median(times)


def time_graph(cp, launches, reps: int) -> float:
    """Median seconds per launch of a graph of `launches` (callables)."""
    return replay_ms(cp, *capture(cp, launches), reps) * 1e-3 / len(launches)


def copies_for(nbytes: int, l2: int) -> int:
    return max(3, math.ceil(3 * l2 / max(nbytes, 1)))


def random_weights(cp, nbytes: int, count: int):
    """count device copies of random bytes (values do not change the speed of any kernel)."""
    first = cp.random.randint(0, 1 << 30, size=(nbytes + 3) // 4, dtype=cp.int32).view(cp.uint8)[:nbytes]
    return [first] + [first.copy() for _ in range(count - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=",".join(ORDER))
    ap.add_argument("--ns", default="1", help="batch sizes for mmvq, e.g. 1,8")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--models", default="7b", help=f"shape sets, of {', '.join(MODEL_SHAPES)}")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-dequant", action="store_true")
    ap.add_argument("--wide", action="store_true",
                    help="also time the wide units (mmvq.WIDE_UNITS; with --sweep or --wide-sweep, every variant)")
    ap.add_argument("--wide-sweep", action="store_true",
                    help="--wide with every variant of the wide units, the default units' variants not swept")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp

    from minferd.kernels import mmvq as mv
    from minferd.kernels.dequant import dequant_f16
    from minferd.kernels.quant import TYPES, row_bytes

    dev = cp.cuda.Device()
    l2 = int(dev.attributes["L2CacheSize"])
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    types = [t for t in args.types.split(",") if t]
    ns = [int(n) for n in args.ns.split(",")]
    if args.sweep:
        mv.add_sweep()
    report = {"device": name, "l2_bytes": l2, "ceiling_Bps": CEILING, "reps": args.reps,
              "mmvq": [], "dequant": [], "sweep": []}
    print(f"# {name}, L2 {l2 >> 20} MiB, ceiling {CEILING / 1e12:.1f} TB/s, median of {args.reps}", flush=True)
    t_start = time.time()

    shapes = [s for m in args.models.split(",") for s in MODEL_SHAPES[m]]
    for tname in types:
        qt = TYPES[tname]
        for rows, K in shapes:
            if K % qt.block_elems:  # the 0.5B's 896-wide rows take no 256-element blocks (its files use Q5_0 / Q8_0 there)
                print(f"mmvq    {tname:6s} {rows:6d}x{K:<6d} skipped: rows of {K} are not whole {qt.block_elems}-element blocks")
                continue
            rb = row_bytes(qt, K)
            wbytes = rows * rb
            ws = [w.reshape(rows, rb) for w in random_weights(cp, wbytes, copies_for(wbytes, l2))]
            for n in ns:
                x = cp.random.standard_normal((n, K), dtype=cp.float32)
                out = cp.empty((n, rows), cp.float32)
                quantized = tname in mv.QUANT_TYPES
                scratch = cp.empty(mv.scratch_bytes(n, K), cp.uint8) if quantized else None
                if quantized:
                    mv.quantize_x(x, scratch)
                    xbytes = mv.scratch_bytes(n, K)
                else:
                    xbytes = n * K * 4
                moved = wbytes + xbytes + n * rows * 4

                def launches(cfg=None, wide=False):
                    return [lambda w=w: mv.mmvq(qt, w, x, out, scratch=scratch, x_quantized=quantized, config=cfg,
                                                wide=wide) for w in ws]

                t = time_graph(cp, launches(), args.reps)
                row = {"type": tname, "rows": rows, "K": K, "n": n, "us": t * 1e6, "GBps": moved / t / 1e9,
                       "pct": 100 * moved / t / CEILING, "weight_bytes": wbytes,
                       "class": mv.shape_class(rows, K),
                       "config": list(mv.CONFIGS[tname][mv.bucket(n)][mv.shape_class(rows, K)]) if quantized else None}
                if quantized:  # the same with x's quantization in front (x not shared)
                    tq = time_graph(cp, [lambda w=w: mv.mmvq(qt, w, x, out, scratch=scratch) for w in ws], args.reps)
                    row["us_with_qx"] = tq * 1e6
                report["mmvq"].append(row)
                print(f"mmvq    {tname:5s} {rows:6d}x{K:<5d} n={n} {t * 1e6:8.1f} us {row['GBps']:7.0f} GB/s "
                      f"{row['pct']:5.1f}%" + (f"  (+qx {row['us_with_qx']:.1f} us)" if quantized else ""), flush=True)
                if (args.wide or args.wide_sweep) and tname in mv.WIDE_UNITS:
                    tw = time_graph(cp, launches(wide=True), args.reps)
                    row["wide_us"] = tw * 1e6
                    cfgs = {1: mv.SWEEP, 8: mv.SWEEP_N}.get(n, ()) if args.sweep or args.wide_sweep else ()
                    swept = {cfg: time_graph(cp, launches(cfg, True), args.reps) * 1e6 for cfg in cfgs}
                    row["wide_sweep"] = [[list(c), us] for c, us in swept.items()]
                    print(f"  wide    {tw * 1e6:8.1f} us {moved / tw / 1e9:7.0f} GB/s {100 * moved / tw / CEILING:5.1f}%"
                          + (f"  | best {min(swept, key=swept.get)}: {min(swept.values()):.1f} us" if swept else ""), flush=True)
                sweep = mv.sweep_configs(n) if args.sweep and quantized else ()
                if sweep and n not in (1, mv.MAX_COLS):  # outside add_sweep's module: one each, 8 compiling at once
                    with concurrent.futures.ThreadPoolExecutor(8) as ex:
                        list(ex.map(lambda c: mv._fn_any(mv.kernel_name(qt, mv.bucket(n), c)), sweep))
                if sweep:
                    best = None
                    for cfg in sweep:
                        ts = time_graph(cp, launches(cfg), args.reps)
                        rec = {"type": tname, "rows": rows, "K": K, "n": n, "config": list(cfg), "us": ts * 1e6,
                               "GBps": moved / ts / 1e9, "pct": 100 * moved / ts / CEILING}
                        report["sweep"].append(rec)
                        if best is None or ts < best[1]:
                            best = (cfg, ts)
                    print(f"  sweep best {best[0]}: {best[1] * 1e6:.1f} us {moved / best[1] / 1e9:.0f} GB/s "
                          f"{100 * moved / best[1] / CEILING:.1f}%  | " +
                          " ".join(f"{tuple(r['config'])}:{r['us']:.1f}" for r in report["sweep"][-len(sweep):]),
                          flush=True)
            if not args.no_dequant:
                outs = [cp.empty((rows, K), cp.float16) for _ in ws]
                t = time_graph(cp, [lambda w=w, o=o: dequant_f16(qt, w, o) for w, o in zip(ws, outs)], max(5, args.reps // 2))
                moved = wbytes + rows * K * 2
                report["dequant"].append({"type": tname, "rows": rows, "K": K, "us": t * 1e6,
                                          "GBps": moved / t / 1e9, "pct": 100 * moved / t / CEILING})
                print(f"dequant {tname:5s} {rows:6d}x{K:<5d}     {t * 1e6:8.1f} us {moved / t / 1e9:7.0f} GB/s "
                      f"{100 * moved / t / CEILING:5.1f}%", flush=True)
                del outs
            del ws
            cp.get_default_memory_pool().free_all_blocks()

    # Summary table: mmvq n=1 GB/s (% of ceiling) per type and shape.
    print("\n# mmvq n=1: GB/s (% of copy ceiling)")
    hdr = "type  " + "".join(f"{f'{r}x{k}':>18s}" for r, k in shapes)
    print(hdr)
    for tname in types:
        cells = []
        for r, k in shapes:
            m = [x for x in report["mmvq"] if x["type"] == tname and x["rows"] == r and x["K"] == k and x["n"] == 1]
            cells.append(f"{m[0]['GBps']:8.0f} ({m[0]['pct']:4.1f}%)" if m else " " * 18)
        print(f"{tname:6s}" + "".join(f"{c:>18s}" for c in cells))
    for n in sorted({x["n"] for x in report["sweep"]}):
        print(f"\n# sweep n={n}: best (warps, K-split warps, rows, units) per type and shape")
        for tname in types:
            best = []
            for r, k in shapes:
                recs = [x for x in report["sweep"] if x["type"] == tname and x["rows"] == r and x["K"] == k and x["n"] == n]
                if recs:
                    b = min(recs, key=lambda x: x["us"])
                    best.append(f"{tuple(b['config'])} {b['pct']:.0f}%")
            if best:
                print(f"{tname:6s} " + " | ".join(best))
    report["seconds"] = time.time() - t_start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
