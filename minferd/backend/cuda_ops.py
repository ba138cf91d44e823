"""The CUDA backend's small ops: norms, rope and the KV write, attention, the gated activations,
each one launch of norm.cu or ops.cu (or a CuPy elementwise kernel for a prefill's f16 output).
A decode step's norm and activation also leave their output in the mat-vec kernels' int8 format,
so the next matmul needs no quantize launch (cuda_matmul's slots).
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from minferd.backend import cuda_attention, cuda_matmul
from minferd.backend.base import KVCache, Weight
from minferd.kernels import kernel, mmq_small, moe as moe_kernels

RMSNORM_CTAS = 4  # CTAs sharing one row of rmsnorm_pair, rmsnorm_f32 (<= 64 rows) and combine_rmsnorm_q
NORM_MAX_CTAS = 32  # rmsnorm_q's and rmsnorm_h's CTAs a row: a warp a 32-element block up to 8192 wide

# Passes of this many tokens or more norm q's and k's heads inside rope_kv (norm_rope_kv, one warp
# a head): 30b-a3b pp2048 16300 -> 16763 tok/s on the H200 (s16); a decode step of one token lost
# (324 -> 310 tok/s: 36 warps on 5 SMs, each a whole head's chain), so decode keeps two launches.
NORM_ROPE_MIN_ROWS = 128


def norm_ctas(d: int) -> int:
    """rmsnorm_q's and rmsnorm_h's CTAs (8 warps) for a row of d: a warp for each 32-element block
    (7B: 14; s38: 4 CTAs a row cost the 7B 1.7% of its token, norm.cu)."""
    return min(NORM_MAX_CTAS, max(RMSNORM_CTAS, -(-d // (32 * 8))))


def _op(name: str):
    return kernel("ops", name)


def _norm(name: str):
    return kernel("norm", name)


# A prefill's gated activation, written in f32 and in the f16 the down projection reads.
_swiglu = cp.ElementwiseKernel("float32 g, float32 u", "float32 y, float16 y16",
                               "y = g / (1.0f + expf(-g)) * u; y16 = (float16)y", "minferd_swiglu")
# gpt-oss's clamped SwiGLU (Backend.swiglu_oai; the CPU backend's is the reference); the second
# also writes the f16 rounding the down projection reads, as _swiglu does.
_OAI = "float gc = fminf(g, limit); float uc = fminf(fmaxf(u, -limit), limit); y = gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f)"
_swiglu_oai = cp.ElementwiseKernel("float32 g, float32 u, float32 alpha, float32 limit", "float32 y", _OAI,
                                   "minferd_swiglu_oai")
_swiglu_oai16 = cp.ElementwiseKernel("float32 g, float32 u, float32 alpha, float32 limit", "float32 y, float16 y16",
                                     _OAI + "; y16 = (float16)y", "minferd_swiglu_oai16")
_gelu = cp.ElementwiseKernel(
    "float32 g, float32 u", "float32 y, float16 y16",
    "y = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u; y16 = (float16)y",
    "minferd_gelu")


class CudaOps:
    """The small-op part of CudaBackend (which keeps the state: the matmul slots it writes)."""
    def rmsnorm_pair(self, a, wa: Weight, b, wb: Weight, eps):
        if a.ndim != 3 or b.ndim != 3 or a.shape[-1] != b.shape[-1]:
            return super().rmsnorm_pair(a, wa, b, wb, eps)
        a, b = (cp.ascontiguousarray(t, dtype=cp.float32) for t in (a, b))
        oa, ob = cp.empty_like(a), cp.empty_like(b)
        ra, rows, d = a.size // a.shape[-1], (a.size + b.size) // a.shape[-1], a.shape[-1]
        _norm("rmsnorm_pair")((rows, RMSNORM_CTAS if rows <= mmq_small.MAX_M else 1), (256,),
                              (a, wa.data, oa, np.int32(ra), b, wb.data, ob, np.int32(d), np.float32(eps)))
        return oa, ob

    def rmsnorm(self, x, weight: Weight, eps):
        ahead, self._normed_ahead = self._normed_ahead, None
        if ahead is not None and ahead[0] is x and ahead[1] is weight and ahead[2] == eps:
            self._xq = ahead[4]  # combine_norm made it: its mat-vec format is the slot's again
            return ahead[3]
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        d = x.shape[-1]
        out = cp.empty_like(x)
        if self._feeds_matvec(x):  # a decode step's norm: leave the mat-vec format behind too
            scratch = self._new_xq(out)
            _norm("rmsnorm_q")((x.shape[0], norm_ctas(d)), (256,),
                               (x, weight.data, out, np.int32(d), np.float32(eps)) + self._xq_args(scratch, out))
            return out
        out16 = None
        if x.ndim == 2:  # a prefill's norm: the next matmuls read its f16 rounding
            out16 = self._new_x16(out)
        rows = x.size // d
        if out16 is not None and rows <= mmq_small.MAX_M and d % 32 == 0:  # 3-64 rows, what tcgemv reads
            _norm("rmsnorm_h")((rows, norm_ctas(d)), (256,), (x, weight.data, out, np.int32(d), np.float32(eps), out16))
            return out
        _norm("rmsnorm_f32")((rows, RMSNORM_CTAS if rows <= mmq_small.MAX_M else 1), (256,),
                             (x, weight.data, out, np.int32(d), np.float32(eps),
                              out16 if out16 is not None else np.uint64(0)))
        return out

    def combine_norm(self, y, wts, k: int, res, weight: Weight, eps):
        """moe.combine's sum of an MoE decode's picks (returned), and rmsnorm(sum, weight, eps) in the
        same launch, held for the rmsnorm call that asks for it next (the next layer's input norm)."""
        P, H = y.shape
        n = P // k
        if not self._feeds_matvec(y[:n]) or wts.shape != (P,) or P % k or (res is not None and res.shape != (n, H)):
            return moe_kernels.combine(y, wts, k, res)
        total, out = cp.empty((n, H), cp.float32), cp.empty((n, H), cp.float32)
        scratch = self._new_xq(out)
        _norm("combine_rmsnorm_q")((n, RMSNORM_CTAS), (256,),
                                   (y, wts, np.int32(k), np.uint64(0 if res is None else res.data.ptr), total,
                                    weight.data, out, np.int32(H), np.float32(eps)) + self._xq_args(scratch, out))
        self._normed_ahead = (total, weight, eps, out, self._xq)
        return total

    def rope(self, x, positions, base, scale, neox, freq_factors=None):
        # Rotated in place: q and k are fresh temporaries of this pass, nothing else reads them.
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        n, h, d = x.shape
        total = n * h * (d // 2)
        ff = 0 if freq_factors is None else cp.asarray(freq_factors, cp.float32)
        _op("rope_f32")(((total + 255) // 256,), (256,),
                                        (x, positions, np.int32(n), np.int32(h), np.int32(d), np.float32(base),
                                         np.float32(scale), np.int32(neox), ff))
        return x

    def kv_write(self, cache: KVCache, layer, batch, k, v):
        k = cp.ascontiguousarray(k, dtype=cp.float32)
        v = cp.ascontiguousarray(v, dtype=cp.float32)
        n, row = k.shape[0], k.shape[1] * k.shape[2]
        _op("kv_write_f16")((((n * row) + 255) // 256,), (256,),
                                            (k, v, cache.k[layer], cache.v[layer], batch.dev["slots"], np.int32(n),
                                             np.int32(row)))

    def rope_kv(self, q, k, v, cache: KVCache, layer, batch, base, scale, neox, freq_factors=None, qk_norm=None):
        fuse = qk_norm is not None and q.shape[0] >= NORM_ROPE_MIN_ROWS
        if qk_norm is not None and not fuse:
            q, k = self.rmsnorm_pair(q, qk_norm[0], k, qk_norm[1], qk_norm[2])
        q = cp.ascontiguousarray(q, dtype=cp.float32)  # rotated in place: a fresh temporary of this pass
        k = cp.ascontiguousarray(k, dtype=cp.float32)
        v = cp.ascontiguousarray(v, dtype=cp.float32)
        n, hq, d = q.shape
        hkv = k.shape[1]
        ff = 0 if freq_factors is None else cp.asarray(freq_factors, cp.float32)
        if fuse:  # the head norms, rope and the KV write in one launch: one warp a head
            wq, wk, eps = qk_norm
            _op("norm_rope_kv")(((n * (hq + hkv) + 7) // 8,), (256,),
                                (q, k, v, cache.k[layer], cache.v[layer], batch.dev["positions"], np.int32(n),
                                 np.int32(hq), np.int32(hkv), np.int32(d), np.float32(base), np.float32(scale),
                                 np.int32(neox), ff, batch.dev["slots"], wq.data, wk.data, np.float32(eps)))
            return q
        total = n * (hq + hkv) * (d // 2)
        _op("rope_kv")(((total + 255) // 256,), (256,),
                                       (q, k, v, cache.k[layer], cache.v[layer], batch.dev["positions"], np.int32(n),
                                        np.int32(hq), np.int32(hkv), np.int32(d), np.float32(base), np.float32(scale),
                                        np.int32(neox), ff, batch.dev["slots"]))
        return q

    def attention(self, q, cache: KVCache, layer, batch, window, scale, sinks=None):
        q = cp.ascontiguousarray(q, dtype=cp.float32)
        k, v = cache.k[layer], cache.v[layer]
        sinks = None if sinks is None else sinks.data
        if "prefill_dims" in batch.dev:  # a prefill graph's pass (cuda_graph.PrefillGraph)
            return cuda_attention.paged_prefill(q, k, v, batch, window, scale, sinks)
        if batch.is_decode:
            xq = (lambda out: self._xq_args(self._new_xq(out), out)) if q.shape[0] <= cuda_matmul.MATVEC_ROWS else None
            return cuda_attention.decode(q, k, v, batch, window, scale, xq, sinks)
        return cuda_attention.mixed(q, k, v, batch, window, scale, layer, sinks)

    def swiglu(self, gate, up):
        return self._act_gate(gate, up, 0) if self._feeds_matvec(gate) else self._act_gate16(_swiglu, gate, up)

    def swiglu_oai(self, gate, up, alpha, limit):
        y = cp.empty(gate.shape, cp.float32)
        args = (cp.ascontiguousarray(gate, dtype=cp.float32), cp.ascontiguousarray(up, dtype=cp.float32),
                np.float32(alpha), np.float32(limit), y)
        if gate.ndim == 2:
            _swiglu_oai16(*args, self._new_x16(y))  # a prefill's: its f16 for down, no cast launch
        else:
            _swiglu_oai(*args)
        return y

    def gelu_gate(self, gate, up):
        return self._act_gate(gate, up, 1) if self._feeds_matvec(gate) else self._act_gate16(_gelu, gate, up)

    def _act_gate16(self, kernel, gate, up):
        y = cp.empty(gate.shape, cp.float32)
        kernel(gate, up, y, self._new_x16(y))
        return y

    def _act_gate(self, gate, up, act: int, alpha: float = 0.0, limit: float = 0.0):
        """act_gate_q (act 0 SiLU, 1 GELU, 2 gpt-oss's alpha / limit one): y, and its mat-vec format."""
        gate = cp.ascontiguousarray(gate, dtype=cp.float32)
        up = cp.ascontiguousarray(up, dtype=cp.float32)
        n, K = gate.shape
        y = cp.empty_like(gate)
        scratch = self._new_xq(y)
        _op("act_gate_q")(((n * K + 255) // 256,), (256,), (gate, up, y, np.int32(K), np.int32(n), np.int32(act))
                          + self._xq_args(scratch, y) + (np.float32(alpha), np.float32(limit)))
        return y
