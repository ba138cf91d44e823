"""Attention on the CUDA backend, over one layer's paged f16 KV.

Prefill: one sequence's queries over its keys gathered in position order (slots = the number of
keys): the flash kernel (attn_prefill.cu) for its head dims, else two cuBLAS products around a
masked softmax. Decode: a batch of sequences through their block tables (attn_decode.cu), split
over the keys so that one long sequence still fills the GPU.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from minferd.backend.batch import Batch
from minferd.devices import DECODE_PARTIAL_ROWS
from minferd.kernels import kernel
from minferd.kernels.attn_decode import attn_decode, splits_for
from minferd.kernels.attn_prefill import HEAD_DIMS as PREFILL_HEAD_DIMS, attn_prefill, attn_prefill_paged


def prefill(q, k, v, slots: int, first: int, window: int, scale: float, layer: int, sinks=None):
    """q (n, hq, d) f32 of positions first.. first + n - 1 over k, v: the sequence's keys in
    position order (slots of them); sinks (hq,) f32: gpt-oss's extra logit per head."""
    n, hq, d = q.shape
    last = first + n - 1
    lo = max(0, last + 1 - slots)
    if slots < last + 1 and slots < window + n - 1:
        raise ValueError(f"layer {layer}: a ring of {slots} slots cannot serve {n} queries with window {window}")
    if d in PREFILL_HEAD_DIMS:
        out = cp.empty((n, hq * d), cp.float32)
        attn_prefill(q, k, v, out, first=first, lo=lo, window=window, scale=scale, sinks=sinks)
        return out
    if sinks is not None:
        raise ValueError(f"layer {layer}: attention sinks need the flash kernel's head dims {PREFILL_HEAD_DIMS}, not {d}")
    # Other head dims: two cuBLAS products around a masked softmax.
    hkv = k.shape[1]
    key_pos = cp.arange(lo, last + 1, dtype=cp.int32)
    kf = k[key_pos % slots].astype(cp.float32)  # (L, hkv, d)
    vf = v[key_pos % slots].astype(cp.float32)
    g = hq // hkv
    # Scores in f32: q.k of real activations can pass f16's 65504.
    qg = (q * np.float32(scale)).reshape(n, hkv, g, d).transpose(1, 2, 0, 3).reshape(hkv, g * n, d)
    sc = cp.matmul(qg, kf.transpose(1, 2, 0))  # (hkv, g*n, L)
    L = sc.shape[-1]
    kernel("ops", "masked_softmax_f32")((hkv * g * n,), (256,),
                                                     (sc, np.int32(n), np.int32(L), np.int32(first), np.int32(lo),
                                                      np.int32(window)))
    o = cp.matmul(sc, vf.transpose(1, 0, 2))  # (hkv, g*n, d)
    return o.reshape(hkv, g, n, d).transpose(2, 0, 1, 3).reshape(n, hq * d)


def paged_prefill(q, k, v, batch, window: int, scale: float, sinks=None):
    """A prefill graph's one sequence (cuda_graph.PrefillGraph): its queries over its keys through
    its block table, first and the real query count read from the device."""
    out = cp.empty((q.shape[0], q.shape[1] * q.shape[2]), cp.float32)
    attn_prefill_paged(q, k, v, out, batch.dev["block_tables"][0], batch.dev["prefill_dims"],
                       block_size=batch.block_size, window=window, scale=scale, sinks=sinks)
    return out


def decode(q, k, v, batch, window: int, scale: float, int8_x_args=None, sinks=None):
    """q (B, hq, d) f32, one query per sequence, each over its own keys through the batch's
    block tables (device arrays: a captured graph replays it for other tables and lengths).
    int8_x_args(out), for B <= 8: the merge also leaves out in the mat-vec kernels' int8 format."""
    B, hq, d = q.shape
    out = cp.empty((B, hq * d), cp.float32)
    splits = min(splits_for(B, k.shape[1], batch.block_tables.shape[1] * batch.block_size, d=d),
                 max(1, DECODE_PARTIAL_ROWS // B))  # what the scratch estimate allows
    attn_decode(q, k, v, batch.dev["block_tables"], batch.dev["ctx_lens"], out, block_size=batch.block_size,
                window=window, scale=scale, splits=splits, xq=None if int8_x_args is None else int8_x_args(out),
                sinks=sinks)
    return out


def prepare_mixed(batch) -> None:
    """What a step of prefilling and decoding sequences attends with, on the device: the
    decoding ones (one new token) attend together through their block tables; each prefilling
    one over its keys gathered in position order (by their slots, unless they sit at slots 0..
    already: a cache of one sequence)."""
    lens = np.diff(batch.q_starts)
    one = np.flatnonzero(lens == 1)
    if one.size:
        batch.dev["decoding"] = (cp.asarray(batch.q_starts[one].astype(np.int64)),
                                 Batch(batch.ids[one], batch.positions[one], batch.slots[one],
                                       np.arange(one.size + 1, dtype=np.int32), batch.ctx_lens[one],
                                       batch.block_tables[one], batch.block_size,
                                       {"ctx_lens": cp.asarray(batch.ctx_lens[one]),
                                        "block_tables": cp.asarray(batch.block_tables[one])}))
    keys = []
    for b in range(batch.n_seqs):
        slots = batch.key_slots(b) if lens[b] > 1 else None
        keys.append(None if slots is None or np.array_equal(slots, np.arange(slots.size))
                    else cp.asarray(slots.astype(np.int32)))
    batch.dev["key_slots"] = keys


def mixed(q, k, v, batch, window: int, scale: float, layer: int, sinks=None):
    """A step that is not all decoding (never captured): prepare_mixed's groups. The host's copy
    of the batch says where each sequence's rows are (reading the device's would stall every layer)."""
    out = cp.empty((q.shape[0], q.shape[1] * q.shape[2]), cp.float32)
    if "decoding" in batch.dev:
        rows, sub = batch.dev["decoding"]
        out[rows] = decode(cp.ascontiguousarray(q[rows]), k, v, sub, window, scale, sinks=sinks)
    for b in range(batch.n_seqs):
        r0, r1, n_keys = int(batch.q_starts[b]), int(batch.q_starts[b + 1]), int(batch.ctx_lens[b])
        if r1 - r0 == 1 and "decoding" in batch.dev:
            continue
        idx = batch.dev["key_slots"][b]
        kb, vb = (k[:n_keys], v[:n_keys]) if idx is None else (k[idx], v[idx])
        out[r0:r1] = prefill(q[r0:r1], kb, vb, n_keys, n_keys - (r1 - r0), window, scale, layer, sinks)
    return out
