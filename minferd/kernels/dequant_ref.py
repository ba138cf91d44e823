"""Vectorized NumPy dequantizers: the CPU reference for every type in quant.TYPES.

Byte layouts follow ggml's dequantize_row_* (ggml-quants.c) exactly, and so does the
float arithmetic: dl = d*sc and ml = dmin*m are formed in f32 first, then each value is
dl*q (- ml), in that order, so results are bit-equal to ggml's, signed zeros included
(tests hold us to gguf.quants, which follows the same order).

Speed: the CPU backend dequantizes every matmul weight at each use, in row blocks of
about 2^18 elements, from several threads. NumPy's per-call and per-inner-loop costs
are what make this slow or fast, so:
  - a field of every block is pulled out in one 1-D copy through a structured dtype
    (strided 2-D slicing of (nb, 16)-byte rows costs ~10x more);
  - bit twiddling runs on whole contiguous uint8/uint64 arrays, never on short rows;
  - values are put in element order by moving 16..64-byte runs as void items;
  - f32 work is one cast into `out`, one multiply and, for types with a min, one
    subtract: the floor, as the output itself is 4 bytes per element.
No Python loop runs over blocks; big ufuncs release the GIL.
"""

from __future__ import annotations

import functools

import numpy as np

from .quant import TYPES, QuantType, row_bytes

_U8, _U64 = np.uint8, np.uint64


@functools.lru_cache(maxsize=None)
def _field_dtype(bb: int, off: int, fmt: str) -> np.dtype:
    return np.dtype({"names": ["f"], "formats": [fmt], "offsets": [off], "itemsize": bb})


def _field(raw: np.ndarray, bb: int, off: int, fmt: str) -> np.ndarray:
    """1-D strided view of the field at byte `off` of every `bb`-byte block of raw."""
    return raw.view(_field_dtype(bb, off, fmt))["f"]


def _bytes(raw: np.ndarray, bb: int, off: int, n: int) -> np.ndarray:
    """Bytes [off, off+n) of every block, as a contiguous (nb, n) uint8 copy."""
    return np.ascontiguousarray(_field(raw, bb, off, f"V{n}")).view(_U8).reshape(-1, n)


def _f16(raw: np.ndarray, bb: int, off: int) -> np.ndarray:
    """The f16 at byte `off` of every block, widened to f32, shape (nb, 1). Offsets are
    even in every layout but numpy would read them unaligned just as well."""
    return _field(raw, bb, off, "<f2").astype(np.float32)[:, None]


def _u32(raw: np.ndarray, bb: int, off: int) -> np.ndarray:
    """The little-endian u32 at byte `off` of every block (any alignment), shape (nb,)."""
    return _field(raw, bb, off, "<u4").astype("<u4")


def _splat(byte: int) -> int:
    return int.from_bytes(bytes([byte]) * 8, "little")


def _unpack(src: np.ndarray, bits: int, run: int, at: int = 0) -> np.ndarray:
    """Split packed fields into element order, the way every ggml layout packs them:
    src (nb, n) bytes is n/run runs of `run` bytes; field p (bits p*bits..) of the bytes
    of one run are `run` consecutive elements, fields in order, runs in order.
    E.g. Q4_K: run 32, bits 4 -> low nibbles of 32 bytes, then their high nibbles.
    Returns (nb, n*8/bits) uint8, each field shifted left by `at` (to OR in high bits).
    The shifting runs on uint64 words, 8 bytes at a time: NumPy's uint8 shifts are slow."""
    nb, n = src.shape
    k = 8 // bits
    words = src.view("<u8")
    mask = _U64(_splat(((1 << bits) - 1) << at))
    unit = np.dtype((np.void, run))
    out = np.empty((nb, n * k), _U8)
    slots = out.view(unit).reshape(-1, k)  # [run, field]
    plane = np.empty_like(words)
    for p in range(k):
        sh = p * bits - at
        if sh > 0:
            np.right_shift(words, _U64(sh), out=plane)
        elif sh < 0:
            np.left_shift(words, _U64(-sh), out=plane)
        else:
            plane[:] = words
        plane &= mask
        slots[:, p] = plane.view(unit).reshape(-1)
    return out


def _scale(out: np.ndarray, q: np.ndarray, dl: np.ndarray, ml: np.ndarray | None = None) -> None:
    """out (groups, g) f32 = dl * q - ml, dl and ml (groups, 1) f32, q integers of any width."""
    np.copyto(out, q, casting="unsafe")  # exact: |q| < 2^24
    out *= dl
    if ml is not None:
        out -= ml


def _scale_min_k4(raw: np.ndarray, bb: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 8 6-bit scales and 8 6-bit mins in the 12 bytes at offset 4 (ggml
    get_scale_min_k4). Sub-blocks 0-3 keep their 6 bits in bytes 0-3 (scale) and 4-7
    (min); sub-blocks 4-7 have their low nibbles in bytes 8-11 and their top 2 bits in
    the top of bytes 0-7. Done 4 bytes at a time on u32 words. Returns 2 x (nb, 8) uint8."""
    b0, b1, b2 = _u32(raw, bb, 4), _u32(raw, bb, 8), _u32(raw, bb, 12)
    sc = np.empty((len(b0), 2), "<u4")
    mn = np.empty((len(b0), 2), "<u4")
    sc[:, 0] = b0 & 0x3F3F3F3F
    sc[:, 1] = (b2 & 0x0F0F0F0F) | ((b0 >> 2) & 0x30303030)
    mn[:, 0] = b1 & 0x3F3F3F3F
    mn[:, 1] = ((b2 >> 4) & 0x0F0F0F0F) | ((b1 >> 2) & 0x30303030)
    return sc.view(_U8), mn.view(_U8)


# Each _deq_* reads raw (nb * block_bytes,) uint8 and writes out (nb, block_elems) f32.

def _deq_f32(raw, out):
    out.reshape(-1)[:] = raw.view("<f4")


def _deq_f16(raw, out):
    out.reshape(-1)[:] = raw.view("<f2")


def _deq_bf16(raw, out):
    # bf16 is the top half of an f32: widen and shift, no float arithmetic at all.
    np.left_shift(raw.view("<u2"), 16, out=out.reshape(-1).view(np.uint32), dtype=np.uint32)


def _deq_q4_0(raw, out):
    # [0:2] f16 d, [2:18] nibbles: element l low nibble of byte l, l+16 its high nibble.
    q = _unpack(_bytes(raw, 18, 2, 16), 4, 16)
    q -= 8  # wraps in uint8; read as int8 it is q - 8
    _scale(out, q.view(np.int8), _f16(raw, 18, 0))


def _deq_q4_1(raw, out):
    # [0:2] f16 d, [2:4] f16 m (added), [4:20] nibbles as Q4_0.
    _scale(out, _unpack(_bytes(raw, 20, 4, 16), 4, 16), _f16(raw, 20, 0))
    out += _f16(raw, 20, 2)  # not -= -m: that flips a NaN's sign bit


def _q5(raw, bb, qh_off):
    # qh is a little-endian u32, but at byte 22*i + 2 of a Q5_0 tensor: 2 mod 4 on every
    # even block, so never load it as one. Bit j (the 5th bit of element j) is bit j%8 of
    # byte j//8, exactly what unpackbits(bitorder="little") yields, in element order.
    q = _unpack(_bytes(raw, bb, qh_off + 4, 16), 4, 16)
    hb = np.unpackbits(_bytes(raw, bb, qh_off, 4).reshape(-1), bitorder="little")
    hb *= 16  # not <<= 4: uint8 shifts are NumPy's slow path
    q |= hb.reshape(q.shape)
    return q


def _deq_q5_0(raw, out):
    # [0:2] f16 d, [2:6] qh, [6:22] nibbles.
    q = _q5(raw, 22, 2)
    q -= 16
    _scale(out, q.view(np.int8), _f16(raw, 22, 0))


def _deq_q5_1(raw, out):
    # [0:2] f16 d, [2:4] f16 m (added), [4:8] qh, [8:24] nibbles.
    _scale(out, _q5(raw, 24, 4), _f16(raw, 24, 0))
    out += _f16(raw, 24, 2)


def _deq_q8_0(raw, out):
    _scale(out, _bytes(raw, 34, 2, 32).view(np.int8), _f16(raw, 34, 0))


def _deq_q2_k(raw, out):
    # [0:16] per 16 elements: scale (low nibble) | min (high nibble); [16:80] 2-bit q
    # (element 128h + 32j + l is bits 2j of byte 32h + l); [80:82] f16 d; [82:84] f16 dmin.
    nb = out.shape[0]
    sc = _bytes(raw, 84, 0, 16)
    q = _unpack(_bytes(raw, 84, 16, 64), 2, 32)
    dl = (_f16(raw, 84, 80) * (sc & 0x0F)).reshape(-1, 1)
    ml = (_f16(raw, 84, 82) * (sc >> 4)).reshape(-1, 1)
    _scale(out.reshape(nb * 16, 16), q.reshape(nb * 16, 16), dl, ml)


def _deq_q3_k(raw, out):
    # [0:32] hmask, [32:96] 2-bit q (as Q2_K), [96:108] 16 6-bit scales (offset 32),
    # [108:110] f16 d. Element 32s + l has bit s of hmask[l] as its 3rd bit; ggml
    # subtracts 4 where that bit is CLEAR, i.e. value = (q | hbit << 2) - 4.
    nb = out.shape[0]
    q = _unpack(_bytes(raw, 110, 32, 64), 2, 32)
    q |= _unpack(_bytes(raw, 110, 0, 32), 1, 32, at=2)
    q -= 4
    # Scale i: low nibble from byte i%8 (low half for i<8, high for i>=8), top 2 bits
    # from byte 8 + i%4 at bit 2*(i//4). ggml's kmask1/kmask2 code, on u32 words.
    a0, a1, h = _u32(raw, 110, 96), _u32(raw, 110, 100), _u32(raw, 110, 104)
    sc = np.empty((len(h), 4), "<u4")
    sc[:, 0] = (a0 & 0x0F0F0F0F) | ((h & 0x03030303) << 4)
    sc[:, 1] = (a1 & 0x0F0F0F0F) | (((h >> 2) & 0x03030303) << 4)
    sc[:, 2] = ((a0 >> 4) & 0x0F0F0F0F) | (((h >> 4) & 0x03030303) << 4)
    sc[:, 3] = ((a1 >> 4) & 0x0F0F0F0F) | (((h >> 6) & 0x03030303) << 4)
    scale = sc.view(np.int8) - np.int8(32)
    dl = (_f16(raw, 110, 108) * scale).reshape(-1, 1)
    _scale(out.reshape(nb * 16, 16), q.view(np.int8).reshape(nb * 16, 16), dl)


def _deq_k_affine(raw, bb, q, out):
    # Q4_K/Q5_K: [0:2] f16 d, [2:4] f16 dmin, [4:16] packed 6-bit scales and mins per
    # 32 elements; y = (d*sc)*q - dmin*m.
    nb = out.shape[0]
    scale, mins = _scale_min_k4(raw, bb)
    dl = (_f16(raw, bb, 0) * scale).reshape(-1, 1)
    ml = (_f16(raw, bb, 2) * mins).reshape(-1, 1)
    _scale(out.reshape(nb * 8, 32), q.reshape(nb * 8, 32), dl, ml)


def _deq_q4_k(raw, out):
    # [16:144] nibbles: 4 runs of 32 bytes, run c holding sub-block 2c (low nibbles)
    # and 2c+1 (high nibbles).
    _deq_k_affine(raw, 144, _unpack(_bytes(raw, 144, 16, 128), 4, 32), out)


def _deq_q5_k(raw, out):
    # As Q4_K, with [16:48] qh before the nibbles at [48:176]: the 5th bit of element
    # 32s + l is bit s of qh[l].
    q = _unpack(_bytes(raw, 176, 48, 128), 4, 32)
    q |= _unpack(_bytes(raw, 176, 16, 32), 1, 32, at=4)
    _deq_k_affine(raw, 176, q, out)


def _deq_q6_k(raw, out):
    # [0:128] ql, [128:192] qh, [192:208] int8 scales per 16 elements, [208:210] f16 d.
    # Element 128h + 32k + l: low 4 bits from ql[64h + 32(k%2) + l] (low nibble for
    # k < 2, high for k >= 2), i.e. runs of 64 bytes; top 2 bits are bits 2k of
    # qh[32h + l], runs of 32. Value - 32.
    nb = out.shape[0]
    q = _unpack(_bytes(raw, 210, 0, 128), 4, 64)
    q |= _unpack(_bytes(raw, 210, 128, 64), 2, 32, at=4)
    q -= 32
    dl = (_f16(raw, 210, 208) * _bytes(raw, 210, 192, 16).view(np.int8)).reshape(-1, 1)
    _scale(out.reshape(nb * 16, 16), q.view(np.int8).reshape(nb * 16, 16), dl)


# IQ4_NL/IQ4_XS nibbles index ggml's kvalues_iq4nl; MXFP4's are e2m1 values, doubled so that
# they are integers (ggml's kvalues_mxfp4; the e8m0 scale is halved to match). Both decode by a
# table lookup straight into the f32 output, then one multiply by the block's scale.
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
_IQ4NL_F32, _MXFP4_F32 = KVALUES_IQ4NL.astype(np.float32), KVALUES_MXFP4.astype(np.float32)
_BB_IQ4_NL, _BB_IQ4_XS, _BB_MXFP4 = (TYPES[n].block_bytes for n in ("IQ4_NL", "IQ4_XS", "MXFP4"))


def _lookup(out, table, idx):
    # mode="clip": the indices are nibbles, always in range, and "raise" would buffer `out`.
    np.take(table, idx.reshape(out.shape), out=out, mode="clip")


def _deq_iq4_nl(raw, out):
    # [0:2] f16 d, [2:18] nibbles as Q4_0 (element l low nibble of byte l, l+16 high); y = d * kv.
    _lookup(out, _IQ4NL_F32, _unpack(_bytes(raw, _BB_IQ4_NL, 2, 16), 4, 16))
    out *= _f16(raw, _BB_IQ4_NL, 0)


def _deq_iq4_xs(raw, out):
    # [0:2] f16 d, [2:4] u16 scales_h (2 bits per sub-block of 32), [4:8] scales_l (a nibble
    # each, sub-block 2i low, 2i+1 high), [8:136] 8 runs of 16 nibble bytes as IQ4_NL.
    # y = (d * (ls - 32)) * kv, the product d*(ls-32) in f32 first, as ggml.
    bb, nb = _BB_IQ4_XS, out.shape[0]
    lo = _bytes(raw, bb, 4, 4)
    ls = np.stack([lo & 0x0F, lo >> 4], -1).reshape(nb, 8)
    hi = _field(raw, bb, 2, "<u2").astype(np.uint16)[:, None] >> np.arange(0, 16, 2, dtype=np.uint16)
    ls |= ((hi & 3) << 4).astype(_U8)
    dl = _f16(raw, bb, 0) * (ls.view(np.int8) - np.int8(32))
    grouped = out.reshape(nb * 8, 32)
    _lookup(grouped, _IQ4NL_F32, _unpack(_bytes(raw, bb, 8, 128), 4, 16))
    grouped *= dl.reshape(-1, 1)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as f32 bits (ggml_e8m0_to_fp32_half): e < 2 are subnormals; no NaN, 255 is 2^127."""
    e = e.astype(np.uint32)
    sub = np.uint32(0x00200000) << np.minimum(e, 1)
    return np.where(e < 2, sub, (e - 1) << 23).astype(np.uint32).view(np.float32)


def _deq_mxfp4(raw, out):
    # [0] e8m0 exponent, [1:17] nibbles as Q4_0; y = kv * 2^(e - 128) (exact but for overflow).
    _lookup(out, _MXFP4_F32, _unpack(_bytes(raw, _BB_MXFP4, 1, 16), 4, 16))
    out *= _e8m0_half(_field(raw, _BB_MXFP4, 0, "u1"))[:, None]


_KERNELS = {
    "F32": _deq_f32, "F16": _deq_f16, "BF16": _deq_bf16,
    "Q4_0": _deq_q4_0, "Q4_1": _deq_q4_1, "Q5_0": _deq_q5_0, "Q5_1": _deq_q5_1, "Q8_0": _deq_q8_0,
    "Q2_K": _deq_q2_k, "Q3_K": _deq_q3_k, "Q4_K": _deq_q4_k, "Q5_K": _deq_q5_k, "Q6_K": _deq_q6_k,
    "IQ4_NL": _deq_iq4_nl, "IQ4_XS": _deq_iq4_xs, "MXFP4": _deq_mxfp4,
}


def dequantize(qt: QuantType, raw: np.ndarray, n_rows: int, row_elems: int,
               out: np.ndarray | None = None) -> np.ndarray:
    """Dequantize n_rows rows of row_elems elements from their bytes `raw` (uint8 of any
    shape, n_rows * row_bytes in all; a contiguous row slice of a tensor is free, anything
    else is copied once). Returns f32 (n_rows, row_elems); pass `out` (C-contiguous f32
    of that shape) to reuse a buffer. Thread-safe: no shared state."""
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
        flat = np.ascontiguousarray(raw).reshape(-1)
        _KERNELS[qt.name](flat, out.reshape(nb, qt.block_elems))
    return out


def dequantize_rows(qt: QuantType, raw_2d: np.ndarray, rows, out: np.ndarray | None = None) -> np.ndarray:
    """Dequantize selected rows (a slice, an index or an index array) of a tensor held
    as its (n_rows, row_bytes) uint8 view, e.g. an embedding lookup or a row block."""
    sel = raw_2d[rows]
    if sel.ndim == 1:
        sel = sel[None, :]
    row_elems = raw_2d.shape[1] // qt.block_bytes * qt.block_elems
    return dequantize(qt, sel, sel.shape[0], row_elems, out=out)
