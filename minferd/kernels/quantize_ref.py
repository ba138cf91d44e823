"""Reference quantizers (f32 -> GGUF block bytes), and the mat-vec kernels' activation format.

They exist to make test fixtures and synthetic models, not to compete with llama.cpp's
quantize: the 32-element types go through gguf.quants (which follows ggml's reference
quantizers), and the K-quants here are a vectorized simplification of ggml's
make_qkx2_quants / make_qx_quants (a small grid of candidate scales per sub-block, least
squares refit, then the sub-block scales quantized against the super-block's f16 d).
IQ4_NL and IQ4_XS (gguf.quants only decodes them) simplify quantize_row_iq4_nl_impl the
same way; MXFP4's is gguf.quants', i.e. ggml's quantize_row_mxfp4_ref.
The error is bounded (tests/unit/test_quant.py states the bounds), not minimal.

Byte layouts mirror dequant_ref.py; read that file for where each bit lives. Random blocks
(fast fills of benign bytes for performance files and kernel tests) are random_blocks.py's.
"""

from __future__ import annotations

import numpy as np

from .dequant_ref import KVALUES_IQ4NL
from .quant import QuantType, row_bytes

_U8 = np.uint8
_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=_U8).reshape(1, 1, 4, 1)
_SHIFT_1BIT = np.arange(8, dtype=_U8).reshape(1, 8, 1)


def _f16_round(v: np.ndarray) -> np.ndarray:
    """v as it will read back after storing as f16 (the dequantizer sees only that)."""
    return v.astype(np.float16).astype(np.float32)


def _put_f16(out: np.ndarray, off: int, v: np.ndarray) -> None:
    out[:, off:off + 2] = v.astype(np.float16).reshape(-1, 1).view(_U8)


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


def _affine_fit(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of x (..., n): scale >= 0 and m >= 0 with x ~ scale*q - m, q in 0..nmax.
    Tries a grid of candidate inverse scales, refits (scale, m) by least squares on each
    candidate's q, keeps the lowest squared error. As ggml, m is clamped so that 0 is
    representable (the block minimum is taken as min(x, 0))."""
    lo = np.minimum(x.min(-1, keepdims=True), 0)
    span = x.max(-1, keepdims=True) - lo
    steps = np.arange(-10, 11, dtype=np.float32) * 0.1              # ggml: nmax-1 .. nmax+1
    iscale = _safe_div(nmax + steps, span)[..., None, :]           # (..., 1, C)
    q = (x - lo)[..., :, None] * iscale                            # (..., n, C)
    np.rint(q, out=q)
    np.clip(q, 0, nmax, out=q)
    # Per-candidate sums (f64: the error below is a difference of near-equal terms).
    n = x.shape[-1]
    sq = q.sum(-2, dtype=np.float64)
    sqq = np.einsum("...nc,...nc->...c", q, q).astype(np.float64)
    sqx = np.einsum("...nc,...n->...c", q, x).astype(np.float64)
    sx = x.sum(-1, keepdims=True, dtype=np.float64)
    sxx = np.einsum("...n,...n->...", x, x)[..., None].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        det = n * sqq - sq * sq
        scale = np.where(det > 0, (n * sqx - sq * sx) / det, 0)
        off = (sx - scale * sq) / n
        # The format's min is subtracted and must be >= 0: refit scale alone where not.
        pos = off > 0
        scale = np.where(pos, np.where(sqq > 0, sqx / sqq, 0), scale)
        off = np.where(pos, 0, off)
    err = scale * scale * sqq + 2 * scale * off * sq + n * off * off - 2 * scale * sqx - 2 * off * sx + sxx
    best = err.argmin(-1)[..., None]
    return (np.take_along_axis(scale, best, -1)[..., 0].clip(0).astype(np.float32),
            -np.take_along_axis(off, best, -1)[..., 0].astype(np.float32))


def _symmetric_fit(x: np.ndarray, nmax: int, n_steps: int = 19) -> np.ndarray:
    """Per row of x (..., n): a signed scale with x ~ scale*q, q in -nmax..nmax-1 (ggml's
    make_qx_quants: the largest-magnitude value maps to -nmax, then a search nearby)."""
    amax_i = np.abs(x).argmax(-1)[..., None]
    vmax = np.take_along_axis(x, amax_i, -1)                       # signed, (..., 1)
    steps = np.arange(-(n_steps // 2), n_steps // 2 + 1, dtype=np.float32) * 0.1
    iscale = _safe_div(-(nmax + steps), vmax)[..., None, :]        # (..., 1, C)
    q = x[..., :, None] * iscale                                   # (..., n, C)
    np.rint(q, out=q)
    np.clip(q, -nmax, nmax - 1, out=q)
    sqx = np.einsum("...nc,...n->...c", q, x)
    sqq = np.einsum("...nc,...nc->...c", q, q)
    best = _safe_div(sqx * sqx, sqq).argmax(-1)[..., None]         # max explained energy
    return np.take_along_axis(_safe_div(sqx, sqq), best, -1)[..., 0]


def _quant_affine(x, sub: int, nmax: int, sbits: int):
    """Shared by Q2_K/Q4_K/Q5_K: sub-block scale/min fitted, quantized to sbits against
    f16 d/dmin, then q recomputed from the stored values. Returns (d, dmin, ls, lm, q)."""
    nb = len(x)
    xs = x.reshape(nb, -1, sub)
    scale, mins = _affine_fit(xs, nmax)
    smax = (1 << sbits) - 1
    d = _f16_round(scale.max(-1, keepdims=True) / smax)
    dmin = _f16_round(mins.max(-1, keepdims=True) / smax)
    ls = np.clip(np.rint(_safe_div(scale, d)), 0, smax)
    lm = np.clip(np.rint(_safe_div(mins, dmin)), 0, smax)
    dl, ml = d * ls, dmin * lm
    q = np.clip(np.rint(_safe_div(xs + ml[..., None], dl[..., None])), 0, nmax)
    return d[:, 0], dmin[:, 0], ls.astype(_U8), lm.astype(_U8), q.astype(_U8).reshape(nb, 256)


def _quant_symmetric(x, nmax: int, smax: int):
    """Shared by Q3_K/Q6_K: 16 sub-blocks of 16, signed scales quantized to -smax..smax-1
    against f16 d. Returns (d, ls int, q offset by +nmax as uint8)."""
    nb = len(x)
    xs = x.reshape(nb, 16, 16)
    scale = _symmetric_fit(xs, nmax)
    imax = np.abs(scale).argmax(-1)[:, None]
    d = _f16_round(np.take_along_axis(scale, imax, -1) / -smax)
    ls = np.clip(np.rint(_safe_div(scale, d)), -smax, smax - 1)
    q = np.clip(np.rint(_safe_div(xs, (d * ls)[..., None])), -nmax, nmax - 1) + nmax
    return d[:, 0], ls.astype(np.int8), q.astype(_U8).reshape(nb, 256)


def _pack_crumbs(q: np.ndarray) -> np.ndarray:
    """(nb, 256) values 0..3 -> (nb, 64) bytes: element 128h + 32j + l into bits 2j of
    byte 32h + l (Q2_K/Q3_K; dequant_ref._unpack(.., 2, 32) reads it back)."""
    nb = len(q)
    return np.bitwise_or.reduce((q.reshape(nb, 2, 4, 32) & 3) << _SHIFT_2BIT, axis=2).reshape(nb, 64)


def _pack_bitplanes(bits: np.ndarray) -> np.ndarray:
    """(nb, 8, 32) bits [s, l] -> (nb, 32) bytes with bit s of byte l."""
    return np.bitwise_or.reduce((bits & 1) << _SHIFT_1BIT, axis=1)


def _pack_nibbles(q: np.ndarray, nb: int) -> np.ndarray:
    """(nb, chunks, 2, 32) -> (nb, chunks*32): low nibble from [.., 0, :], high from [.., 1, :]."""
    return ((q[..., 0, :] & 0x0F) | (q[..., 1, :] << 4)).reshape(nb, -1)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    return np.concatenate([ls[:, :4] | ((ls[:, 4:] >> 4) << 6),
                           lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
                           (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)], axis=1)


def _q_q2_k(x, out):
    d, dmin, ls, lm, q = _quant_affine(x, 16, 3, 4)
    out[:, 0:16] = ls | (lm << 4)
    out[:, 16:80] = _pack_crumbs(q)
    _put_f16(out, 80, d)
    _put_f16(out, 82, dmin)


def _q_q3_k(x, out):
    nb = len(x)
    d, ls, q = _quant_symmetric(x, 4, 32)
    out[:, 0:32] = _pack_bitplanes(q.reshape(nb, 8, 32) >> 2)
    out[:, 32:96] = _pack_crumbs(q)
    u = (ls + 32).astype(_U8)
    high = (u >> 4).reshape(nb, 4, 4)  # [i//4, i%4] -> byte 8 + i%4, bits 2*(i//4)
    out[:, 96:104] = (u[:, 0:8] & 0x0F) | (u[:, 8:16] << 4)
    out[:, 104:108] = np.bitwise_or.reduce(high << _SHIFT_2BIT[0], axis=1)
    _put_f16(out, 108, d)


def _q_q4_k(x, out):
    nb = len(x)
    d, dmin, ls, lm, q = _quant_affine(x, 32, 15, 6)
    _put_f16(out, 0, d)
    _put_f16(out, 2, dmin)
    out[:, 4:16] = _pack_scale_min_k4(ls, lm)
    out[:, 16:144] = _pack_nibbles(q.reshape(nb, 4, 2, 32), nb)


def _q_q5_k(x, out):
    nb = len(x)
    d, dmin, ls, lm, q = _quant_affine(x, 32, 31, 6)
    _put_f16(out, 0, d)
    _put_f16(out, 2, dmin)
    out[:, 4:16] = _pack_scale_min_k4(ls, lm)
    out[:, 16:48] = _pack_bitplanes(q.reshape(nb, 8, 32) >> 4)
    out[:, 48:176] = _pack_nibbles(q.reshape(nb, 4, 2, 32), nb)


def _q_q6_k(x, out):
    nb = len(x)
    d, ls, q = _quant_symmetric(x, 32, 128)
    q5 = q.reshape(nb, 2, 2, 2, 32)  # [h, k//2, k%2, l]
    out[:, 0:128] = _pack_nibbles(q5.transpose(0, 1, 3, 2, 4), nb)
    out[:, 128:192] = np.bitwise_or.reduce(((q.reshape(nb, 2, 4, 32) >> 4) & 3) << _SHIFT_2BIT,
                                           axis=2).reshape(nb, 64)
    out[:, 192:208] = ls.view(_U8)
    _put_f16(out, 208, d)


_IQ4 = KVALUES_IQ4NL.astype(np.float32)
_IQ4_MIDS = (_IQ4[1:] + _IQ4[:-1]) / 2
# ggml's quantize_row_iq4_nl_impl tries the largest |x| at +127 and at -127 + t, |t| <= 7:
# the table is asymmetric (-127 .. 113), so the sign of the scale matters.
_IQ4_TARGETS = np.array([127.0] + [t - 127.0 for t in range(-7, 8)], np.float32)


def _iq4_index(v: np.ndarray) -> np.ndarray:
    """Index of the nearest kvalue, a tie going up (ggml's best_index_int8)."""
    return np.searchsorted(_IQ4_MIDS, v, side="right").astype(_U8)


def _iq4_fit(x: np.ndarray) -> np.ndarray:
    """Per row of x (..., 32): the signed scale d with x ~ d * kvalue, weighted by x^2 as ggml
    does without an importance matrix: each candidate's indices, then the least-squares d,
    keeping the candidate that explains the most weighted energy."""
    vmax = np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)          # signed, (..., 1)
    iscale = _safe_div(_IQ4_TARGETS, vmax)[..., None, :]                       # (..., 1, C)
    q = _IQ4[_iq4_index(x[..., :, None] * iscale)]                             # (..., 32, C)
    wq = q * (x * x)[..., :, None]
    sqx = np.einsum("...nc,...n->...c", wq, x)
    sqq = np.einsum("...nc,...nc->...c", wq, q)
    best = _safe_div(sqx * sqx, sqq).argmax(-1)[..., None]
    return np.take_along_axis(_safe_div(sqx, sqq), best, -1)[..., 0]


def _q_iq4_nl(x, out):
    nb = len(x)
    d = _f16_round(_iq4_fit(x))
    q = _iq4_index(x * _safe_div(1, d)[:, None])
    _put_f16(out, 0, d)
    out[:, 2:] = _pack_nibbles(q.reshape(nb, 1, 2, 16), nb)


def _q_iq4_xs(x, out):
    # 8 sub-block scales, quantized to 6 bits (-32..31) against the f16 d; as ggml, the
    # largest |scale| maps to -32, the end with one more step.
    nb = len(x)
    xs = x.reshape(nb, 8, 32)
    scale = _iq4_fit(xs)
    smax = np.take_along_axis(scale, np.abs(scale).argmax(-1)[:, None], -1)
    # d rounded away from zero in f16, so that smax stays within -32 steps: small weights put
    # d among f16's subnormals (~1e-6), where rounding to nearest clipped the largest scale.
    d = smax / np.float32(-32)
    d16 = d.astype(np.float16)
    short = np.abs(d16) < np.abs(d)
    d16[short] = np.nextafter(d16[short], np.copysign(np.float16(np.inf), d16[short]))
    d = d16.astype(np.float32)
    ls = np.clip(np.rint(_safe_div(scale, d)), -32, 31)
    q = _iq4_index(xs * _safe_div(1, d * ls)[..., None])
    u = (ls + 32).astype(_U8)
    _put_f16(out, 0, d)
    out[:, 2:4] = np.bitwise_or.reduce((u >> 4).astype(np.uint16) << np.arange(0, 16, 2, dtype=np.uint16),
                                       axis=1).astype("<u2").reshape(nb, 1).view(_U8)
    out[:, 4:8] = (u[:, 0::2] & 0x0F) | (u[:, 1::2] << 4)
    out[:, 8:] = _pack_nibbles(q.reshape(nb, 8, 2, 16), nb)


def _q_mxfp4(x, out):
    # gguf.quants' (ggml's quantize_row_mxfp4_ref), called a chunk at a time: it keeps a table
    # of 16 candidate errors per element.
    import gguf.quants
    from gguf.constants import GGMLQuantizationType
    out[:] = gguf.quants.quantize(x, GGMLQuantizationType.MXFP4)


# Quantizers called a chunk at a time; the other 32-element types go through gguf.quants whole.
_QUANTIZERS = {"Q2_K": _q_q2_k, "Q3_K": _q_q3_k, "Q4_K": _q_q4_k, "Q5_K": _q_q5_k, "Q6_K": _q_q6_k,
               "IQ4_NL": _q_iq4_nl, "IQ4_XS": _q_iq4_xs, "MXFP4": _q_mxfp4}
_CHUNK_ELEMS = 1 << 18  # elements per call: bounds the (blocks x candidates) temporaries


def quantize(qt: QuantType, f32_2d: np.ndarray) -> np.ndarray:
    """Quantize rows of f32 values to their GGUF bytes: uint8 (rows, row_bytes)."""
    x = np.ascontiguousarray(f32_2d, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{qt.name}: expected a 2-D array of rows, got shape {x.shape}")
    rows, n = x.shape
    rb = row_bytes(qt, n)
    if qt.name in _QUANTIZERS:
        blocks = x.reshape(-1, qt.block_elems)
        out = np.empty((len(blocks), qt.block_bytes), _U8)
        step = _CHUNK_ELEMS // qt.block_elems
        for i in range(0, len(blocks), step):
            _QUANTIZERS[qt.name](blocks[i:i + step], out[i:i + step])
        return out.reshape(rows, rb)
    import gguf.quants
    from gguf.constants import GGMLQuantizationType
    q = gguf.quants.quantize(x, GGMLQuantizationType(qt.ggml_id))
    return np.ascontiguousarray(q).view(_U8).reshape(rows, rb)


def x_block_pos(nkb: int) -> np.ndarray:
    """xlayout.cuh's xq_block_pos for every block of a row of nkb: in each whole group of 8 the
    even blocks first, then the odd ones; a last group of fewer in order."""
    kb = np.arange(nkb)
    i = kb % 8
    grouped = kb - i + np.where(i % 2 == 1, 4 + i // 2, i // 2)
    return np.where(kb - i + 8 <= nkb, grouped, kb)


def quantize_x_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The CPU twin of xquant.cuh (the mat-vec kernels' activation format): per 32 elements
    d = amax/127, hi = rint(x/d), lo = rint(254 (x - d hi) / d), both clipped to +-127, and the
    block's sum. Returns (xq int8 (n, 2, K): hi then lo planes, each block at x_block_pos's
    place; xds f32 (n, kbp, 2): (d, sum) in block order, kbp = K/32 rounded up to a multiple of 4)."""
    x = np.asarray(x, np.float32)
    n, K = x.shape
    blk = x.reshape(n, K // 32, 32)
    amax = np.abs(blk).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    safe = np.where(d == 0, np.float32(1), d)[..., None]
    hi = np.where(amax[..., None] == 0, 0, np.clip(np.rint(blk / safe), -127, 127))
    lo = np.where(amax[..., None] == 0, 0, np.clip(np.rint((blk - (hi * safe).astype(np.float32)) / safe * 254), -127, 127))
    pos = x_block_pos(K // 32)
    xq = np.zeros((n, 2, K // 32, 32), np.int8)
    xq[:, 0, pos], xq[:, 1, pos] = hi, lo
    xq = xq.reshape(n, 2, K)
    kbp = (K // 32 + 3) // 4 * 4
    xds = np.zeros((n, kbp, 2), np.float32)
    xds[:, :K // 32, 0] = d
    xds[:, :K // 32, 1] = blk.sum(-1, dtype=np.float32)
    return xq, xds, kbp
