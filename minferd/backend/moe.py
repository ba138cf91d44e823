"""Mixture-of-experts routing, and the MLP run expert by expert on any backend's matmuls.

`route` is llama.cpp's build_moe_ffn routing on the host: each token's top k experts by the
router's logits, weighted by the softmax of those k logits (the softmax over all experts,
renormalized over the top k, is the same: the denominator over all experts cancels). `by_expert`
groups the (token, expert) picks by expert and runs each chosen expert once on its tokens through
the backend's own matmul, activation and row gather / scatter, so a backend with those has the
op: the CUDA backend's MoE is this (the CPU backend has its own, which dequantizes each expert
once for its three products, and tests/unit/test_moe_by_expert.py holds the two equal).

The router's logits cross to the host once a layer (n x n_expert floats) to decide the groups:
a pass that runs this cannot be captured into a CUDA graph (models say so: `graph_safe`).
"""
from __future__ import annotations

import numpy as np

from minferd.backend.base import Weight


def route(logits: np.ndarray, k: int, norm: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """logits (n, n_expert) f32 -> (top (n, k) expert ids, unordered; their weights (n, k)): the
    softmax over all experts at the top k, renormalized to sum 1 where norm (qwen3moe, gpt-oss),
    as they are where not (qwen2moe: llama.cpp's norm_w false)."""
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    chosen = np.take_along_axis(logits, top, axis=1)
    top_max = chosen.max(axis=1, keepdims=True)  # the row's maximum: a top-k logit
    p = np.exp(chosen - top_max)
    if norm:
        return top, p / p.sum(axis=1, keepdims=True)
    return top, p / np.exp(logits - top_max).sum(axis=1, keepdims=True)


def groups(top: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray]:
    """The picks (top.ravel(): pick i is token i // k's) in expert order, and bounds: expert e's
    picks are order[bounds[e]:bounds[e + 1]]. A token picks an expert at most once, so a group's
    tokens are distinct."""
    picks = top.ravel()
    order = np.argsort(picks, kind="stable")
    return order, np.searchsorted(picks[order], np.arange(n_expert + 1))


def align(top: np.ndarray, n_expert: int, bm: int, rows_max: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The picks laid out for a grouped GEMM (one launch per projection): each expert's picks in
    a run of rows padded to whole tiles of bm. Returns (token of each padded row, padding rows
    repeating their expert's first token; the expert of each tile; each pick's row, picks in
    top.ravel() order, token-major). A tile's rows all belong to one expert. rows_max (a multiple
    of bm, at least the layout's rows): the layout padded to it with token 0 in tiles of expert -1,
    which the grouped GEMM skips (kernels/moe.py's align, on the device, is this)."""
    n, k = top.shape
    order, bounds = groups(top, n_expert)
    counts = np.diff(bounds)
    tiles = -(-counts // bm)
    tile_expert = np.repeat(np.arange(n_expert, dtype=np.int32), tiles)
    start = np.concatenate([[0], np.cumsum(tiles * bm)]).astype(np.int64)  # each expert's first row
    used = int(start[-1])
    if rows_max is not None:
        if rows_max % bm or rows_max < used:
            raise ValueError(f"align: {rows_max} rows cannot hold a layout of {used} in tiles of {bm}")
        tile_expert = np.concatenate([tile_expert, np.full((rows_max - used) // bm, -1, np.int32)])
    rows = np.zeros(used if rows_max is None else rows_max, np.int32)
    pick_row = np.empty(n * k, np.int32)
    for e in np.flatnonzero(counts):
        mine = order[bounds[e]:bounds[e + 1]]
        r0 = int(start[e])
        rows[r0:r0 + mine.size] = mine // k
        rows[r0 + mine.size:r0 + tiles[e] * bm] = mine[0] // k
        pick_row[mine] = np.arange(r0, r0 + mine.size, dtype=np.int32)
    return rows, tile_expert, pick_row


def expert(w: Weight, e: int) -> Weight:
    """Expert e of a stacked (K, R, n_expert) tensor as a (K, R) matrix: rows e*R .. (e+1)*R."""
    r = w.shape[1]
    return Weight(f"{w.name}[{e}]", w.qtype, (w.shape[0], r), w.data[e * r:(e + 1) * r], w.mem)


def by_expert(be, x, router: Weight, gate_exps: Weight, up_exps: Weight, down_exps: Weight, k: int,
              residual=None, router_bias=None, exps_bias=None, oai_glu=None, norm_topk=True):
    """Backend.moe's contract through be's matmul, swiglu (or swiglu_oai), take_rows, add_rows
    and bias_row."""
    n = x.shape[0]
    top, p = route(be.to_host(be.matmul(x, router, router_bias)), k, norm_topk)
    order, bounds = groups(top, router.n_rows)
    # Every expert's token rows and pick weights cross to the device in one copy: a copy from
    # the host waits for the stream, and one per expert (three, before) kept the GPU idle
    # between them (the 30b-a3b: 384 such waits a layer at 2048 tokens).
    P = order.size
    tokens_w = [(order // k).astype(np.int32), p.ravel()[order].astype(np.float32).view(np.int32)]
    both = be.to_device(np.concatenate(tokens_w))
    tokens, weights = both[:P], both[P:].view(np.float32)
    out = be.residual_out(residual, (n, down_exps.shape[1]))
    for e in np.flatnonzero(np.diff(bounds)):
        a, b = int(bounds[e]), int(bounds[e + 1])
        xe = be.take_rows(x, tokens[a:b])
        g = be.matmul(xe, expert(gate_exps, e))
        u = be.matmul(xe, expert(up_exps, e))
        if exps_bias is not None:  # (rows, n_expert) tensors: expert e's bias is their row e
            g = g + be.bias_row(exps_bias[0], e)
            u = u + be.bias_row(exps_bias[1], e)
        h = be.swiglu(g, u) if oai_glu is None else be.swiglu_oai(g, u, *oai_glu)
        y = be.matmul(h, expert(down_exps, e))
        if exps_bias is not None:
            y = y + be.bias_row(exps_bias[2], e)
        be.add_rows(out, tokens[a:b], y, weights[a:b])
    return out
