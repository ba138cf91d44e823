"""Random GGUF blocks: bytes in a type's layout with benign scales, fast enough to fill
multi-GB synthetic models and kernel-test matrices, and the two adjustments synth makes to them
(centre the affine types, scale a matrix's values). Byte layouts: dequant_ref.py."""
from __future__ import annotations

import math

import numpy as np

from .quant import QuantType, row_bytes

_U8 = np.uint8


# f16 fields of each type: (byte offset, may be negative). Scales (d, dmin) stay
# positive as ggml writes them; Q4_1/Q5_1's m is a signed offset. IQ4's d takes either sign
# (ggml's quantizer writes both), which also centres the asymmetric kvalues table.
_F16_FIELDS = {
    "Q4_0": ((0, False),), "Q4_1": ((0, False), (2, True)), "Q5_0": ((0, False),),
    "Q5_1": ((0, False), (2, True)), "Q8_0": ((0, False),), "Q2_K": ((80, False), (82, False)),
    "Q3_K": ((108, False),), "Q4_K": ((0, False), (2, False)), "Q5_K": ((0, False), (2, False)),
    "Q6_K": ((208, False),), "IQ4_NL": ((0, True),), "IQ4_XS": ((0, True),),
}
_F16_LO, _F16_HI = 0x1418, 0x211F  # f16 bit patterns of ~1.0e-3 and ~1.0e-2: finite, normal
# e8m0 scale bytes (byte offset per type): 2^(e - 128) in [2^-10, 2^-7], as benign as the f16 ones.
_E8M0_FIELDS = {"MXFP4": 0}
_E8M0_LO, _E8M0_HI = 118, 121
# Plain float types: keep random sign and mantissa, force the exponent into a benign
# range so there is no inf/NaN/denormal: |x| in [2^-7, 2) for F32/BF16, [2^-3, 2) for F16.
_FLOAT_MASKS = {"F32": (np.uint32, 0x83FFFFFF, 0x3C000000),
                "BF16": (np.uint16, 0x83FF, 0x3C00), "F16": (np.uint16, 0x8FFF, 0x3000)}


def random_blocks(qt: QuantType, rows: int, row_elems: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes in qt's layout with benign f16 scales (d, dmin in ~[1e-3, 1e-2]),
    random packed quants and sub-block scales: uint8 (rows, row_bytes). Fast enough to
    fill multi-GB synthetic GGUF files: raw generator words, then the few scale
    fields overwritten in place."""
    rb = row_bytes(qt, row_elems)
    n = rows * rb
    # Full-range uint64 draws are the generator's fast path (~1.5 GB/s); uint8 draws are
    # 3x slower, and bit_generator.random_raw gives only 32 bits a word on some generators.
    buf = rng.integers(0, 1 << 64, size=(n + 7) // 8, dtype=np.uint64).view(_U8)[:n]
    if qt.name in _FLOAT_MASKS:
        dt, keep, force = _FLOAT_MASKS[qt.name]
        words = buf.view(dt)
        words &= dt(keep)
        words |= dt(force)
        return buf.reshape(rows, rb)
    blocks = buf.reshape(-1, qt.block_bytes)
    for off, signed in _F16_FIELDS.get(qt.name, ()):
        field = blocks[:, off:off + 2].view("<u2")[:, 0]
        vals = rng.integers(_F16_LO, _F16_HI + 1, size=len(blocks), dtype=np.uint16)
        if signed:  # keep the random sign bit already there
            vals |= field & np.uint16(0x8000)
        field[:] = vals
    if qt.name in _E8M0_FIELDS:
        blocks[:, _E8M0_FIELDS[qt.name]] = rng.integers(_E8M0_LO, _E8M0_HI + 1, size=len(blocks), dtype=_U8)
    return buf.reshape(rows, rb)


# Affine types: value = d * scale * q - dmin * min (Q4_1/Q5_1: d * q + m) with q in [0, 2^bits).
# (f16 d offset, f16 dmin/m offset, mean of q, sub-scale layout) for center_blocks.
_AFFINE = {"Q4_1": (0, 2, 7.5, None), "Q5_1": (0, 2, 15.5, None), "Q2_K": (80, 82, 1.5, "nibbles"),
           "Q4_K": (0, 2, 7.5, "k4"), "Q5_K": (0, 2, 15.5, "k4")}


def center_blocks(qt: QuantType, raw: np.ndarray) -> None:
    """Make random_blocks' affine blocks zero-mean, as quantizing zero-mean weights leaves them:
    each sub-block's min becomes its scale and dmin = d * mean(q) (Q4_1/Q5_1: m = -d * mean(q)).
    Off-centre rows add up over K inputs; in a 28-layer 7B that alone overflows f16 activations.
    The other types are near zero-mean already (q - 8, q - 32, signed int8, MXFP4's symmetric
    e2m1 values, IQ4 blocks' random-signed d)."""
    if qt.name not in _AFFINE:
        return
    d_off, m_off, qmean, layout = _AFFINE[qt.name]
    blocks = raw.reshape(-1, qt.block_bytes)
    d = np.ascontiguousarray(blocks[:, d_off:d_off + 2]).view("<f2")[:, 0].astype(np.float32)
    m = d * np.float32(qmean) * np.float32(1 if layout else -1)
    blocks[:, m_off:m_off + 2] = m.astype("<f2").view(_U8).reshape(-1, 2)
    if layout == "nibbles":  # Q2_K: 16 bytes of scale (low nibble) | min (high nibble)
        lo = blocks[:, 0:16] & 0x0F
        blocks[:, 0:16] = lo | (lo << 4)
    elif layout == "k4":  # Q4_K/Q5_K's 12 bytes at 4: mins 0-3 (and top bits of 4-7) copy the scales'
        blocks[:, 8:12] = blocks[:, 4:8]
        lo = blocks[:, 12:16] & 0x0F
        blocks[:, 12:16] = lo | (lo << 4)


def scale_blocks(qt: QuantType, raw: np.ndarray, s: float) -> None:
    """Multiply every value the rows `raw` (uint8, qt's layout) decode to by about s, in place:
    each block's f16 scales (d, dmin, m) are scaled, so a block's values scale with them.
    random_blocks' values are O(1); a model's matrices want ~1/sqrt(K), or f16 activations overflow."""
    if qt.name in _FLOAT_MASKS:
        if qt.name == "BF16":
            f = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32) * np.float32(s)
            raw.view(np.uint16)[...] = (f.view(np.uint32) >> 16).astype(np.uint16)
        else:
            v = raw.view(np.float32 if qt.name == "F32" else np.float16)
            v *= v.dtype.type(s)
        return
    blocks = raw.reshape(-1, qt.block_bytes)
    for off, _ in _F16_FIELDS.get(qt.name, ()):
        field = np.ascontiguousarray(blocks[:, off:off + 2]).view("<f2")[:, 0]
        blocks[:, off:off + 2] = (field.astype(np.float32) * np.float32(s)).astype("<f2").view(_U8).reshape(-1, 2)
    if qt.name in _E8M0_FIELDS:
        _scale_e8m0(blocks, _E8M0_FIELDS[qt.name], s)


def _scale_e8m0(blocks: np.ndarray, off: int, s: float) -> None:
    """e8m0 scales are powers of two: each block's exponent moves by floor(log2 s) or one more,
    the share f of "one more" spread evenly over the blocks and chosen so that the mean square
    scales by s^2 ((1 - f) + 4f = s^2 / 4^floor), which is what callers matching an RMS need."""
    lo = math.floor(math.log2(s))
    f = (s * s / 4.0 ** lo - 1) / 3
    i = np.arange(len(blocks))
    up = np.floor((i + 1) * f) > np.floor(i * f)
    blocks[:, off] = np.clip(blocks[:, off].astype(np.int64) + lo + up, 0, 255).astype(_U8)
