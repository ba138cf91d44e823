"""The CPU backend: the op set in NumPy with f32 math. The reference every other backend is
checked against, and what CI runs.

It honours the matmul plan so that memory is real here too: a W16 weight keeps a resident f16
copy (2 B per element, what the pool counts as w16); otherwise each weight is dequantized at
use, in row blocks, from its quantized bytes. Row blocks run on a thread pool: NumPy releases
the GIL inside its large array operations, so dequantization scales with cores.
"""
from __future__ import annotations

import math
import os
import queue
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from minferd.backend import moe
from minferd.backend.base import Backend, KVCache, Weight, allocate_all
from minferd.kernels.dequant_ref import dequantize
from minferd.kernels.quant import QuantType, row_bytes
from minferd.priority import lower_this_thread

# A row block's f32 dequant should stay cache-sized: about 1 MiB of floats.
BLOCK_ELEMS = 1 << 18
W16_MIN_TOKENS = 1  # on the CPU reading the f16 copy is never slower than dequantizing


class HostMemory:
    """The CPU "device": NumPy buffers, with its own count of the bytes alive in them."""

    name = "cpu"

    def __init__(self):
        self._used = 0
        self._lock = threading.Lock()

    def empty(self, shape, dtype) -> np.ndarray:
        a = np.empty(shape, dtype)
        with self._lock:
            self._used += a.nbytes
        weakref.finalize(a, self._drop, a.nbytes)
        return a

    def _drop(self, n: int) -> None:
        with self._lock:
            self._used -= n

    def used_bytes(self) -> int:
        return self._used


def scratch_bytes(threads: int) -> int:
    """The CPU backend's scratch arena: one f32 dequant buffer per thread."""
    return threads * BLOCK_ELEMS * 4


class CpuBackend(Backend):
    name = "cpu"
    kv_dtype = "f32"

    def __init__(self, threads: int | None = None, memory: HostMemory | None = None, matmul_path: str = "mmq"):
        self.threads = threads or os.cpu_count() or 1
        self.memory = memory or HostMemory()
        self.matmul_path = str(getattr(matmul_path, "value", matmul_path))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="minferd-cpu", initializer=lower_this_thread)

    def close(self) -> None:
        self._pool.shutdown(wait=False)  # an unloaded model's threads went on living (60-110 after 150 unloads)

    # ---- memory --------------------------------------------------------------------------
    def upload(self, mem, name, qtype: QuantType, shape, raw: np.ndarray) -> Weight:
        w = Weight(name, qtype, tuple(shape), None, mem)
        if len(shape) == 1 or w.n_rows == 1:
            # Norm weights and biases: small, used every token; keep them as f32.
            w.data = mem.empty("weights", (w.row_elems * w.n_rows,), np.float32)
            dequantize(qtype, raw, 1, w.row_elems * w.n_rows, out=w.data.reshape(1, -1))
        else:
            w.data = mem.empty("weights", (w.n_rows, row_bytes(qtype, w.row_elems)), np.uint8)
            w.data[...] = np.asarray(raw).reshape(w.data.shape)
        return w

    def make_w16(self, w: Weight) -> int:
        if w.w16 is None:
            w16 = w.mem.empty("w16", (w.n_rows, w.row_elems), np.float16)
            for r0, r1 in self._row_blocks(w):
                w16[r0:r1] = self._dequant_rows(w, r0, r1)
            w.w16 = w16
        return w.w16.nbytes

    def alloc_scratch(self, mem, nbytes: int | None = None) -> None:
        """Allocate this backend's dequant buffers from `mem` (counted as the model's scratch;
        their size is scratch_bytes(threads), which the planner's estimate already says)."""
        bufs = allocate_all(mem, "scratch", [(BLOCK_ELEMS,)] * self.threads, np.float32)
        self._scratch = queue.SimpleQueue()
        for b in bufs:
            self._scratch.put(b)
        self._scratch_list = bufs

    def free_scratch(self, mem) -> None:
        for b in getattr(self, "_scratch_list", []):
            mem.release(b)
        self._scratch_list, self._scratch = [], None

    def to_device(self, a):
        return np.asarray(a)

    def to_host(self, a):
        return np.asarray(a)

    # ---- matmul --------------------------------------------------------------------------
    def _row_blocks(self, w: Weight, r0: int = 0, r1: int | None = None):
        step, r1 = max(1, BLOCK_ELEMS // w.row_elems), w.n_rows if r1 is None else r1
        return [(r, min(r + step, r1)) for r in range(r0, r1, step)]

    def _dequant_rows(self, w: Weight, r0: int, r1: int, out=None) -> np.ndarray:
        if w.w16 is not None:
            if out is None:
                return w.w16[r0:r1].astype(np.float32)
            np.copyto(out, w.w16[r0:r1])
            return out
        return dequantize(w.qtype, w.data[r0:r1], r1 - r0, w.row_elems, out=out)

    def matmul(self, x, w: Weight, bias: Weight | None = None, residual=None):
        y = self._product(x, w, 0, w.n_rows)
        if bias is not None:
            y += bias.data
        if residual is not None:
            y += residual
        return y

    def _product(self, x, w: Weight, first: int, end: int, pooled: bool = True) -> np.ndarray:
        """x times rows first .. end of w: (n, end - first) f32, dequantized a block at a time, the
        blocks on the thread pool (pooled) or on the calling thread (one of the pool's own)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty((x.shape[0], end - first), np.float32)
        arena = getattr(self, "_scratch", None)

        def block(r):
            r0, r1 = r
            buf = arena.get() if arena is not None else None
            try:
                out = None if buf is None else buf[:(r1 - r0) * w.row_elems].reshape(r1 - r0, w.row_elems)
                np.matmul(x, self._dequant_rows(w, r0, r1, out).T, out=y[:, r0 - first:r1 - first])
            finally:
                if buf is not None:
                    arena.put(buf)

        blocks = self._row_blocks(w, first, end)
        # One block stays on this thread: a hand-off to the pool and back costs more than a small
        # matrix's product (a tiny model's 1-token prefill through the daemon: 4.56 -> 2.80 ms).
        list(self._pool.map(block, blocks) if pooled and len(blocks) > 1 else map(block, blocks))
        return y

    def moe(self, x, router: Weight, gate_exps: Weight, up_exps: Weight, down_exps: Weight, k: int,
            residual=None, router_bias=None, exps_bias=None, oai_glu=None, norm_topk=True, then_norm=None):
        x = np.ascontiguousarray(x, dtype=np.float32)
        n = x.shape[0]
        top, p = moe.route(self.matmul(x, router, router_bias), k, norm_topk)
        out = self.residual_out(residual, (n, down_exps.shape[1]))
        # Tokens grouped by expert: each chosen expert's rows are dequantized once for the pass.
        order, bounds = moe.groups(top, router.n_rows)
        weights = p.ravel()
        f, d = gate_exps.shape[1], down_exps.shape[1]

        # One pool task per expert, not per row block: a tiny expert's product is one block, and
        # three handoffs to the pool per expert cost more than its arithmetic. Inside a task the
        # products stay on its thread (a pool task waiting on the pool could wait forever).
        def expert(e):
            mine = order[bounds[e]:bounds[e + 1]]
            xe = x[mine // k]
            g = self._product(xe, gate_exps, e * f, (e + 1) * f, pooled=False)
            u = self._product(xe, up_exps, e * f, (e + 1) * f, pooled=False)
            if exps_bias is not None:  # (rows, n_expert) tensors: expert e's bias is their row e
                g += self._dequant_rows(exps_bias[0], e, e + 1)
                u += self._dequant_rows(exps_bias[1], e, e + 1)
            h = self.swiglu(g, u) if oai_glu is None else self.swiglu_oai(g, u, *oai_glu)
            y = self._product(h, down_exps, e * d, (e + 1) * d, pooled=False)
            if exps_bias is not None:
                y += self._dequant_rows(exps_bias[2], e, e + 1)
            return mine, y

        for mine, y in self._pool.map(expert, np.flatnonzero(np.diff(bounds))):
            self.add_rows(out, mine // k, y, weights[mine])
        return out

    def take_rows(self, x, rows):
        return np.ascontiguousarray(x[rows], dtype=np.float32)

    def sigmoid_dot(self, x, v: Weight):
        z = np.asarray(x, np.float32) @ v.data[:, None]
        return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)

    def add_rows(self, out, rows, y, weights) -> None:
        out[rows] += weights[:, None] * y

    def bias_row(self, w: Weight, r: int):
        return self._dequant_rows(w, r, r + 1)

    def residual_out(self, residual, shape):
        return np.zeros(shape, np.float32) if residual is None else np.array(residual, np.float32)

    def embed(self, ids, w: Weight):
        ids = np.asarray(ids, dtype=np.int64)
        if w.w16 is not None:
            return w.w16[ids].astype(np.float32)
        return dequantize(w.qtype, w.data[ids], len(ids), w.row_elems)

    # ---- small ops -----------------------------------------------------------------------
    def rmsnorm(self, x, weight: Weight, eps):
        ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
        return (x / np.sqrt(ms + np.float32(eps))) * weight.data

    def rope(self, x, positions, base, scale, neox, freq_factors=None):
        n, h, d = x.shape
        inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        if freq_factors is not None:
            inv = inv / np.asarray(freq_factors, np.float64)
        ang = (np.asarray(positions, np.float64)[:, None] * scale) * inv[None, :]  # (n, d/2)
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        if neox:
            a, b = x[..., : d // 2], x[..., d // 2:]
        else:
            a, b = x[..., 0::2], x[..., 1::2]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        out = np.empty_like(x)
        if neox:
            out[..., : d // 2], out[..., d // 2:] = ra, rb
        else:
            out[..., 0::2], out[..., 1::2] = ra, rb
        return out

    def kv_write(self, cache: KVCache, layer, batch, k, v):
        cache.k[layer][batch.slots] = k
        cache.v[layer][batch.slots] = v

    def attention(self, q, cache: KVCache, layer, batch, window, scale, sinks=None):
        out = np.empty((q.shape[0], q.shape[1] * q.shape[2]), np.float32)
        for b in range(batch.n_seqs):
            r0, r1 = batch.q_starts[b], batch.q_starts[b + 1]
            out[r0:r1] = self._attend(q[r0:r1], cache, layer, batch.key_slots(b), batch.positions[r0:r1],
                                      window, scale, sinks)
        return out

    @staticmethod
    def _attend(q, cache: KVCache, layer, slots, positions, window, scale, sinks=None):
        """One sequence's queries over its keys at positions 0 .. len(slots) - 1."""
        n, hq, d = q.shape
        k, v = cache.k[layer][slots], cache.v[layer][slots]
        key_pos = np.arange(len(slots))
        hkv = k.shape[1]
        group = hq // hkv
        allowed = key_pos[None, :] <= positions[:, None]
        if window:
            allowed &= positions[:, None] - key_pos[None, :] < window
        bias = np.where(allowed, np.float32(0), np.float32(-np.inf))  # (n, n_keys)
        out = np.empty((n, hq, d), np.float32)
        for g in range(hkv):
            qg = q[:, g * group:(g + 1) * group, :].transpose(1, 0, 2)  # (group, n, d)
            s = np.matmul(qg, k[:, g, :].T) * np.float32(scale) + bias  # (group, n, n_keys)
            top = s.max(axis=-1, keepdims=True)
            if sinks is not None:  # a sink is one more logit in the row, unscaled, with no value
                sink = sinks.data[g * group:(g + 1) * group, None, None]
                top = np.maximum(top, sink)
            s -= top
            np.exp(s, out=s)
            total = s.sum(axis=-1, keepdims=True)
            if sinks is not None:
                total += np.exp(sink - top)
            s /= total
            out[:, g * group:(g + 1) * group, :] = np.matmul(s, v[:, g, :]).transpose(1, 0, 2)
        return out.reshape(n, hq * d)

    def swiglu(self, gate, up):
        return gate / (np.float32(1) + np.exp(-gate)) * up

    def swiglu_oai(self, gate, up, alpha, limit):
        g = np.minimum(gate, np.float32(limit))
        u = np.clip(up, np.float32(-limit), np.float32(limit))
        return g / (np.float32(1) + np.exp(np.float32(-alpha) * g)) * (u + np.float32(1))

    def gelu_gate(self, gate, up):
        c = np.float32(math.sqrt(2.0 / math.pi))
        return np.float32(0.5) * gate * (np.float32(1) + np.tanh(c * (gate + np.float32(0.044715) * gate ** 3))) * up
