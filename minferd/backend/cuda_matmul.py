"""The CUDA backend's matmuls: which kernel runs each one, and the input formats they read.

Up to 8 rows the mat-vec kernels stream the quantized bytes (mmvq, x in their int8 format, which
rmsnorm and the gated activation may already have written). Past that, each matmul takes the
fastest kernel its plan allows from the gate table (gates.py): cuBLAS on the f16 copy, and the
kernels that read the quantized bytes (mmq_small and tcgemv up to 64 rows; fused_b, dequantized
tiles, mmq). An input that several matrices read (q/k/v, gate/up) is converted once per pass:
one slot per format, keyed by the array, freed when the pass's scope ends.
"""
from __future__ import annotations

import itertools

import cupy as cp
import numpy as np

from minferd.backend import gates, pending
from minferd.backend.base import Weight
from minferd.devices import CUBLAS_WORKSPACE_BYTES, DEQUANT_ROWS, GRAPH_UNPACK_BYTES
from minferd.kernels import mmq_small, tcgemv
from minferd.kernels.cublas import gemm_f32
from minferd.kernels.gemm_f16 import fused_b
from minferd.kernels.mmq import SUPPORTED as MMQ_TYPES, UNPACK_BYTES as MMQ_UNPACK_BYTES, mmq
from minferd.kernels.mmvq import MAX_GROUP as MMVQ_GROUP, mmvq, mmvq_group, quantize_x
from minferd.kernels.mmvq import scratch_bytes as xq_bytes, xq_layout
from minferd.kernels.mmvq_rope_kv import ROPE, ROPE_K, V, RopeCache, mmvq_rope_kv, shape as rope_kv_shape
from minferd.kernels.tiles import gemm_tiles
from minferd.model import rope_rows

MMVQ_MAX_BATCH = 8  # up to this many tokens a matmul streams the quantized bytes (mat-vec kernels)
# Up to this many rows a type tcgemv decodes takes the mat-vec kernel; from 3 rows, tcgemv.
# The gate table's 8-row rows (H200, s20): tcgemv 8.5 / 19.8 / 20.7 us on the 7B's 3584x3584,
# 18944x3584 and 3584x18944 Q4_K against mmvq's 18.8 / 61.9 / 80.0 at 8 columns and 12.5 / 40.6 /
# 38.2 at 4 (its dp4a work grows with the columns; tcgemv's 8-token tile costs the same for 1-8),
# 8.1 / 23.9 / 22.9 at 2. s25: the 7B's 8-token prompt (its 8-column decode graph) took 8.9 ms in
# the engine against 4.0 for 12 tokens (call9-latency-short.log); s26 with tcgemv from 3 rows
# 3.8 (8 tokens 8.96 -> 3.83, 4 tokens 5.45 -> 3.84; call1-latency.log). Types tcgemv lacks (Q3_K,
# ...) keep the mat-vec kernel up to MMVQ_MAX_BATCH rows, quantizing x themselves past these.
ROPE_KV_ARCHS = ("llama", "qwen2", "qwen2moe")  # model/arch/llama.py's attention, which calls qkv_rope_kv
MATVEC_ROWS = 2  # read at each call (cuda_ops too): tests set it to MMVQ_MAX_BATCH for the old path


# Tiles inside a graph only where the graph's tile holds this many of the matrix's rows (or all):
# the gate table timed tiles of DEQUANT_ROWS, and a wide-K matrix in a graph's small tile (the 7B's
# ffn_down: 442 rows of 18944) would be many GEMMs of a few CTAs, never timed.
GRAPH_TILE_MIN_ROWS = 2048


# One-column mat-vecs in the type's wide unit (mmvq.WIDE_UNITS) up to this K. Q6_K in 16-position
# units (UQ6_K16): on the H200 (s21 call 1) 6-8% faster at K = 3584 (the 7B's output 164.6 ->
# 151.5-154.8 us), 3% slower at 18944. Not at 2-8 columns: its n = 8 instance spills.
WIDE_MAX_K = {"Q6_K": 4096}


def wide_unit(qt, K: int, n: int) -> bool:
    """Whether a mat-vec of n columns and row length K runs in qt's wide unit."""
    return n == 1 and K <= WIDE_MAX_K.get(qt.name, 0)


def key(x) -> tuple:
    return x.data.ptr, x.shape, x.dtype.char


def tc_rows(w: Weight, n: int) -> bool:
    """Whether n <= 8 rows of w's matmul run tcgemv rather than the mat-vec kernel."""
    return n > MATVEC_ROWS and w.qtype.name in tcgemv.SUPPORTED


class CudaMatmuls:
    """The matmul half of CudaBackend (it keeps the state: arena, gate table, plan, slots)."""
    def matmul(self, x, w: Weight, bias: Weight | None = None, residual=None):
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        n = x.shape[0]
        if residual is not None:
            residual = cp.ascontiguousarray(residual, dtype=cp.float32)
        if n <= MMVQ_MAX_BATCH and not tc_rows(w, n):
            out = cp.empty((n, w.n_rows), cp.float32)
            b = None if bias is None else bias.data
            if w.qtype.is_quantized:
                mmvq(w.qtype, w.data, x, out, scratch=self._quantized(x), x_quantized=True, bias=b, residual=residual,
                     wide=wide_unit(w.qtype, w.row_elems, n))
            else:  # float weights: a router's few rows split K over warps
                mmvq(w.qtype, w.data, x, out, bias=b, residual=residual, split_k=True)
            return out
        out = cp.empty((n, w.n_rows), cp.float32)
        kernel = gates.choose(self._prefill_kernels(w, n), w.qtype.name, w.n_rows, w.row_elems, n, self.gate_table)
        if kernel in ("small", "tc"):  # bias and residual ride in their epilogues
            b = None if bias is None else bias.data
            if kernel == "small":
                mmq_small.mmq_small(w.qtype, w.data, self._mmq_x(x), out, bias=b, residual=residual)
            else:
                tcgemv.tcgemv(w.qtype, w.data, self._as_f16(x), out, bias=b, residual=residual, config=self.tc_config)
            return out
        if kernel == "cublas":
            gemm_f32(self._as_f16(x), w.w16, out, self._cublas_workspace())
        elif kernel == "mmq":
            mmq(w.qtype, w.data, x, out, unpack_bytes=self._unpack_bytes())
        elif kernel == "fused_b":
            fused_b(w.qtype, w.data, self._as_f16(x), out)
        else:
            gemm_tiles(w.qtype, w.data, self._as_f16(x), out, self._tile_rows(w.row_elems), self._cublas_workspace())
        if bias is not None:
            out += bias.data
        if residual is not None:
            out += residual
        return out

    def _cublas_workspace(self):
        """cuBLAS's workspace, from the arena once and kept (the estimate counts it)."""
        if self._cublas_ws is None:
            self._cublas_ws = cp.empty(CUBLAS_WORKSPACE_BYTES, cp.uint8)
        return self._cublas_ws

    def _unpack_bytes(self) -> int:
        """mmq's slice of unpacked weights takes at most an eighth of the arena (the estimate
        adds that eighth: devices.cuda_scratch_bytes)."""
        if self.in_graph:  # a graph keeps its slice for good: a small one, in more launches
            return GRAPH_UNPACK_BYTES
        return MMQ_UNPACK_BYTES if self.arena is None else min(MMQ_UNPACK_BYTES, self.arena.nbytes // 8)

    def _tile_rows(self, K: int) -> int:
        """Rows of a dequantized tile: inside a graph, which keeps its tile for good, as many as
        GRAPH_UNPACK_BYTES holds (all of a 0.5B's matrices but the output in one tile)."""
        return max(1, min(DEQUANT_ROWS, GRAPH_UNPACK_BYTES // (2 * K))) if self.in_graph else DEQUANT_ROWS

    def _prefill_kernels(self, w: Weight, n: int) -> tuple[str, ...]:
        """The kernels w's plan allows at n tokens, preferred first where the gate table ties.
        With its f16 copy a matmul runs cuBLAS on it; without (a quantized plan, or a W16 model
        whose copy was demoted) the kernels that read the quantized bytes: fused_b, dequantized
        tiles through cuBLAS, and mmq for its types unless the plan is FUSED_B. Up to 64 rows
        mmq_small and tcgemv compete with both (bench/crossover.py --graph, 2026-12-01 s9: tcgemv
        wins most 9-32-row shapes of the 7B, over cuBLAS on the copy too; cuBLAS keeps Q6_K's
        large matrices and most of 64 rows)."""
        if n <= MMVQ_MAX_BATCH:  # 3-8 rows: tcgemv where it decodes the type, else the mat-vec
            return ("tc",) if tc_rows(w, n) else ("mmvq",)
        # A decode batch of 9-64 rows may read the quantized bytes once instead.
        small = () if n > mmq_small.MAX_M or not self.small_batch else \
            (("small",) if w.qtype.name in mmq_small.SUPPORTED else ()) + (("tc",) if w.qtype.name in tcgemv.SUPPORTED else ())
        if w.w16 is not None and n >= self.w16_min_tokens:
            allowed = ("cublas",) + small
        else:
            # A graph keeps every buffer of its own (cuda_graph): there tiles take a small slice
            # (_tile_rows). On the 0.5B's 896-wide matrices fused_b and mmq fill a few dozen CTAs:
            # the H200 table (s27) at 128 rows, Q5_0 896x4864 tiles 18.7 us, mmq 47.3, fused_b
            # 75.4; with tiles in graphs the 0.5B's 128-token prompt took 3.06 ms in the engine
            # against 5.02, its 512 4.08 against 6.36 (s27 call 3).
            tiles = ("tiles",) if self._tile_rows(w.row_elems) >= min(w.n_rows, GRAPH_TILE_MIN_ROWS) else ()
            mmq_ok = self.matmul_path != "fused_b" and w.qtype.name in MMQ_TYPES
            allowed = small + ("fused_b",) + tiles + (("mmq",) if mmq_ok else ())
        return (self.prefill_kernel,) if self.prefill_kernel in allowed else allowed

    def matmuls(self, x, ws, biases=None):
        """A decode step's products of one input: neighbours of one quantized type share a launch."""
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        n = x.shape[0]
        biases = list(biases or [None] * len(ws))
        if n > MATVEC_ROWS:
            return self._tc_matmuls(x, ws, biases)
        outs = []
        for _, run in itertools.groupby(zip(ws, biases), key=lambda wb: (wb[0].qtype, wb[0].row_elems)):
            run = list(run)
            for k in range(0, len(run), MMVQ_GROUP):
                part = run[k:k + MMVQ_GROUP]
                if len(part) == 1 or not part[0][0].qtype.is_quantized:
                    outs += [self.matmul(x, w, b) for w, b in part]
                    continue
                group = [cp.empty((n, w.n_rows), cp.float32) for w, _ in part]
                mmvq_group(part[0][0].qtype, [w.data for w, _ in part], x, group, scratch=self._quantized(x),
                           x_quantized=True, biases=[None if b is None else b.data for _, b in part],
                           wide=wide_unit(part[0][0].qtype, part[0][0].row_elems, n))
                outs += group
        return outs

    def pairs_rope_rows(self, spec) -> bool:
        """(base.py's) A neox model whose attention is llama.py's (it calls qkv_rope_kv) takes its q / k
        rows reordered on the pending path qkv_rope; the others keep their bytes."""
        return pending.ready("qkv_rope") and spec.arch in ROPE_KV_ARCHS and rope_rows.applies(spec)

    def qkv_rope_kv(self, x, ws, biases, cache, layer, batch, base, scale, freq_factors=None):
        """(base.py's) On the pending path qkv_rope, a step of <= MATVEC_ROWS rows whose q / k / v
        are quantized: each run of one type one mmvq_rope_kv launch (q rotated into its output, k
        and v into the cache), the rope pairs adjacent rows (normal rope, or rope_rows' reorder)."""
        n = x.shape[0]
        if not pending.ready("qkv_rope") or n > MATVEC_ROWS or not all(w.qtype.is_quantized for w in ws):
            return None
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        K = x.shape[1]
        runs = [list(run) for _, run in itertools.groupby(zip(ws, biases, (ROPE, ROPE_K, V)),
                                                          key=lambda r: (r[0].qtype, r[0].row_elems))]
        if any(rope_kv_shape(r[0][0].qtype, n, [w.n_rows for w, _, _ in r], K, [m for *_, m in r]) is None
               for r in runs):
            return None
        q = cp.empty((n, ws[0].n_rows), cp.float32)
        rc = RopeCache(batch.dev["positions"], batch.dev["slots"], cache.k[layer], cache.v[layer],
                       cache.k[layer].shape[-1], base, scale,
                       None if freq_factors is None else cp.asarray(freq_factors, cp.float32))
        for run in runs:
            qt = run[0][0].qtype
            mmvq_rope_kv(qt, [w.data for w, _, _ in run], x, [m for *_, m in run],
                         [q if m == ROPE else None for *_, m in run], rc, scratch=self._quantized(x), x_quantized=True,
                         biases=[None if b is None else b.data for _, b, _ in run], wide=wide_unit(qt, K, n))
        return q

    def _tc_matmuls(self, x, ws, biases):
        """Past the mat-vec's rows (3-64: cuda_matmul.MATVEC_ROWS): neighbours of one type the gate
        table gives tcgemv share a launch where its K splits meet in clusters (up to 32 rows); the
        rest run one by one. H200, s25 (in turns in one call): the 16-token TTFT's engine share
        0.5B 1.94 -> 1.54 ms, 7B 4.34 -> 3.92, 8B 4.68 -> 4.31 (q/k/v's three launches a layer
        and gate/up's two, each one)."""
        n, K = x.shape
        if not tcgemv.groups_at(n, K, self.tc_config):
            return super().matmuls(x, ws, biases)
        picks = [gates.choose(self._prefill_kernels(w, n), w.qtype.name, w.n_rows, w.row_elems, n, self.gate_table)
                 for w in ws]
        outs = []
        for (kernel, qt), run in itertools.groupby(zip(picks, ws, biases), key=lambda r: (r[0], r[1].qtype)):
            run = [(w, b) for _, w, b in run]
            if kernel != "tc" or len(run) == 1:
                outs += [self.matmul(x, w, b) for w, b in run]
                continue
            for k in range(0, len(run), tcgemv.MAX_GROUP):
                part = run[k:k + tcgemv.MAX_GROUP]
                group = [cp.empty((n, w.n_rows), cp.float32) for w, _ in part]
                tcgemv.tcgemv_group(qt, [w.data for w, _ in part], self._as_f16(x), group,
                                    biases=[None if b is None else b.data for _, b in part], config=self.tc_config)
                outs += group
        return outs

    def _quantized(self, x):
        """x (n <= 8, K) in the mat-vec kernels' int8 format: made once per array and pass."""
        if self._xq is not None and self._xq[0] == key(x):
            return self._xq[2]
        scratch = self._new_xq(x)
        quantize_x(x, scratch)
        return scratch

    def _mmq_x(self, x):
        """x in mmq_small's format: made once per array and pass (q/k/v and gate/up share it)."""
        if self._xm is None or self._xm[0] != key(x):
            self._xm = None
            self._xm = (key(x), x, mmq_small.quantize(x))
        return self._xm[2]

    def _as_f16(self, x):
        if self._x16 is not None and self._x16[0] == key(x):
            return self._x16[2]
        x16 = self._new_x16(x)
        cp.copyto(x16, x, casting="same_kind")
        return x16

    def _new_x16(self, x):
        """An f16 buffer for x's rounding, registered as x's (a producer may fill it directly)."""
        self._x16 = None  # let the previous copy go before the next is made
        x16 = cp.empty(x.shape, cp.float16)
        self._x16 = (key(x), x, x16)
        return x16


    @staticmethod
    def _feeds_matvec(x) -> bool:
        """A 2-D activation of a decode-sized batch: what the next matmul quantizes."""
        return x.ndim == 2 and x.shape[0] <= MATVEC_ROWS and x.shape[1] % 32 == 0

    def _new_xq(self, x):
        self._xq = None
        scratch = cp.empty(xq_bytes(*x.shape), cp.uint8)
        self._xq = (key(x), x, scratch)
        return scratch

    @staticmethod
    def _xq_args(scratch, x) -> tuple:
        off, kbp, _ = xq_layout(*x.shape)
        return (np.uint64(scratch.data.ptr), np.uint64(scratch.data.ptr + off), np.int32(kbp))
