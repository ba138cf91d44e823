"""dequant.cu against gguf.quants.dequantize, bit for bit, for every type.

f16 outputs must equal gguf's f32 values cast to f16 (compared as uint16 bits); f32 outputs
of dequant_rows must equal gguf's f32 bits. Blocks are random with benign scales (no NaN or
inf, so bits compare cleanly). Shapes cover both block parities (Q5_0's 22-byte blocks are
misaligned for a u32 on every even block), rows of many blocks, and the real 7B shapes:
small shapes passing proves nothing about grid and offset arithmetic at 150k rows.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
gguf_quants = pytest.importorskip("gguf.quants")
from gguf.constants import GGMLQuantizationType  # noqa: E402

from minferd.kernels.dequant import dequant_f16, dequant_rows  # noqa: E402
from minferd.kernels.quant import CUDA_TYPES, TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402

NAMES = CUDA_TYPES


def gguf_f32(qt, raw: np.ndarray) -> np.ndarray:
    rows = raw.shape[0]
    return gguf_quants.dequantize(np.ascontiguousarray(raw).reshape(-1),
                                  GGMLQuantizationType(qt.ggml_id)).reshape(rows, -1).astype(np.float32)


def assert_f16_bits(out, ref_f32: np.ndarray, what: str) -> None:
    got = cp.asnumpy(out).view(np.uint16)
    want = ref_f32.astype(np.float16).view(np.uint16)
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{what}: {len(bad)} of {want.size} f16 elements differ, first at {bad[0].tolist()}: "
                           f"got {got[tuple(bad[0])]:#06x} want {want[tuple(bad[0])]:#06x}")


def odd_k(qt, blocks: int) -> int:
    """A row length of an odd number of blocks, so consecutive rows start on alternating
    block parity (float types: a length that is not a multiple of 8 either)."""
    return qt.block_elems * blocks if qt.is_quantized else 37


@pytest.mark.parametrize("name", NAMES)
def test_dequant_f16_every_block_parity(name, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id)
    K = odd_k(qt, 7)
    raw = random_blocks(qt, 9, K, rng)
    ref = gguf_f32(qt, raw)
    for offset in (0, qt.block_bytes):  # the tensor itself starting on an even / odd block
        w = to_device(raw, offset)
        out = cp.full((9, K), np.nan, cp.float16)
        dequant_f16(qt, w, out)
        assert_f16_bits(out, ref, f"{name} offset {offset}")
        # a row slice starting at row 1 (odd block), and row0 into it
        out = cp.full((8, K), np.nan, cp.float16)
        dequant_f16(qt, w[1:], out)
        assert_f16_bits(out, ref[1:], f"{name} w[1:]")
        out = cp.full((5, K), np.nan, cp.float16)
        dequant_f16(qt, w, out, row0=3)
        assert_f16_bits(out, ref[3:8], f"{name} row0=3")


@pytest.mark.parametrize("name", NAMES)
def test_dequant_f16_long_rows(name, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(100 + qt.ggml_id)
    K = 14336 if qt.is_quantized else 4104  # 448 / 56 blocks; a float row not a multiple of 16 B
    raw = random_blocks(qt, 12, K, rng)
    out = cp.full((12, K), np.nan, cp.float16)
    dequant_f16(qt, to_device(raw), out)
    assert_f16_bits(out, gguf_f32(qt, raw), f"{name} K={K}")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dequant_rows_gather(name, dtype, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(200 + qt.ggml_id)
    rows, K = 33, odd_k(qt, 5)
    raw = random_blocks(qt, rows, K, rng)
    ref = gguf_f32(qt, raw)
    ids_h = np.array([0, rows - 1, 1, 2, 7, 7, 16, 31, 3], np.int32)
    out = cp.full((len(ids_h), K), np.nan, dtype)
    dequant_rows(qt, to_device(raw), cp.asarray(ids_h), out)
    if dtype == np.float16:
        assert_f16_bits(out, ref[ids_h], f"{name} rows f16")
    else:
        got = cp.asnumpy(out)
        assert (got.view(np.uint32) == ref[ids_h].view(np.uint32)).all(), f"{name} rows f32 differ"


def test_dequant_rows_out_of_range_is_nan(to_device):
    qt = TYPES["Q4_K"]
    raw = random_blocks(qt, 4, 256, np.random.default_rng(3))
    out = cp.zeros((3, 256), cp.float32)
    dequant_rows(qt, to_device(raw), cp.asarray(np.array([1, 4, -1], np.int32)), out)
    got = cp.asnumpy(out)
    assert np.isfinite(got[0]).all() and np.isnan(got[1:]).all()


def test_dequant_rows_is_graph_capture_safe(to_device):
    """Captured once, replayed with other ids written into the same buffer: the kernel reads
    ids on the device (no host read, no allocation, no sync inside)."""
    qt = TYPES["Q6_K"]
    rng = np.random.default_rng(5)
    raw = random_blocks(qt, 50, 512, rng)
    ref = gguf_f32(qt, raw)
    w = to_device(raw)
    ids = cp.asarray(np.array([3, 4], np.int32))
    out = cp.full((2, 512), np.nan, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        dequant_rows(qt, w, ids, out)  # compile and load the kernel outside the capture
        stream.synchronize()
        stream.begin_capture()
        dequant_rows(qt, w, ids, out)
        graph = stream.end_capture()
        for want in ([3, 4], [49, 0]):
            ids.set(np.array(want, np.int32))
            out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            assert (cp.asnumpy(out).view(np.uint32) == ref[want].view(np.uint32)).all()


def test_dequant_rejects_bad_arguments(to_device):
    qt = TYPES["Q5_0"]
    raw = random_blocks(qt, 4, 64, np.random.default_rng(1))
    w = to_device(raw)
    with pytest.raises(ValueError):
        dequant_f16(qt, w, cp.empty((4, 64), cp.float32))      # not f16
    with pytest.raises(ValueError):
        dequant_f16(qt, w, cp.empty((4, 96), cp.float16))      # K does not match row bytes
    with pytest.raises(ValueError):
        dequant_f16(qt, w, cp.empty((3, 64), cp.float16), row0=2)  # past the last row
    with pytest.raises(ValueError):
        dequant_f16(qt, to_device(raw, 1)[:, :], cp.empty((4, 64), cp.float16))  # odd address
    with pytest.raises(ValueError):
        dequant_rows(qt, w, cp.zeros(2, cp.int64), cp.empty((2, 64), cp.float32))


# ---- the real shapes (Qwen2.5-7B): grid and 64-bit offset arithmetic at full size ----------

REAL = [
    ("Q4_K", 18944, 3584),   # ffn_gate / ffn_up
    ("Q6_K", 3584, 18944),   # ffn_down in the Q6_K layers
    ("Q5_0", 3584, 3584),
    ("Q8_0", 512, 3584),     # attn_k / attn_v
    ("Q4_K", 3584, 18944),
]


@pytest.mark.parametrize("name,rows,K", REAL)
def test_dequant_f16_real_shapes(name, rows, K, to_device):
    qt = TYPES[name]
    raw = random_blocks(qt, rows, K, np.random.default_rng(rows + K))
    out = cp.full((rows, K), np.nan, cp.float16)
    dequant_f16(qt, to_device(raw), out)
    assert_f16_bits(out, gguf_f32(qt, raw), f"{name} {rows}x{K}")


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_dequant_rows_real_embedding(name, to_device):
    """token_embd / output of 152064 x 3584: gather rows across the whole table (offsets past
    2^31 bytes for wide types) and compare them with gguf on those rows."""
    qt = TYPES[name]
    rows, K = 152064, 3584
    raw = random_blocks(qt, rows, K, np.random.default_rng(7))
    rng = np.random.default_rng(8)
    ids_h = np.concatenate([[0, 1, rows - 2, rows - 1], rng.integers(0, rows, 60)]).astype(np.int32)
    w = to_device(raw)
    ref = gguf_f32(qt, raw[ids_h])
    for dtype in (np.float32, np.float16):
        out = cp.full((len(ids_h), K), np.nan, dtype)
        dequant_rows(qt, w, cp.asarray(ids_h), out)
        if dtype == np.float16:
            assert_f16_bits(out, ref, f"{name} embedding f16")
        else:
            assert (cp.asnumpy(out).view(np.uint32) == ref.view(np.uint32)).all(), f"{name} embedding f32"
