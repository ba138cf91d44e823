"""The CUDA backend's MoE MLP for decode rows: routed on the device, so it can be captured.

Up to MAX_ROWS tokens, a layer is seven launches and no host round trip: the router's logits
(mat-vec), moe.topk (each token's k experts and their weights, on the device), gate and up as
mmvq_ids over those ids (each pick reads only its expert's bytes, x quantized once), the gated
activation (which leaves its output in the mat-vec format), down as mmvq_ids, and moe.combine
(the weighted sum onto the residual). backend/moe.py's by_expert, which routes on the host a
layer at a time, stays for prefill and for what this does not cover (gpt-oss's biases and
gated activation). Its CPU reference is by_expert (tests/cuda/test_moe_cuda.py).
"""
from __future__ import annotations

import cupy as cp

from minferd.backend.base import Weight
from minferd.config import valve
from minferd.kernels import moe as moe_kernels
from minferd.kernels.mmvq import MAX_COLS, mmvq_ids

MAX_ROWS = MAX_COLS  # the mat-vec kernels' batch: the rows a decode graph of an MoE may hold


def enabled() -> bool:
    """Off unless MINFERD_DEVICE_MOE=1: written after session 12's device time ran out, it stays
    opt-in until tests/cuda/test_moe_device.py has passed on a GPU."""
    return valve("MINFERD_DEVICE_MOE") == "1"


def covers(n: int, router_bias=None, exps_bias=None, oai_glu=None) -> bool:
    return enabled() and n <= MAX_ROWS and router_bias is None and exps_bias is None and oai_glu is None


def moe(be, x, router: Weight, gate_exps: Weight, up_exps: Weight, down_exps: Weight, k: int,
        residual=None, norm_topk: bool = True):
    """Backend.moe's contract for the rows `covers` admits, through be's matmuls and activation."""
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    n, n_expert = x.shape[0], router.n_rows
    ids, wts = moe_kernels.topk(be.matmul(x, router), k, norm_topk)
    xs = be._quantized(x) if gate_exps.qtype.is_quantized else None
    g = _products(gate_exps, n_expert, x, xs, ids, k)
    u = _products(up_exps, n_expert, x, xs, ids, k)
    h = be._act_gate(g, u, 0)  # SwiGLU; leaves h in the mat-vec format (be._xq) for down
    hs = be._xq[2] if down_exps.qtype.is_quantized else None
    y = _products(down_exps, n_expert, h, hs, ids, 1)
    res = None if residual is None else cp.ascontiguousarray(residual, dtype=cp.float32)
    return moe_kernels.combine(y, wts, k, res)


def _products(w: Weight, n_expert: int, x, scratch, ids, xdiv: int):
    rows = w.shape[1]  # (K, R, n_expert): each expert is R rows of w.data
    out = cp.empty((ids.shape[0], rows), cp.float32)
    mmvq_ids(w.qtype, w.data, n_expert, x, ids, xdiv, out, scratch=scratch)
    return out
