"""mmvq.cu against an f64 reference: out = x @ dequant(W).T within 1e-2 relative
(||out - ref|| / ||ref||), for every type, batch n in {1, 2, 4, 8}, both block parities,
and the real 7B shapes. Outputs are poisoned with NaN first, so a row never written fails.

The reference dequantizes with dequant_ref.py (bit-equal to gguf; test_dequant_kernels.py
holds the device decoders to that) and multiplies in f64.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import mmvq as mv  # noqa: E402
from minferd.kernels.mmvq import mmvq, quantize_x, scratch_bytes  # noqa: E402
from minferd.kernels.quant import CUDA_TYPES, TYPES  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402

TOL = 1e-2  # the contract; the two-plane x of mmvq.cu lands near 1e-5 on these data
NAMES = CUDA_TYPES


def run(qt, w, x_h: np.ndarray, **kw):
    out = poisoned((x_h.shape[0], w.shape[0]), cp.float32)
    mmvq(qt, w, cp.asarray(x_h), out, **kw)
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_mmvq_small(name, n, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id * 10 + n)
    # 67 rows: not a multiple of any CTA's rows; K: an odd number of blocks (float: K % 8 != 0)
    K = qt.block_elems * 7 if qt.is_quantized else 40 + 5
    raw = random_blocks(qt, 68, K, rng)
    x = rng.standard_normal((n, K)).astype(np.float32)
    # first block even; odd (row 1 of 7-block rows); odd (the tensor itself one block in)
    for offset, sl in ((0, slice(0, 67)), (0, slice(1, 68)), (qt.block_bytes, slice(0, 67))):
        w = to_device(raw, offset)[sl]
        err = rel_err(run(qt, w, x), reference(qt, raw[sl], x))
        assert err < TOL, f"{name} n={n} offset={offset}: rel err {err:.2e}"


@pytest.mark.parametrize("name", NAMES)
def test_mmvq_long_rows(name, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(50 + qt.ggml_id)
    K = 14336 if qt.is_quantized else 4096  # float: the 16-byte vector path
    raw = random_blocks(qt, 40, K, rng)
    w = to_device(raw)
    for n in (1, 8):
        x = rng.standard_normal((n, K)).astype(np.float32)
        err = rel_err(run(qt, w, x), reference(qt, raw, x))
        assert err < TOL, f"{name} n={n} K={K}: rel err {err:.2e}"


@pytest.mark.parametrize("name", sorted(mv.WIDE_UNITS))
@pytest.mark.parametrize("rows,K", [(67, 256 * 7), (512, 3584), (3584, 3584), (3584, 18944), (18944, 3584)])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_wide_unit_is_the_reference(name, rows, K, n, to_device):
    """The type's wide unit (Q6_K's 16 positions) in each shape class's config, the tensor at an
    even and at an odd block (every block's alignment flips), against the f64 reference and within
    1e-5 of the default unit: the same products summed in another order."""
    qt = TYPES[name]
    rng = np.random.default_rng(rows + K + n)
    raw = random_blocks(qt, rows, K, rng)
    x = rng.standard_normal((n, K)).astype(np.float32)
    ref = reference(qt, raw, x)
    for offset in (0, qt.block_bytes):
        w = to_device(raw, offset)
        got, base = run(qt, w, x, wide=True), run(qt, w, x)
        assert rel_err(got, ref) < TOL, f"{name} {rows}x{K} n={n} offset={offset}"
        assert rel_err(got, cp.asnumpy(base).astype(np.float64)) < 1e-5, f"{name} {rows}x{K} n={n} offset={offset}"


def test_wide_unit_only_where_a_type_has_one(to_device):
    qt = TYPES["Q5_K"]
    raw = random_blocks(qt, 8, 256, np.random.default_rng(0))
    with pytest.raises(ValueError, match="no wide unit for Q5_K"):
        run(qt, to_device(raw), np.ones((1, 256), np.float32), wide=True)


@pytest.mark.parametrize("name", sorted(mv.FLOAT_TYPES))
@pytest.mark.parametrize("rows,K", [(128, 2048), (32, 2880), (7, 64), (256, 1000), (257, 512), (9, 60)])
@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_float_split_k_is_the_reference(name, rows, K, n, to_device):
    """mmv_float with K split over FLOAT_SPLIT_KW warps a row (split_k: an MoE router's few rows;
    257 rows and K = 60, not 8-aligned, take one warp a row instead) against the f64 reference, bias and
    residual in its epilogue, every row written: the path an MoE's router takes."""
    qt = TYPES[name]
    rng = np.random.default_rng(rows + K + n)
    raw = random_blocks(qt, rows, K, rng)
    w = to_device(raw)
    x = rng.standard_normal((n, K)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32)
    got = run(qt, w, x, split_k=True, bias=cp.asarray(bias), residual=cp.asarray(res))
    want = reference(qt, raw, x) + bias + res
    assert rel_err(got, want) < 1e-4, f"{name} {rows}x{K} n={n}"


@pytest.mark.parametrize("name", [n for n in NAMES if TYPES[n].is_quantized])
def test_mmvq_every_config(name, to_device):
    """Every kernel variant the sweep may pick as a default, at a shape that leaves partial
    row groups and units past the row's end (37 rows of 19 blocks: two whole groups of x's
    stored order, xlayout.cuh, which the walking variants permute, and a partial one), starting
    on an odd block."""
    qt = TYPES[name]
    mv.add_sweep()
    rng = np.random.default_rng(70 + qt.ggml_id)
    K = qt.block_elems * 19
    raw = random_blocks(qt, 38, K, rng)
    w = to_device(raw)[1:]  # starts at block 19
    for n, variants in ((1, mv.SWEEP), (8, mv.SWEEP_N)):
        x = rng.standard_normal((n, K)).astype(np.float32)
        ref = reference(qt, raw[1:], x)
        for cfg in variants:
            err = rel_err(run(qt, w, x, config=cfg), ref)
            assert err < TOL, f"{name} n={n} config {cfg}: rel err {err:.2e}"


def test_mmvq_scratch_reuse_and_capture(to_device):
    """A preallocated scratch makes the launch allocation-free: capture x's quantization and
    two products sharing it (x_quantized) in a graph, change x in place, replay."""
    qt = TYPES["Q4_K"]
    rng = np.random.default_rng(9)
    K, n = 1024, 2
    raw_a, raw_b = random_blocks(qt, 96, K, rng), random_blocks(qt, 32, K, rng)
    wa, wb = to_device(raw_a), to_device(raw_b)
    x = cp.zeros((n, K), cp.float32)
    scratch = cp.empty(scratch_bytes(n, K), cp.uint8)
    oa = cp.full((n, 96), np.nan, cp.float32)
    ob = cp.full((n, 32), np.nan, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        mmvq(qt, wa, x, oa, scratch=scratch)  # compile and load the kernels outside the capture
        stream.synchronize()
        stream.begin_capture()
        quantize_x(x, scratch)
        mmvq(qt, wa, x, oa, scratch=scratch, x_quantized=True)
        mmvq(qt, wb, x, ob, scratch=scratch, x_quantized=True)
        graph = stream.end_capture()
        for _ in range(2):
            x_h = rng.standard_normal((n, K)).astype(np.float32)
            x.set(x_h)
            oa.fill(np.nan)
            ob.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            assert rel_err(oa, reference(qt, raw_a, x_h)) < TOL
            assert rel_err(ob, reference(qt, raw_b, x_h)) < TOL


def test_mmvq_rejects_bad_arguments(to_device):
    qt = TYPES["Q8_0"]
    raw = random_blocks(qt, 8, 64, np.random.default_rng(2))
    w = to_device(raw)
    x = cp.zeros((1, 64), cp.float32)
    with pytest.raises(ValueError):
        mmvq(qt, w, cp.zeros((9, 64), cp.float32), cp.empty((9, 8), cp.float32))  # n > 8
    with pytest.raises(ValueError):
        mmvq(qt, w, x, cp.empty((1, 7), cp.float32))                              # out shape
    with pytest.raises(ValueError):
        mmvq(qt, w, cp.zeros((1, 96), cp.float32), cp.empty((1, 8), cp.float32))  # K vs row bytes
    with pytest.raises(ValueError):
        mmvq(qt, w, x, cp.empty((1, 8), cp.float32), scratch=cp.empty(16, cp.uint8))


# ---- the real shapes (Qwen2.5-7B) -----------------------------------------------------------

SHAPES = [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944), (152064, 3584)]
REAL_TYPES = ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0"]  # Q4_0: its walk (mmvq_rows' XW) at the tall / huge shapes
CHECK_ROWS = 4096  # rows of the 152064-row output checked against the reference


@pytest.mark.parametrize("name", REAL_TYPES)
@pytest.mark.parametrize("rows,K", SHAPES)
def test_mmvq_real_shapes(name, rows, K, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(rows * 7 + K)
    raw = random_blocks(qt, rows, K, rng)
    w = to_device(raw)
    # the whole output is written and must be finite; the reference covers a sample of rows
    sel = np.unique(np.concatenate([[0, rows - 1], rng.integers(0, rows, CHECK_ROWS)])) if rows > CHECK_ROWS \
        else np.arange(rows)
    for n in (1, 2, 8):  # 2: mmvq.CONFIGS' own two-column shapes
        x = rng.standard_normal((n, K)).astype(np.float32)
        out = run(qt, w, x)
        assert bool(cp.isfinite(out).all()), f"{name} {rows}x{K} n={n}: non-finite output"
        ref = reference(qt, raw[sel], x)
        err = rel_err(out[:, cp.asarray(sel)], ref)
        assert err < TOL, f"{name} {rows}x{K} n={n}: rel err {err:.2e}"
