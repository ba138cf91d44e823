"""tcgemv_glu.cu: the gate / up products and their gated activation in one launch give the bits of
tcgemv_group on both matrices then the activation kernel the backend launched before
(cuda_ops' _swiglu / _gelu), y and its f16 rounding, in one split and in each cluster size; and
act(gate) * up of an f64 reference within tcgemv's tolerance. Outputs are poisoned with NaN first,
so an element never written fails.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.backend import cuda_ops  # noqa: E402
from minferd.kernels import tcgemv, tcgemv_glu as tg  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402

TOL = 2e-3
NAMES = sorted(tg.SUPPORTED)
ACT = {"silu": cuda_ops._swiglu, "gelu": cuda_ops._gelu}


def act_ref(act: str, g, u):
    if act == "silu":
        return g / (1.0 + np.exp(-g)) * u
    return 0.5 * g * (1.0 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3))) * u


def case(name: str, N: int, nb: int, M: int, seed: int, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(seed)
    K = qt.block_elems * nb
    raws = [random_blocks(qt, N, K, rng) for _ in range(2)]
    x = rng.standard_normal((M, K)).astype(np.float32)
    return qt, raws, [to_device(r) for r in raws], x, cp.asarray(x).astype(cp.float16)


def fused(qt, wg, wu, x16, act, **kw):
    M, N = x16.shape[0], wg.shape[0]
    y, y16 = poisoned((M, N), cp.float32), poisoned((M, N), cp.float16)
    tg.glu(qt, wg, wu, x16, y, y16, act, **kw)
    return y, y16


def unfused(qt, wg, wu, x16, act, split):
    M, N = x16.shape[0], wg.shape[0]
    g, u = poisoned((M, N), cp.float32), poisoned((M, N), cp.float32)
    tcgemv.tcgemv_group(qt, [wg, wu], x16, [g, u], split=split)
    y, y16 = cp.empty((M, N), cp.float32), cp.empty((M, N), cp.float16)
    ACT[act](g, u, y, y16)
    return y, y16


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [3, 9, 16, 32])
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_glu_is_the_group_then_the_activation(name, M, act, to_device):
    """Each cluster size and one split (rows that are no multiple of a CTA's 32): the unfused path's
    bits at the same split, and the f64 reference."""
    qt, raws, (wg, wu), x, x16 = case(name, 200, 8 if qt_blocks(name) else 64, M, M + TYPES[name].ggml_id, to_device)
    ref = act_ref(act, reference(qt, raws[0], x), reference(qt, raws[1], x))
    for split in (1, 2, 4, 8):
        y, y16 = fused(qt, wg, wu, x16, act, split=split)
        want, want16 = unfused(qt, wg, wu, x16, act, split)
        assert cp.array_equal(y, want), f"{name} M={M} {act} split {split}"
        assert cp.array_equal(y16.view(cp.uint16), want16.view(cp.uint16)), f"{name} M={M} {act} split {split} f16"
        err = rel_err(y, ref)
        assert err < TOL, f"{name} M={M} {act} split {split}: rel err {err:.2e}"


def qt_blocks(name: str) -> bool:
    return TYPES[name].block_elems == 256


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_glu_at_its_own_split_count(name, to_device):
    """fused_splits' own count, at a 7B-like width (one split: ~600 CTAs fill the GPU) and a
    0.5B-like one (a cluster), against the reference."""
    sms = tcgemv.sm_count(cp.cuda.Device().id)
    for N, nb, want in ((32 * 5 * sms, 2, 1), (160, 4, None)):
        qt, raws, (wg, wu), x, x16 = case(name, N, nb * (1 if qt_blocks(name) else 8), 16, N, to_device)
        s = tg.fused_splits(qt, N, x.shape[1], 16, sms)
        assert s == want if want else s in tcgemv.CLUSTERS
        y, y16 = fused(qt, wg, wu, x16, "silu")
        assert rel_err(y, act_ref("silu", reference(qt, raws[0], x), reference(qt, raws[1], x))) < TOL
        assert cp.array_equal(y16, y.astype(cp.float16))


def test_glu_checks_arguments(to_device):
    """Refused by name before anything runs: past 32 tokens, an unknown activation, gate and up of
    different shapes, outputs of the wrong type or shape, a split count that is no cluster size."""
    qt = TYPES["Q4_K"]
    w = to_device(random_blocks(qt, 64, 256, np.random.default_rng(0)))
    w2 = to_device(random_blocks(qt, 32, 256, np.random.default_rng(1)))
    x16 = cp.zeros((16, 256), cp.float16)
    y, y16 = cp.zeros((16, 64), cp.float32), cp.zeros((16, 64), cp.float16)
    with pytest.raises(ValueError, match="33 tokens, outside 1..32"):
        tg.glu(qt, w, w, cp.zeros((33, 256), cp.float16), y, y16)
    with pytest.raises(ValueError, match="act 'relu' is not one of silu, gelu"):
        tg.glu(qt, w, w, x16, y, y16, "relu")
    with pytest.raises(ValueError, match=r"gate \(64, 144\) and up \(32, 144\) differ"):
        tg.glu(qt, w, w2, x16, y, y16)
    with pytest.raises(ValueError, match="y16 must be C-contiguous float16"):
        tg.glu(qt, w, w, x16, y, y)
    with pytest.raises(ValueError, match=r"y must be C-contiguous float32 \(16, 64\)"):
        tg.glu(qt, w, w, x16, y[:, :32], y16)
    with pytest.raises(ValueError, match="3 K splits"):
        tg.glu(qt, w, w, x16, y, y16, split=3)
    assert not cp.any(y) and not cp.any(y16)
