"""Would a persistent decode kernel win? The 7B's decode mat-vecs (Qwen2.5-7B shapes, llama.cpp's
Q4_K_M type mix, random blocks) timed two ways on the device, in turns:

  graph   what a decode token runs today: one mmvq launch per matrix group (q/k/v, o, gate/up,
          down; the output), captured in a CUDA graph with programmatic dependent launch, each in
          the unit the decode takes (cuda_matmul.wide_unit: Q6_K's wide unit on the output; the
          chain rows keep the default units, so their outputs differ from the graph's in the last
          bits there)
  chain   the same mmvq_rows work as ONE persistent launch (kernels/chain.cu): CTAs take items in
          graph order and wait, per item, until the group it reads has finished
            wait      the dependencies kept (what a real decode kernel must do)
            free      none (the streaming bound: what the structure gives with no waits at all)
            prefetch  each item asks L2 for its rows before it waits
            bare      no waits, no counts, no barrier and fence around them: the loop alone
          each with its items dealt by ticket (atomicAdd) or statically (CTA c takes every
          grid-th item from c), and with the kernel capped at 64 registers (chain8: 8 CTAs an SM)
  read    the floor under "graph": the same groups' bytes only read (chain.stream_read), one launch a
          group in a graph with programmatic launch; "early" issues each launch's loads before its
          wait on the node before; "one" reads the token's bytes from one buffer in one launch

Only the mat-vecs: no norms, attention or x quantization between them (x is quantized once),
so "graph" is the mat-vecs' share of a token and the gap between the rows is what the structure
alone is worth. The chain's outputs are checked bit for bit against the graph's first.

    python bench/chain_probe.py [--layers 28] [--reps 30] [--rounds 3]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed

import numpy as np  # noqa: E402

from kernels import capture, replay_ms  # noqa: E402  (bench/kernels.py, beside this file)

H, F, KV, VOCAB = 3584, 18944, 512, 152064
Q6_LAYERS = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}  # attn_v and ffn_down in Q6_K (ANCHORS.md)


def layer_shapes(layer: int):
    """(group, [(name, type, rows, K)]) in graph order: matrices of one type and K reading one x share a launch."""
    q6 = layer in Q6_LAYERS
    qkv = [("q", "Q4_K", H, H), ("k", "Q4_K", KV, H)]
    groups = [qkv + ([] if q6 else [("v", "Q4_K", KV, H)])]
    if q6:
        groups.append([("v", "Q6_K", KV, H)])
    groups += [[("o", "Q4_K", H, H)], [("gate", "Q4_K", F, H), ("up", "Q4_K", F, H)],
               [("down", "Q6_K" if q6 else "Q4_K", H, F)]]
    return groups


def build(cp, layers: int):
    """Every launch group of a token: [(type, K, [(w, out)])], weights on the device (one random
    matrix per (type, shape), copied per layer so no two layers share bytes)."""
    from minferd.kernels.quant import by_name
    from minferd.kernels.random_blocks import random_blocks
    rng = np.random.default_rng(7)
    host = {}
    groups = []
    for layer in range(layers):
        for g in layer_shapes(layer) + ([[("output", "Q6_K", VOCAB, H)]] if layer == layers - 1 else []):
            mats = []
            for _, t, rows, K in g:
                key = (t, rows, K)
                if key not in host:
                    host[key] = random_blocks(by_name(t), rows, K, rng)
                mats.append((cp.asarray(host[key]), cp.empty((1, rows), cp.float32)))
            groups.append((g[0][1], g[0][3], mats))
    return groups


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graph-only", action="store_true", help="time the graph alone (an A/B of the mat-vec kernel)")
    args = ap.parse_args(argv)
    if not 1 <= args.layers <= 28 or not 1 <= args.reps <= 1000 or not 1 <= args.rounds <= 20:
        ap.error("--layers 1..28, --reps 1..1000, --rounds 1..20")
    import cupy as cp

    from minferd.backend.cuda_matmul import wide_unit
    from minferd.kernels import chain, launch
    from minferd.kernels import mmvq as mv

    dev = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    sms = launch.sm_count(dev.id)
    groups = build(cp, args.layers)
    scratch = {}
    for K in (H, F):
        x = cp.random.standard_normal((1, K), dtype=cp.float32)
        scratch[K] = (x, cp.empty(mv.scratch_bytes(1, K), cp.uint8))
        mv.quantize_x(x, scratch[K][1])
    weight_bytes = sum(w.nbytes for _, _, mats in groups for w, _ in mats)

    def graph_launches():
        for t, K, mats in groups:
            x, s = scratch[K]
            mv.mmvq_group(t, [w for w, _ in mats], x, [o for _, o in mats], scratch=s, x_quantized=True,
                          wide=wide_unit(mv.TYPES[t], K, 1))

    ops, cnt = [], 0
    for t, K, mats in groups:
        cfg = mv.CONFIGS[t][1][mv.shape_class(max(w.shape[0] for w, _ in mats), K)]
        for w, o in mats:
            ops.append(chain.ChainOp(t, cfg, w, o, scratch[K][1], cnt, cnt - 1 if cnt else None))
        cnt += 1
    table = chain.plan(ops)
    table_dev = cp.asarray(table.view(np.uint8))
    state = cp.zeros(1 + chain.counters(table), cp.int32)  # the ticket, then the counters

    def chain_launch(mode, capped, dispatch):
        def go():
            cp.cuda.runtime.memsetAsync(state.data.ptr, 0, state.nbytes, cp.cuda.get_current_stream().ptr)
            chain.run(table_dev, table, mode, state[:1], state[1:], sms * chain.ctas_per_sm(capped), capped,
                      dispatch)
        return go

    print(f"# {name}, {sms} SMs: {args.layers} layers' mat-vecs, {len(groups)} launch groups, {len(ops)} ops, "
          f"{chain.total_items(table)} items, {weight_bytes / 1e9:.2f} GB of weights; "
          f"chain CTAs an SM: {chain.ctas_per_sm(False)} (chain8: {chain.ctas_per_sm(True)})", flush=True)
    sink = cp.zeros(2, cp.uint32)

    def read_launches(early):
        def go():
            for _, _, mats in groups:
                chain.stream_read([w for w, _ in mats], sink, early)
        return go

    with launch.programmatic(True):
        variants = {"graph": capture(cp, [graph_launches])}
        if not args.graph_only:
            flat = cp.empty(weight_bytes, cp.uint8)
            variants |= {"read wait": capture(cp, [read_launches(False)]),
                         "read early": capture(cp, [read_launches(True)]),
                         "read one": capture(cp, [lambda: chain.stream_read([flat], sink)])}
    ref = [o.get() for _, _, mats in groups for _, o in mats]
    combos = () if args.graph_only else itertools.product((False, True), chain.DISPATCH, chain.MODES)
    for capped, dispatch, mode in combos:
        label = f"chain{'8' if capped else ''} {dispatch} {mode}"
        for _, _, mats in groups:
            for _, o in mats:
                o.fill(np.nan)
        variants[label] = capture(cp, [chain_launch(mode, capped, dispatch)])
        got = [o.get() for _, _, mats in groups for _, o in mats]
        same = all(np.array_equal(a, b) for a, b in zip(ref, got))
        print(f"  {label}: outputs {'bit-identical to the graph' if same else 'DIFFER from the graph'}", flush=True)
    times = {k: [] for k in variants}
    for _ in range(args.rounds):  # in turns: a drift of the clocks touches all alike
        for k, (stream, graph) in variants.items():
            times[k].append(replay_ms(cp, stream, graph, args.reps))
    base = statistics.median(times["graph"])
    for k, ts in times.items():
        t = statistics.median(ts)
        print(f"{k:22s} {t:7.3f} ms  {weight_bytes / t / 1e6:7.0f} GB/s  {t / base:5.3f}x graph  "
              f"(rounds: {' '.join(f'{x:.3f}' for x in ts)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
