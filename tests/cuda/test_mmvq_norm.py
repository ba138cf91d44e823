"""The rmsnorm folded into decode mat-vecs (kernels/mmvq_norm.cuh, the pending path deferred_norm):
the launch that writes x leaves quantize_x(x * w)'s very bits and each block's sum of squares,
and sets its counters back to zero; the launches that read it give the normed product within the
mat-vecs' tolerance. Bad arguments are refused before a launch."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels.mmvq import mmvq, mmvq_group, quantize_x, scratch_bytes, xq_layout  # noqa: E402
from minferd.kernels.mmvq_norm import NormIn, NormOut, ss_shape  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402

TOL = 1e-2  # test_mmvq.py's contract


def _norm_out(n: int, rows: int, counters=None) -> NormOut:
    rng = np.random.default_rng(rows)
    w = cp.asarray(rng.uniform(0.5, 1.5, rows).astype(np.float32))
    return NormOut(w, cp.zeros(scratch_bytes(n, rows), cp.uint8), poisoned(ss_shape(n, rows), cp.float32),
                   cp.zeros(4096, cp.uint32) if counters is None else counters)


# Rows that one CTA, part of one, or several CTAs' rows complete (the shape classes' configs: few,
# mid, wide, huge-ish tall), and the 0.5B's 896.
@pytest.mark.parametrize("name,rows,K", [("Q4_K", 3584, 3584), ("Q4_K", 3584, 18944), ("Q6_K", 3584, 18944),
                                         ("Q5_0", 896, 896), ("Q8_0", 896, 4864), ("Q6_K", 9216, 512),
                                         ("Q4_K", 512, 256)])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_norm_out_is_quantize_x_of_x_times_w(name, rows, K, n, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(rows + K + n)
    raw = random_blocks(qt, rows, K, rng)
    w = to_device(raw)
    a = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
    res = cp.asarray(rng.standard_normal((n, rows)).astype(np.float32))
    norm = _norm_out(n, rows)
    for _ in range(2):  # the second launch finds the counters the first set back to zero
        out = poisoned((n, rows), cp.float32)
        mmvq(qt, w, a, out, residual=res, norm_out=norm)
        plain = poisoned((n, rows), cp.float32)
        mmvq(qt, w, a, plain, residual=res)
        assert cp.array_equal(out, plain)  # the product itself is untouched
        theirs = cp.zeros(scratch_bytes(n, rows), cp.uint8)
        quantize_x(out * norm.weight, theirs)
        off, kbp, _ = xq_layout(n, rows)
        assert cp.array_equal(norm.scratch[:2 * n * rows], theirs[:2 * n * rows])
        mine_ds = norm.scratch[off:off + n * kbp * 8].view(cp.float32).reshape(n, kbp, 2)[:, :rows // 32]
        their_ds = theirs[off:off + n * kbp * 8].view(cp.float32).reshape(n, kbp, 2)[:, :rows // 32]
        assert cp.array_equal(mine_ds, their_ds)
        x = cp.asnumpy(out).astype(np.float64).reshape(n, rows // 32, 32)
        np.testing.assert_allclose(cp.asnumpy(norm.ss)[:, :rows // 32], (x * x).sum(-1), rtol=1e-5)
        assert not cp.asnumpy(norm.counters).any()


@pytest.mark.parametrize("name,K,rows", [("Q4_K", 3584, (3584, 512, 512)), ("Q4_K", 3584, (18944, 18944)),
                                         ("Q5_0", 896, (896, 128, 128)), ("Q6_K", 3584, (152064 // 16,))])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_norm_in_is_the_normed_product(name, K, rows, n, to_device):
    """x * g quantized with its block sums of squares of x (what a norm_out launch leaves) times
    q/k/v- or gate/up-like groups: rmsnorm(x) * g times each matrix, in f64, within TOL."""
    qt = TYPES[name]
    rng = np.random.default_rng(K + n + len(rows))
    x = rng.standard_normal((n, K)).astype(np.float32) * 3
    g = rng.uniform(0.5, 1.5, K).astype(np.float32)
    eps = 1e-6
    scratch = cp.zeros(scratch_bytes(n, K), cp.uint8)
    quantize_x(cp.asarray(x * g), scratch)
    ss = cp.zeros(ss_shape(n, K), cp.float32)
    ss[:, :K // 32] = cp.asarray((x.astype(np.float64).reshape(n, K // 32, 32) ** 2).sum(-1).astype(np.float32))
    h = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * g
    raws = [random_blocks(qt, r, K, rng) for r in rows]
    outs = [poisoned((n, r), cp.float32) for r in rows]
    mmvq_group(qt, [to_device(r) for r in raws], cp.asarray(x * g), outs, scratch=scratch, x_quantized=True,
               norm_in=NormIn(ss, eps))
    for raw, out in zip(raws, outs):
        assert rel_err(out, reference(qt, raw, h)) < TOL


def test_bad_norm_arguments_are_refused(to_device):
    qt = TYPES["Q4_K"]
    raw = random_blocks(qt, 96, 256, np.random.default_rng(0))
    w, a = to_device(raw), cp.ones((1, 256), cp.float32)
    out = cp.empty((1, 96), cp.float32)
    with pytest.raises(ValueError, match="one matrix of whole 32-row blocks"):
        mmvq_group(qt, [w, w], a, [out, cp.empty((1, 96), cp.float32)], norm_out=_norm_out(1, 96))
    with pytest.raises(ValueError, match="one matrix of whole 32-row blocks"):
        mmvq(qt, w[:80], a, cp.empty((1, 80), cp.float32), norm_out=_norm_out(1, 80))
    with pytest.raises(ValueError, match="counters must be contiguous uint32 of >= 3"):
        mmvq(qt, w, a, out, norm_out=_norm_out(1, 96, counters=cp.zeros(2, cp.uint32)))
    with pytest.raises(ValueError, match="block sums must be C-contiguous float32"):
        mmvq(qt, w, a, out, norm_in=NormIn(cp.zeros((1, 3), cp.float32), 1e-6))
    with pytest.raises(ValueError, match="eps must be in"):
        mmvq(qt, w, a, out, norm_in=NormIn(cp.zeros(ss_shape(1, 256), cp.float32), 0.0))
    with pytest.raises(ValueError, match="folded norm is for quantized weights"):
        mmvq(TYPES["F32"], cp.zeros((96, 1024), cp.uint8), a, out, norm_in=NormIn(cp.zeros(ss_shape(1, 256), cp.float32), 1e-6))
