"""Vectorized NumPy dequantizers: the CPU reference for every type in quant.TYPES.

Byte layouts follow ggml's dequantize_row_* (ggml-quants.c) exactly, and so does the
float arithmetic: each value is round_f32(d*sc*q [- dmin*m]) where the products before
the last operation are exact in f32, so the result is bit-equal to ggml's and to
gguf.quants (the tests hold us to that).

Speed: the CPU backend dequantizes every matmul weight at each use, in row blocks,
from several threads. So there is no Python loop over blocks; the bit twiddling runs
on uint8 arrays (one byte per element), and the only f32 passes are one multiply (the
uint8/int8 -> f32 cast happens inside the ufunc's buffered loop, no f32 temporary) and,
for types with a min, one subtract/add in place. Big ufuncs release the GIL.
"""

from __future__ import annotations

import numpy as np

from .quant import QuantType, row_bytes

_U8 = np.uint8
_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=_U8).reshape(1, 1, 4, 1)  # 4 crumbs per byte
_SHIFT_1BIT = np.arange(8, dtype=_U8).reshape(1, 8, 1)  # 8 bit planes per byte


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    """The f16 at byte offset `off` of every block, as an (nb, 1) f32 column.
    Every f16 field sits at an even offset of an even-sized block, but the view would
    work unaligned too: numpy handles unaligned arrays, only slower."""
    return blocks[:, off:off + 2].view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, q: np.ndarray) -> None:
    """Split bytes (..., n) into q[..., 0, :] = low nibbles and q[..., 1, :] = high:
    ggml puts element l in the low nibble of byte l and element l+n in its high nibble."""
    np.bitwise_and(qs, 0x0F, out=q[..., 0, :])
    np.right_shift(qs, 4, out=q[..., 1, :])


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 8 6-bit scales and 8 6-bit mins packed in 12 bytes (get_scale_min_k4).
    Sub-blocks 0-3 keep their 6 bits in bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7
    have their low nibbles in bytes 8-11 and their top 2 bits in the top of bytes 0-7."""
    b0, b1, b2 = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = np.concatenate([b0 & 63, (b2 & 0x0F) | ((b0 >> 6) << 4)], axis=1)
    mins = np.concatenate([b1 & 63, (b2 >> 4) | ((b1 >> 6) << 4)], axis=1)
    return scale, mins


# Each _deq_* reads blocks (nb, block_bytes) uint8 and writes out (nb, block_elems) f32.

def _deq_f32(blocks, out):
    out[:] = blocks.reshape(-1).view(np.float32).reshape(out.shape)


def _deq_f16(blocks, out):
    out[:] = blocks.reshape(-1).view(np.float16).reshape(out.shape)


def _deq_bf16(blocks, out):
    # bf16 is the top half of an f32: widen and shift, no float arithmetic at all.
    bits = blocks.reshape(-1).view(np.uint16).reshape(out.shape)
    np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)


def _deq_q4_0(blocks, out):
    q = np.empty((len(blocks), 2, 16), _U8)
    _nibbles(blocks[:, 2:18], q)
    q -= 8  # wraps in uint8; read back as int8 it is q - 8
    np.multiply(q.view(np.int8).reshape(out.shape), _f16(blocks, 0), out=out)


def _deq_q4_1(blocks, out):
    q = np.empty((len(blocks), 2, 16), _U8)
    _nibbles(blocks[:, 4:20], q)
    np.multiply(q.reshape(out.shape), _f16(blocks, 0), out=out)
    out += _f16(blocks, 2)


def _q5_high(qh: np.ndarray, q: np.ndarray) -> None:
    # qh is a little-endian u32 at an offset that is not 4-aligned in Q5_0 (22-byte
    # blocks): never load it as u32. Bit j of it is bit j%8 of byte j//8, which is
    # exactly what unpackbits(bitorder="little") yields, in element order.
    q |= np.unpackbits(qh, axis=1, bitorder="little") << 4


def _deq_q5_0(blocks, out):
    q = np.empty((len(blocks), 2, 16), _U8)
    _nibbles(blocks[:, 6:22], q)
    q = q.reshape(out.shape)
    _q5_high(blocks[:, 2:6], q)
    q -= 16
    np.multiply(q.view(np.int8), _f16(blocks, 0), out=out)


def _deq_q5_1(blocks, out):
    q = np.empty((len(blocks), 2, 16), _U8)
    _nibbles(blocks[:, 8:24], q)
    q = q.reshape(out.shape)
    _q5_high(blocks[:, 4:8], q)
    np.multiply(q, _f16(blocks, 0), out=out)
    out += _f16(blocks, 2)


def _deq_q8_0(blocks, out):
    np.multiply(blocks[:, 2:34].view(np.int8), _f16(blocks, 0), out=out)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K low bits: 64 bytes hold 256 2-bit values. Element 128*h + 32*j + l is
    bits 2j..2j+1 of byte 32*h + l. Returns (nb, 256) uint8 in element order."""
    nb = len(qs)
    q = (qs.reshape(nb, 2, 1, 32) >> _SHIFT_2BIT) & 3
    return q.reshape(nb, 256)


def _deq_q2_k(blocks, out):
    # [0:16] scale (low nibble) | min (high nibble) per 16 elements, [16:80] 2-bit q,
    # [80:82] f16 d, [82:84] f16 dmin.  y = d*sc*q - dmin*m
    nb = len(blocks)
    sc = blocks[:, 0:16]
    dl = _f16(blocks, 80) * (sc & 0x0F)
    ml = _f16(blocks, 82) * (sc >> 4)
    o = out.reshape(nb, 16, 16)
    np.multiply(_crumbs(blocks[:, 16:80]).reshape(nb, 16, 16), dl[:, :, None], out=o)
    o -= ml[:, :, None]


def _deq_q3_k(blocks, out):
    # [0:32] hmask, [32:96] 2-bit q, [96:108] 16 6-bit scales (offset 32), [108:110] f16 d.
    # Element 32*s + l: low bits as in _crumbs, high bit = bit s of hmask[l]; ggml
    # subtracts 4 where that bit is CLEAR, i.e. value = (q | hbit << 2) - 4.
    nb = len(blocks)
    q = _crumbs(blocks[:, 32:96])
    hbit = (blocks[:, None, 0:32] >> _SHIFT_1BIT) & 1  # (nb, 8, 32)
    q |= hbit.reshape(nb, 256) << 2
    q -= 4
    # Scale i: low nibble from byte i%8 (low half for i<8, high for i>=8), top 2 bits
    # from byte 8 + i%4 at bit 2*(i//4).
    sc = blocks[:, 96:108]
    low = np.concatenate([sc[:, 0:8] & 0x0F, sc[:, 0:8] >> 4], axis=1)
    high = (sc[:, None, 8:12] >> _SHIFT_2BIT[0]) & 3  # (nb, 4, 4): [i//4, i%4]
    scale = (low | (high.reshape(nb, 16) << 4)).view(np.int8) - np.int8(32)
    dl = _f16(blocks, 108) * scale
    np.multiply(q.view(np.int8).reshape(nb, 16, 16), dl[:, :, None], out=out.reshape(nb, 16, 16))


def _deq_q4_k(blocks, out):
    # [0:2] f16 d, [2:4] f16 dmin, [4:16] packed scales/mins, [16:144] nibbles: 4 chunks
    # of 32 bytes, chunk c holding sub-block 2c (low nibbles) and 2c+1 (high).
    nb = len(blocks)
    q = np.empty((nb, 4, 2, 32), _U8)
    _nibbles(blocks[:, 16:144].reshape(nb, 4, 32), q)
    _deq_k_affine(blocks, q.reshape(nb, 8, 32), blocks[:, 4:16], out)


def _deq_q5_k(blocks, out):
    # As Q4_K, with [16:48] qh before the nibbles at [48:176]: the high bit of element
    # 32*s + l is bit s of qh[l].
    nb = len(blocks)
    q = np.empty((nb, 4, 2, 32), _U8)
    _nibbles(blocks[:, 48:176].reshape(nb, 4, 32), q)
    q = q.reshape(nb, 8, 32)
    q |= ((blocks[:, None, 16:48] >> _SHIFT_1BIT) & 1) << 4
    _deq_k_affine(blocks, q, blocks[:, 4:16], out)


def _deq_k_affine(blocks, q, packed_scales, out):
    nb = len(blocks)
    scale, mins = _scale_min_k4(packed_scales)
    dl = _f16(blocks, 0) * scale
    ml = _f16(blocks, 2) * mins
    o = out.reshape(nb, 8, 32)
    np.multiply(q, dl[:, :, None], out=o)
    o -= ml[:, :, None]


def _deq_q6_k(blocks, out):
    # [0:128] ql, [128:192] qh, [192:208] int8 scales per 16 elements, [208:210] f16 d.
    # Element 128*h + 32*k + l: low nibble of ql[64h + 32*(k%2) + l] (high nibble when
    # k >= 2), top 2 bits = bits 2k..2k+1 of qh[32h + l]; value - 32.
    nb = len(blocks)
    q = np.empty((nb, 2, 2, 2, 32), _U8)  # [h, k//2, k%2, l]
    _nibbles(blocks[:, 0:128].reshape(nb, 2, 2, 32), q.transpose(0, 1, 3, 2, 4))
    q = q.reshape(nb, 2, 4, 32)
    q |= ((blocks[:, 128:192].reshape(nb, 2, 1, 32) >> _SHIFT_2BIT) & 3) << 4
    q -= 32
    dl = _f16(blocks, 208) * blocks[:, 192:208].view(np.int8)
    np.multiply(q.view(np.int8).reshape(nb, 16, 16), dl[:, :, None], out=out.reshape(nb, 16, 16))


_KERNELS = {
    "F32": _deq_f32, "F16": _deq_f16, "BF16": _deq_bf16,
    "Q4_0": _deq_q4_0, "Q4_1": _deq_q4_1, "Q5_0": _deq_q5_0, "Q5_1": _deq_q5_1, "Q8_0": _deq_q8_0,
    "Q2_K": _deq_q2_k, "Q3_K": _deq_q3_k, "Q4_K": _deq_q4_k, "Q5_K": _deq_q5_k, "Q6_K": _deq_q6_k,
}


def dequantize(qt: QuantType, raw: np.ndarray, n_rows: int, row_elems: int,
               out: np.ndarray | None = None) -> np.ndarray:
    """Dequantize n_rows rows of row_elems elements from their contiguous bytes `raw`
    (any shape, n_rows * row_bytes uint8 in all). Returns f32 (n_rows, row_elems); pass
    `out` (C-contiguous f32 of that shape) to reuse a buffer."""
    rb = row_bytes(qt, row_elems)
    raw = np.asarray(raw)
    if raw.dtype != _U8:
        raise TypeError(f"{qt.name}: raw bytes must be uint8, got {raw.dtype}")
    if raw.size != n_rows * rb:
        raise ValueError(f"{qt.name}: {raw.size} bytes for {n_rows} rows of {row_elems} elements, "
                         f"expected {n_rows * rb}")
    if out is None:
        out = np.empty((n_rows, row_elems), np.float32)
    elif out.shape != (n_rows, row_elems) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {(n_rows, row_elems)}, "
                         f"got {out.dtype} {out.shape}")
    nb = n_rows * row_elems // qt.block_elems
    if nb:
        _KERNELS[qt.name](raw.reshape(nb, qt.block_bytes), out.reshape(nb, qt.block_elems))
    return out


def dequantize_rows(qt: QuantType, raw_2d: np.ndarray, rows, out: np.ndarray | None = None) -> np.ndarray:
    """Dequantize selected rows (a slice, an index or an index array) of a tensor held
    as its (n_rows, row_bytes) uint8 view, e.g. an embedding lookup or a row block."""
    sel = raw_2d[rows]
    if sel.ndim == 1:
        sel = sel[None, :]
    row_elems = raw_2d.shape[1] // qt.block_bytes * qt.block_elems
    return dequantize(qt, sel, sel.shape[0], row_elems, out=out)
