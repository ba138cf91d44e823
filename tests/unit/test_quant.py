"""Block layouts (kernels/quant.py), the NumPy dequantizers and the reference quantizers.

gguf.quants is the independent implementation every layout is checked against: our
dequantizer must agree with it bit for bit, and so must the bytes our quantizers write
(a pack/unpack pair that is wrong in the same way on both sides would otherwise pass).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
import gguf.quants

from minferd.kernels.dequant_ref import dequantize, dequantize_rows
from minferd.kernels.quant import SUPPORTED_NAMES, TYPES, by_id, by_name, row_bytes, tensor_bytes
from minferd.kernels.quantize_ref import quantize
from minferd.kernels.random_blocks import center_blocks, random_blocks, scale_blocks

ALL = list(SUPPORTED_NAMES)
QUANTIZED = [n for n in ALL if TYPES[n].is_quantized]
ROW = 18944  # 592 blocks of 32, 74 super-blocks of 256: a real FFN width (Qwen2.5-7B)

# Relative RMS error of quantize -> dequantize on N(0, 1) rows. Measured (16 x 4096):
# F16 0.0002, BF16 0.0017, Q8_0 0.0054, Q6_K 0.0173, Q5_K 0.036, Q5_1 0.038, Q5_0 0.043,
# Q4_K 0.071, Q4_1 0.078, Q4_0 0.086, Q3_K 0.144, Q2_K 0.270, IQ4_NL 0.076, IQ4_XS 0.077,
# MXFP4 0.115 (power-of-two scales; values past 1.5 x 2^floor(log2 amax) saturate).
RT_BOUND = {"F32": 0.0, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 0.01, "Q6_K": 0.02,
            "Q5_0": 0.05, "Q5_1": 0.05, "Q5_K": 0.05, "Q4_0": 0.1, "Q4_1": 0.1, "Q4_K": 0.1,
            "Q3_K": 0.2, "Q2_K": 0.33, "IQ4_NL": 0.09, "IQ4_XS": 0.09, "MXFP4": 0.13}


def gguf_dequant(name, raw):
    return gguf.quants.dequantize(raw, GGMLQuantizationType[name])


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---- the table ---------------------------------------------------------------------------

def test_table_agrees_with_gguf():
    assert SUPPORTED_NAMES == ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                               "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4")
    for name, qt in TYPES.items():
        gt = GGMLQuantizationType[name]
        assert qt.ggml_id == int(gt)
        assert (qt.block_elems, qt.block_bytes) == GGML_QUANT_SIZES[gt]
        assert by_id(int(gt)) is qt and by_name(name.lower()) is qt
        assert qt.is_quantized == (qt.block_elems > 1)


@pytest.mark.parametrize("bad", [int(GGMLQuantizationType.IQ3_S), 9, 999])
def test_by_id_unsupported_names_id_and_supported_set(bad):
    with pytest.raises(KeyError) as e:
        by_id(bad)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert str(bad) in msg and "Q4_K" in msg and "BF16" in msg
    if bad == int(GGMLQuantizationType.IQ3_S):
        assert "IQ3_S" in msg


def test_row_and_tensor_bytes():
    q4k, q8, f16 = TYPES["Q4_K"], TYPES["Q8_0"], TYPES["F16"]
    assert row_bytes(q4k, 2048) == 8 * 144
    assert row_bytes(q8, 0) == 0
    assert tensor_bytes(q8, (64, 3, 2)) == 2 * 34 * 6
    assert tensor_bytes(f16, (640, 262144)) == 640 * 262144 * 2
    assert tensor_bytes(q4k, (2048, 640)) == 640 * 8 * 144  # GGUF order: ne0 is the row
    with pytest.raises(ValueError, match="Q4_K.*640"):
        row_bytes(q4k, 640)
    with pytest.raises(ValueError):
        tensor_bytes(q4k, (640, 2048))
    with pytest.raises(ValueError):
        row_bytes(q8, 33)
    with pytest.raises(ValueError):
        row_bytes(q8, -32)


# ---- dequantize == gguf.quants.dequantize ---------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_dequant_bit_equal_to_gguf(name):
    qt, rng = TYPES[name], np.random.default_rng(1)
    raw = random_blocks(qt, 3, ROW, rng)
    got = dequantize(qt, raw, 3, ROW)
    assert got.shape == (3, ROW) and got.dtype == np.float32
    assert np.isfinite(got).all()
    assert np.array_equal(bits(got), bits(gguf_dequant(name, raw)))  # signed zeros too


@pytest.mark.parametrize("name", QUANTIZED)
def test_dequant_equal_to_gguf_on_arbitrary_bytes(name):
    """Every bit pattern, NaN/inf scales included, decodes the same (NaN where gguf's is)."""
    qt, rng = TYPES[name], np.random.default_rng(2)
    raw = rng.integers(0, 256, (2, row_bytes(qt, ROW)), dtype=np.uint8)
    with np.errstate(all="ignore"):
        got, want = dequantize(qt, raw, 2, ROW), gguf_dequant(name, raw)
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("name", QUANTIZED)
def test_single_blocks_at_odd_and_even_indices(name):
    """A block decodes alone, from a slice at any byte offset: Q5_0's 22-byte blocks put
    qh at byte 22*i + 2, which is 2 mod 4 on every even block (the seeds' u32-load bug)."""
    qt, rng = TYPES[name], np.random.default_rng(3)
    raw = random_blocks(qt, 1, ROW, rng)[0]
    full = dequantize(qt, raw, 1, ROW)[0]
    nblocks = ROW // qt.block_elems
    bb, be = qt.block_bytes, qt.block_elems
    for i in (0, 1, 2, 3, nblocks - 2, nblocks - 1):
        one = raw[i * bb:(i + 1) * bb]
        assert np.array_equal(bits(dequantize(qt, one, 1, be)[0]), bits(full[i * be:(i + 1) * be])), i
    # a run of blocks starting at an odd block, and the same from a fresh unaligned copy
    run = raw[3 * bb:11 * bb]
    unaligned = np.empty(run.size + 1, np.uint8)[1:]
    unaligned[:] = run
    for src in (run, unaligned):
        assert np.array_equal(bits(dequantize(qt, src, 1, 8 * be)[0]), bits(full[3 * be:11 * be]))


def test_dequantize_rows_out_and_errors():
    qt, rng = TYPES["Q4_K"], np.random.default_rng(4)
    raw = random_blocks(qt, 10, 512, rng)
    full = dequantize(qt, raw, 10, 512)
    assert np.array_equal(dequantize_rows(qt, raw, slice(3, 7)), full[3:7])
    ids = np.array([9, 0, 0, 4])
    assert np.array_equal(dequantize_rows(qt, raw, ids), full[ids])
    assert np.array_equal(dequantize_rows(qt, raw, 5), full[5:6])
    out = np.full((10, 512), np.nan, np.float32)
    assert dequantize(qt, raw, 10, 512, out=out) is out and np.array_equal(out, full)
    with pytest.raises(ValueError):
        dequantize(qt, raw, 10, 512, out=np.empty((512, 10), np.float32))
    with pytest.raises(ValueError):
        dequantize(qt, raw[:9], 10, 512)
    with pytest.raises(ValueError):
        dequantize(qt, raw, 10, 500)
    with pytest.raises(TypeError):
        dequantize(qt, raw.view(np.int8), 10, 512)
    assert dequantize(qt, raw[:0], 0, 512).shape == (0, 512)


# ---- quantize -> dequantize ----------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_round_trip_error_bounded(name):
    qt, rng = TYPES[name], np.random.default_rng(5)
    x = rng.standard_normal((16, 4096)).astype(np.float32)
    raw = quantize(qt, x)
    assert raw.dtype == np.uint8 and raw.shape == (16, row_bytes(qt, 4096))
    y = dequantize(qt, raw, 16, 4096)
    assert np.array_equal(bits(y), bits(gguf_dequant(name, raw)))  # our bytes, their decoder
    rel = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2)))
    assert rel <= RT_BOUND[name], f"{name}: relative RMS error {rel:.4f}"
    # the error is relative: scaled data keeps the bound (no f16 scale over/underflow here)
    for s in (1e-3, 300.0):
        xs = x[:2] * s
        ys = dequantize(qt, quantize(qt, xs), 2, 4096)
        assert np.sqrt(np.mean((ys - xs) ** 2) / np.mean(xs ** 2)) <= 1.1 * RT_BOUND[name] + 1e-6


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantize_degenerate_blocks(name):
    """All-zero, constant, one-spike and one-sign blocks quantize to finite values."""
    qt = TYPES[name]
    n = qt.block_elems * 2
    x = np.zeros((4, n), np.float32)
    x[1] = 0.5
    x[2, 7] = -3.0
    x[3] = np.abs(np.random.default_rng(6).standard_normal(n)) + 1.0
    y = dequantize(qt, quantize(qt, x), 4, n)
    assert np.isfinite(y).all()
    assert np.array_equal(y[0], np.zeros(n))
    assert np.abs(y[2, 7] + 3.0) < 0.35 and np.abs(np.delete(y[2], 7)).max() < 0.35


# ---- random blocks ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_random_blocks_benign_and_deterministic(name):
    qt = TYPES[name]
    a = random_blocks(qt, 4, ROW, np.random.default_rng(7))
    assert a.dtype == np.uint8 and a.shape == (4, row_bytes(qt, ROW))
    assert np.array_equal(a, random_blocks(qt, 4, ROW, np.random.default_rng(7)))
    y = dequantize(qt, a, 4, ROW)
    assert np.isfinite(y).all() and np.abs(y).max() < 64
    assert np.unique(a).size > 200  # the quants are random, not a fill pattern


@pytest.mark.parametrize("name", ALL)
def test_centred_scaled_blocks_look_like_a_model_matrix(name):
    """What synth writes for --random-blocks: rows near zero-mean (an off-centre row adds up over
    K inputs) and values of the asked-for size, so a deep random model stays inside f16's range."""
    qt = TYPES[name]
    a = random_blocks(qt, 16, ROW, np.random.default_rng(3))
    center_blocks(qt, a)
    y0 = dequantize(qt, a, 16, ROW).astype(np.float64)
    rms0 = np.sqrt(np.mean(y0 ** 2))
    assert np.abs(y0.mean(1)).mean() < 0.1 * rms0
    scale_blocks(qt, a, 0.01 / rms0)
    y = dequantize(qt, a, 16, ROW).astype(np.float64)
    assert np.sqrt(np.mean(y ** 2)) == pytest.approx(0.01, rel=0.05)
    assert np.abs(y.mean(1)).mean() < 0.1 * 0.01
