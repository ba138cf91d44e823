"""The CUDA decoders and mat-vec units, compiled for the host (tests/host/kernels_host.cpp):
blocks.cuh's decoders equal gguf.quants.dequantize bit for bit for all 16 types (the 13 the CUDA
kernels run, and IQ4_NL, IQ4_XS, MXFP4, whose decoders wait for their kernels), at odd and
even block indices, with every load at its natural alignment (the shim reports a misaligned
one, return code 2); mmvq.cu's
per-unit integer products, fed x in xquant.cuh's format (quantize_x_ref), land within 1e-4 of
f64. No GPU: the same source the device compiles, built by g++ (skipped where there is none)."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType

from minferd.kernels import DIR
from minferd.kernels.dequant_ref import dequantize
from minferd.kernels.mmvq import WIDE_UNITS
from minferd.kernels.quant import CUDA_TYPES, TYPES, row_bytes
from minferd.kernels.quantize_ref import quantize_x_ref, x_block_pos
from minferd.kernels.random_blocks import random_blocks
from minferd.kernels.tcgemv import SUPPORTED as _TC_SUPPORTED


def tcgemv_types():
    return _TC_SUPPORTED

SHIM = Path(__file__).resolve().parents[1] / "host" / "kernels_host.cpp"
P = ctypes.c_void_p


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    so = tmp_path_factory.mktemp("host") / "kernels_host.so"
    # Fuse a*b+c into FMAs as nvcc does on the device (where this CPU can): see kernels_host.cpp.
    fma = ["-mfma", "-ffp-contract=fast"] if " fma " in Path("/proc/cpuinfo").read_text() else []
    r = subprocess.run(["g++", "-O1", "-std=c++17", "-shared", "-fPIC", *fma, f"-I{DIR}", str(SHIM), "-o", str(so)],
                       capture_output=True, text=True, preexec_fn=lambda: os.nice(19))  # beside latency-checked tests
    assert r.returncode == 0, r.stderr[-4000:]
    return ctypes.CDLL(str(so))


def aligned(nbytes: int) -> np.ndarray:
    """A 256-aligned host buffer, as CuPy allocations are."""
    buf = np.zeros(nbytes + 512, np.uint8)
    a = (-buf.ctypes.data) % 256
    return buf[a:a + nbytes]


def placed(raw: np.ndarray, start_row: int, rows: int) -> np.ndarray:
    """Rows start_row.. of raw, inside a 256-aligned copy of all of raw (row 1 of rows with an
    odd block count starts at an odd block)."""
    buf = aligned(raw.nbytes)
    buf[:] = raw.reshape(-1)
    rb = raw.shape[1]
    return buf[start_row * rb:(start_row + rows) * rb]


@pytest.mark.parametrize("name", CUDA_TYPES)
def test_decoders_equal_gguf_bit_for_bit(lib, name):
    qt, rng = TYPES[name], np.random.default_rng(TYPES[name].ggml_id)
    shapes = ((3, qt.block_elems * 3), (4, 512)) if qt.is_quantized else ((3, 40), (4, 24))
    for rows, K in shapes:
        raw = random_blocks(qt, rows + 1, K, rng)
        for start in (0, 1):
            out = np.full((rows, K), np.nan, np.float32)
            assert lib.dec(qt.ggml_id, P(placed(raw, start, rows).ctypes.data), rows, K, P(out.ctypes.data)) == 0
            ref = gguf.quants.dequantize(raw[start:start + rows].reshape(-1), GGMLQuantizationType(qt.ggml_id))
            assert np.array_equal(out.view(np.uint32), ref.reshape(rows, K).astype(np.float32).view(np.uint32)), \
                (name, rows, K, start)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's own inf * 0 and NaN arithmetic
@pytest.mark.parametrize("name", CUDA_TYPES)
def test_fused_b_decoders_equal_gguf_bit_for_bit(lib, name):
    """gemm_f16_decoders.cuh's SDec (FUSED_B's decode of staged blocks, blocks.cuh's dec8 restated
    with its own loads and exact int -> float rewrites) against gguf: the same bits, NaN where gguf
    has NaN, on random blocks and (for the table types) raw random bytes."""
    qt, rng = TYPES[name], np.random.default_rng(200 + TYPES[name].ggml_id)
    shapes = ((3, qt.block_elems * 3), (4, 512)) if qt.is_quantized else ((3, 40), (4, 24))
    for rows, K in shapes:
        raws = [random_blocks(qt, rows + 1, K, rng)]
        if name in ("IQ4_NL", "IQ4_XS", "MXFP4"):
            raws.append(rng.integers(0, 256, (rows + 1, row_bytes(qt, K)), dtype=np.uint8))
        for raw in raws:
            for start in (0, 1):
                out = np.full((rows, K), 7.0, np.float32)
                assert lib.sdec(qt.ggml_id, P(placed(raw, start, rows).ctypes.data), rows, K, P(out.ctypes.data)) == 0
                ref = gguf.quants.dequantize(raw[start:start + rows].reshape(-1), GGMLQuantizationType(qt.ggml_id))
                ref = ref.reshape(rows, K).astype(np.float32)
                nan = np.isnan(ref)
                assert np.array_equal(np.isnan(out), nan), (name, rows, K, start)
                assert np.array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32)), (name, rows, K, start)


# (type, the unit's kernel id): every quantized type's unit, and the variants behind ids of their own
# (mmvq.WIDE_UNITS: UQ6_K16 behind T_Q6_K_U16).
UNITS = [(n, TYPES[n].ggml_id) for n in CUDA_TYPES if TYPES[n].is_quantized] + list(WIDE_UNITS.items())


def test_x_blocks_sit_where_xlayout_puts_them():
    """Each whole group of 8 x blocks evens first, a last group of fewer in order: a permutation,
    and quantize_x_ref writes block kb's values there."""
    assert x_block_pos(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert x_block_pos(28)[24:].tolist() == [24, 25, 26, 27] and sorted(x_block_pos(28)) == list(range(28))
    x = np.random.default_rng(1).standard_normal((2, 896)).astype(np.float32)
    xq, xds, _ = quantize_x_ref(x)
    blocks = xq.reshape(2, 2, 28, 32)
    for kb, pos in enumerate(x_block_pos(28)):  # each block's hi values, at its place, times its d
        assert (np.abs(blocks[:, 0, pos] * xds[:, kb, :1] - x[:, 32 * kb:32 * kb + 32]) <= xds[:, kb, :1] * 0.5001).all()


@pytest.mark.parametrize("name,unit", UNITS)
def test_mmvq_units_match_f64(lib, name, unit):
    qt, rng = TYPES[name], np.random.default_rng(100 + TYPES[name].ggml_id)
    # 768: whole groups of 8 x blocks (xlayout.cuh); 896 (the 0.5B's width): 3 whole and a last of 4
    shapes = ((5, 768), (3, qt.block_elems * 3)) + (((2, 896),) if qt.block_elems == 32 else ())
    for rows, K in shapes:
        raw = random_blocks(qt, rows + 1, K, rng)
        assert raw.shape[1] == row_bytes(qt, K)
        for start in (0, 1):
            n = 3
            x = rng.standard_normal((n, K)).astype(np.float32)
            xq, xds, kbp = quantize_x_ref(x)
            xq_b, xds_b = aligned(xq.nbytes), aligned(xds.nbytes)
            xq_b[:] = xq.view(np.uint8).reshape(-1)
            xds_b[:] = xds.view(np.uint8).reshape(-1)
            out = np.full((n, rows), np.nan, np.float32)
            assert lib.mv(unit, P(placed(raw, start, rows).ctypes.data), rows, K, P(xq_b.ctypes.data),
                          P(xds_b.ctypes.data), kbp, n, P(out.ctypes.data)) == 0
            ref = x.astype(np.float64) @ dequantize(qt, raw[start:start + rows], rows, K).astype(np.float64).T
            err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            assert err < 1e-4, (name, rows, K, start, err)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf's own inf * 0 and NaN arithmetic
@pytest.mark.parametrize("name", ("IQ4_NL", "IQ4_XS", "MXFP4"))
def test_new_decoders_on_every_byte_pattern(lib, name):
    """Raw random bytes, so every e8m0 exponent (0 and 1 are MXFP4's subnormal scales) and every
    f16 scale (subnormal, inf, NaN) occurs; NaN where gguf has NaN, else the same bits."""
    qt = TYPES[name]
    rows, K = 64, qt.block_elems * 4
    raw = np.random.default_rng(qt.ggml_id).integers(0, 256, (rows + 1, row_bytes(qt, K)), dtype=np.uint8)
    raw[0, 0] = 0  # MXFP4's exponent 0 and 1 at least once each
    raw[1, 0] = 1
    for start in (0, 1):
        out = np.full((rows, K), 7.0, np.float32)
        assert lib.dec(qt.ggml_id, P(placed(raw, start, rows).ctypes.data), rows, K, P(out.ctypes.data)) == 0
        ref = gguf.quants.dequantize(raw[start:start + rows].reshape(-1), GGMLQuantizationType(qt.ggml_id))
        ref = ref.reshape(rows, K).astype(np.float32)
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(out), nan), name
        assert np.array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32)), (name, start)


@pytest.mark.parametrize("name", sorted(tcgemv_types()))
@pytest.mark.parametrize("M", (1, 9, 17))
def test_tcgemv_fragments_match_f64(lib, name, M):
    """tcgemv.cu's decode into f16 mma fragments (TcW's fetch, frag and xoff) and its B loads
    (x_frag, over the f16 x the backend passes), assembled as mma.sync m16n8k16 reads them:
    x @ dequant(W).T within the f16 rounding of x and of the weights, at odd and even blocks,
    every load at its alignment."""
    qt, rng = TYPES[name], np.random.default_rng(200 + TYPES[name].ggml_id + M)
    rows, K = 19, qt.block_elems * (3 if qt.block_elems == 256 else 9)
    raw = random_blocks(qt, rows + 1, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    x16 = aligned(M * K * 2)
    x16[:] = x.astype(np.float16).view(np.uint8).reshape(-1)
    for start in (0, 1):
        out = np.full((M, rows), np.nan, np.float32)
        assert lib.tc(qt.ggml_id, P(placed(raw, start, rows).ctypes.data), rows, K, P(x16.ctypes.data), M,
                      P(out.ctypes.data)) == 0
        ref = x.astype(np.float64) @ dequantize(qt, raw[start:start + rows], rows, K).astype(np.float64).T
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < 2e-3, (name, M, start, err)
