"""The CUDA backend's MoE MLP in few launches: decode rows routed on the device (graph-safe),
prefill as grouped GEMMs.

Up to MAX_ROWS tokens, a layer is six launches and no host round trip: the router's logits
(mat-vec) and moe.topk (each token's k experts and their weights, on the device), gate and up in
one mmvq_ids over those ids (each pick reads only its expert's bytes, x quantized once; gpt-oss's
expert biases added in its epilogue), the gated activation (which leaves its output in the
mat-vec format), down as mmvq_ids, and the weighted sum onto the residual, which also makes the
next layer's input norm (cuda_ops.combine_norm: the model names it, then_norm).

Past MAX_ROWS (prefill) topk routes on the device too, and moe.align lays the picks out by expert
in whole tiles there (backend/moe.py's align is its reference), sized for the most rows any
routing can take: nothing comes back to the host (the host round trip a layer it replaced cost
the 30b-a3b ~1.9 ms a layer whatever the prompt's length, s14), so prefill graphs hold these
layers too. Then each projection
is ONE fused_b_grouped launch over every expert's tile (the tile's expert read on the device, the
tiles past the layout skipped), the activation one launch over all rows, and combine the weighted
sum: ~12 launches a layer where by_expert made ~8 an active expert (the 30b-a3b at 2048 tokens:
all 128 of them, each layer).
Both take gpt-oss's router bias, expert biases (gathered by expert id) and swiglu_oai.
backend/moe.py's by_expert, their CPU reference (tests/cuda/test_moe_device.py), runs while
the valve is off.
"""
from __future__ import annotations

import cupy as cp

from minferd.backend.base import Weight
from minferd.kernels import moe as moe_kernels
from minferd.kernels.gemm_f16 import CONFIGS as GEMM_CONFIGS, GROUPED_CONFIG, SUPPORTED as GROUPED_TYPES, fused_b_grouped
from minferd.kernels.mmvq import MAX_COLS
from minferd.kernels.mmvq_ids import mmvq_ids

MAX_ROWS = MAX_COLS  # the mat-vec kernels' batch: the rows a decode graph of an MoE may hold


class CudaMoe:
    """The MoE half of CudaBackend: Backend.moe's dispatch, and the ops backend/moe.py's
    by_expert runs on (the path with MINFERD_DEVICE_MOE=0; the backend reads it at init)."""
    moe_on_device = False

    def routes_on_device(self, n: int, k: int) -> bool:
        """Whether a pass of n tokens, k experts each, routes its MoE layers on the device (moe
        below; a file may ask for more picks than moe.cu's top-k holds: those route on the host)."""
        return self.moe_on_device and n <= MAX_ROWS and k <= moe_kernels.MAX_K

    def groups_on_device(self, n_expert: int, k: int, experts) -> bool:
        """Whether an MoE layer past the decode rows runs grouped GEMMs (prefill below): its expert
        tensors of types they take, its routing what moe.topk holds."""
        return self.moe_on_device and n_expert <= moe_kernels.MAX_EXPERTS and k <= moe_kernels.MAX_K and \
            all(w.qtype.name in GROUPED_TYPES for w in experts)

    def prefill_on_device(self, model) -> bool:
        """Whether the model's MoE layers past the decode rows read nothing back on the host: grouped
        GEMMs laid out by moe.align. (Asked at each prefill step: the walk over the model's tensors,
        whose types never change, is made once a model.)"""
        known = self.__dict__.setdefault("_grouped_models", {})
        if id(model) not in known:
            s = model.spec
            known[id(model)] = self.groups_on_device(
                s.n_expert, s.n_expert_used, [w for name, w in model.w.items() if name.endswith("_exps.weight")])
        return known[id(model)]

    def moe(self, x, router, gate_exps, up_exps, down_exps, k, residual=None, router_bias=None, exps_bias=None,
            oai_glu=None, norm_topk=True, then_norm=None):
        """Decode rows route on the device (graph-safe; their sum and then_norm one launch),
        prefills run grouped GEMMs; with the valve off, or a type the grouped GEMM lacks, expert by
        expert (backend/moe.py)."""
        args = (x, router, gate_exps, up_exps, down_exps, k, residual, router_bias, exps_bias, oai_glu, norm_topk)
        if self.routes_on_device(x.shape[0], k):
            return moe(self, *args, then_norm=then_norm)
        if self.groups_on_device(router.n_rows, k, (gate_exps, up_exps, down_exps)):
            return prefill(self, *args)
        return super().moe(*args)

    def take_rows(self, x, rows):
        return cp.ascontiguousarray(x[cp.asarray(rows)], dtype=cp.float32)

    def sigmoid_dot(self, x, v: Weight):
        z = cp.ascontiguousarray(x, dtype=cp.float32) @ v.data[:, None]
        return (1.0 / (1.0 + cp.exp(-z))).astype(cp.float32)

    def add_rows(self, out, rows, y, weights) -> None:
        # rows distinct; rows and weights already on the device (by_expert's) are not copied
        out[cp.asarray(rows)] += cp.asarray(weights, dtype=cp.float32)[:, None] * y

    def bias_row(self, w: Weight, r: int):
        return self.embed([r], w)  # a row of the 2-D tensor, dequantized: what embed does

    def residual_out(self, residual, shape):
        return cp.zeros(shape, cp.float32) if residual is None else cp.array(residual, dtype=cp.float32)


def moe(be, x, router: Weight, gate_exps: Weight, up_exps: Weight, down_exps: Weight, k: int,
        residual=None, router_bias=None, exps_bias=None, oai_glu=None, norm_topk: bool = True, then_norm=None):
    """Backend.moe's contract for up to MAX_ROWS rows, through be's matmuls and activation.
    gpt-oss's parts: the router's bias rides in its mat-vec, each pick's expert bias row is
    added in the mat-vec's epilogue where the biases are F32 (else gathered by its id: be.embed
    reads ids on the device), swiglu_oai in place of SwiGLU."""
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    n_expert = router.n_rows
    ids, wts = moe_kernels.topk(be.matmul(x, router, router_bias), k, norm_topk, warp=True)
    xs = be._quantized(x) if gate_exps.qtype.is_quantized or up_exps.qtype.is_quantized else None
    biases = [None] * 3 if exps_bias is None else [_bias_rows(b) for b in exps_bias]  # in the epilogue, or None
    g, u = _gate_up(gate_exps, up_exps, n_expert, x, xs, ids, k, biases[0], biases[1])
    g = g if biases[0] is not None else _biased(be, g, exps_bias, 0, ids)
    u = u if biases[1] is not None else _biased(be, u, exps_bias, 1, ids)
    # SwiGLU or gpt-oss's swiglu_oai, leaving h in the mat-vec format (be._xq) for down
    h = be._act_gate(g, u, 0) if oai_glu is None else be._act_gate(g, u, 2, *oai_glu)
    hs = be._xq[2] if down_exps.qtype.is_quantized else None
    y = _products(down_exps, n_expert, h, hs, ids, 1, biases[2])
    y = y if biases[2] is not None else _biased(be, y, exps_bias, 2, ids)
    res = None if residual is None else cp.ascontiguousarray(residual, dtype=cp.float32)
    if then_norm is not None:
        return be.combine_norm(y, wts, k, res, *then_norm)
    return moe_kernels.combine(y, wts, k, res)


def _biased(be, out, exps_bias, i: int, experts):
    """out + row experts[r] of the i-th expert bias (gpt-oss: (rows, n_expert) tensors, expert e's
    bias their row e), where the model has them."""
    if exps_bias is not None:
        out += be.embed(experts, exps_bias[i])
    return out


def _bias_rows(b: Weight):
    """An expert bias tensor as the f32 (n_expert, rows) mmvq_ids adds in its epilogue (F32
    ones); None: _biased adds it after."""
    if b.qtype.name != "F32":
        return None
    return b.data.view(cp.float32).reshape(b.n_rows, b.row_elems)


def _gate_up(gate: Weight, up: Weight, n_expert: int, x, scratch, ids, k: int, bias_g=None, bias_u=None):
    """Gate's and up's products for every pick: one launch where their experts share a type and
    a shape, else one each."""
    if gate.qtype == up.qtype and gate.data.shape == up.data.shape and \
            (bias_g is None) == (bias_u is None):
        g = cp.empty((ids.shape[0], gate.shape[1]), cp.float32)
        u = cp.empty_like(g)
        mmvq_ids(gate.qtype, gate.data, n_expert, x, ids, k, g, scratch=scratch, w2=up.data, out2=u,
                 bias=bias_g, bias2=bias_u)
        return g, u
    return _products(gate, n_expert, x, scratch, ids, k, bias_g), _products(up, n_expert, x, scratch, ids, k, bias_u)


def _products(w: Weight, n_expert: int, x, scratch, ids, xdiv: int, bias=None):
    rows = w.shape[1]  # (K, R, n_expert): each expert is R rows of w.data
    out = cp.empty((ids.shape[0], rows), cp.float32)
    mmvq_ids(w.qtype, w.data, n_expert, x, ids, xdiv, out, scratch=scratch, bias=bias)
    return out


BM = GEMM_CONFIGS[GROUPED_CONFIG][0]  # fused_b_grouped's tile of rows: align pads each expert to it


def prefill(be, x, router: Weight, gate_exps: Weight, up_exps: Weight, down_exps: Weight, k: int,
            residual=None, router_bias=None, exps_bias=None, oai_glu=None, norm_topk: bool = True):
    """Backend.moe's contract for any rows, as grouped GEMMs (the module doc); gpt-oss's parts as
    moe's, each tile's rows taking the bias of the tile's expert."""
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    n_expert = router.n_rows
    ids, wts = moe_kernels.topk(be.matmul(x, router, router_bias), k, norm_topk, warp=True)
    rows_d, tiles_d, picks_d = moe_kernels.align(ids, n_expert, k, BM)
    xg = cp.take(be._as_f16(x), rows_d, axis=0)  # (rows, hidden) f16, each expert's tokens in its tiles
    # Expert biases: F32 ones in the GEMM's epilogue, else gathered by the tile's expert and added
    # (the skipped tiles' rows gather expert 0's: rows nothing reads).
    in_gemm = [None] * 3 if exps_bias is None else [_bias_rows(b) for b in exps_bias]
    row_expert = None if exps_bias is None else cp.repeat(cp.maximum(tiles_d, 0), BM)

    def project(i: int, w: Weight, x16):
        out = _grouped(w, n_expert, x16, tiles_d, in_gemm[i])
        return out if in_gemm[i] is not None else _biased(be, out, exps_bias, i, row_expert)

    g, u = project(0, gate_exps, xg), project(1, up_exps, xg)
    # SwiGLU leaves its f16 rounding for the down projection (be._as_f16 finds it); swiglu_oai
    # does not, and _as_f16 makes it.
    h = be.swiglu(g, u) if oai_glu is None else be.swiglu_oai(g, u, *oai_glu)
    y = project(2, down_exps, be._as_f16(h))
    res = None if residual is None else cp.ascontiguousarray(residual, dtype=cp.float32)
    return moe_kernels.combine(cp.take(y, picks_d, axis=0), wts, k, res)


def _grouped(w: Weight, n_expert: int, x16, tiles, bias=None):
    out = cp.empty((x16.shape[0], w.shape[1]), cp.float32)
    fused_b_grouped(w.qtype, w.data, n_expert, x16, tiles, out, bias=bias)
    return out
