"""tcgemv.cu against an f64 reference: out = x @ dequant(W).T (+ bias) (+ residual) within 2e-3
relative (||out - ref|| / ||ref||: x and the decoded weights are f16, as the W16 path's cuBLAS
reads them; the reference takes x as given, in f32), for each type, every token tile (M 1, 9, 16, 17, 33, 64), row counts that are no
multiple of the 16/32-row tile, tensors starting one block in, K split and not, and the 7B's
decode shapes. Outputs are poisoned with NaN first, so an element never written fails.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import tcgemv as tc  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.conftest import matmul_reference as reference, poisoned, rel_err  # noqa: E402

TOL = 2e-3
NAMES = sorted(tc.SUPPORTED)


def run(qt, w, x_h, bias=None, res=None, **kw):
    out = poisoned((x_h.shape[0], w.shape[0]), cp.float32)
    tc.tcgemv(qt, w, cp.asarray(x_h).astype(cp.float16), out, bias=bias, residual=res, **kw)
    return out


def blocks(qt, n: int) -> int:
    return qt.block_elems * n


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [1, 9, 16, 17, 33, 64])
def test_matches_reference(name, M, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id * 100 + M)
    K = blocks(qt, 7 if qt.block_elems == 256 else 45)
    raw = random_blocks(qt, 72, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    for offset, sl in ((0, slice(0, 71)), (qt.block_bytes, slice(1, 72))):
        w = to_device(raw, offset)[sl]
        err = rel_err(run(qt, w, x), reference(qt, raw[sl], x))
        assert err < TOL, f"{name} M={M} offset={offset}: rel err {err:.2e}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", [True, False])
def test_bias_residual_and_splits(name, split, to_device, monkeypatch):
    qt = TYPES[name]
    if not split:
        monkeypatch.setitem(tc.CONFIGS, tc.CONFIG, tc.CONFIGS[tc.CONFIG][:3] + (0,) + tc.CONFIGS[tc.CONFIG][4:])  # aim at 0 CTAs an SM: no split
    rng = np.random.default_rng(9 + qt.ggml_id)
    M, N, K = 24, 200, blocks(qt, 24)
    assert (tc.splits(qt, N, K // qt.block_elems, M, tc.sm_count(cp.cuda.Device().id)) > 1) == split
    raw = random_blocks(qt, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    err = rel_err(run(qt, to_device(raw), x, cp.asarray(bias), cp.asarray(res)), reference(qt, raw, x) + bias + res)
    assert err < TOL, f"{name} split={split}: rel err {err:.2e}"


@pytest.mark.parametrize("name,N,K", [("Q4_K", 3584, 3584), ("Q4_K", 18944, 3584), ("Q6_K", 3584, 18944),
                                       ("Q6_K", 152064, 3584), ("Q8_0", 512, 3584)])
@pytest.mark.parametrize("M", [16, 64])
def test_7b_decode_shapes(name, N, K, M, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(N + K + M)
    raw = random_blocks(qt, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    err = rel_err(run(qt, to_device(raw), x), reference(qt, raw, x))
    assert err < TOL, f"{name} {N}x{K} M={M}: rel err {err:.2e}"


def test_deterministic_with_callers_buffers(to_device):
    qt = TYPES["Q4_K"]
    rng = np.random.default_rng(2)
    M, N, K = 40, 700, 4096
    raw = random_blocks(qt, N, K, rng)
    w = to_device(raw)
    x = cp.asarray(rng.standard_normal((M, K)).astype(np.float32))
    part = cp.empty(max(tc.part_bytes(M, N, K, qt, tc.sm_count(cp.cuda.Device().id)), 4) // 4, cp.float32)
    x16 = x.astype(cp.float16)
    stream = cp.cuda.Stream(non_blocking=True)
    outs = []
    for _ in range(2):
        out = poisoned((M, N), cp.float32)
        before = cp.get_default_memory_pool().used_bytes()
        tc.tcgemv(qt, w, x16, out, part=part, stream=stream)
        assert cp.get_default_memory_pool().used_bytes() == before
        stream.synchronize()
        outs.append(out.get())
    assert np.array_equal(outs[0], outs[1])
    assert rel_err(cp.asarray(outs[0]), reference(qt, raw, x.get())) < TOL


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [16, 32])
def test_cluster_splits_equal_the_split_sum(name, M, to_device):
    """A cluster's splits add in the split sum's order: where both split K 8 ways, the same bits,
    bias and residual included; and a split left empty by the cluster's size adds nothing. (At
    64 tokens the partials' 16 MB cap cuts base's splits of this shape to 6.)"""
    qt = TYPES[name]
    sms = tc.sm_count(cp.cuda.Device().id)
    rows = tc.rows_per_cta(M, qt, "cl")
    assert rows == tc.rows_per_cta(M, qt, "base")
    N, nb = rows * -(-sms // 2), 16 if qt.block_elems == 256 else 128
    assert tc.splits(qt, N, nb, M, sms, "base") == tc.splits(qt, N, nb, M, sms, "cl") == 8
    rng = np.random.default_rng(M + qt.ggml_id)
    K = qt.block_elems * nb
    raw = random_blocks(qt, N, K, rng)
    w = to_device(raw)
    x = rng.standard_normal((M, K)).astype(np.float32)
    bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
    res = cp.asarray(rng.standard_normal((M, N)).astype(np.float32))
    base, cl = (run(qt, w, x, bias, res, config=c) for c in ("base", "cl"))
    assert cp.array_equal(base, cl)
    # 14 blocks in 8 splits of 2: the eighth is empty
    K = qt.block_elems * 14
    raw = random_blocks(qt, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    assert tc.splits(qt, N, 14, M, sms, "cl") == 8
    err = rel_err(run(qt, to_device(raw), x, config="cl"), reference(qt, raw, x))
    assert err < TOL, f"{name} M={M} 14 blocks in 8 splits: rel err {err:.2e}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [9, 16, 32])
@pytest.mark.parametrize("split", [None, 1, 2, 8])
def test_tcgemv_group_is_one_launch_each(name, M, split, to_device):
    """Three matrices of one type and K in one launch (q/k/v: rows that are no multiple of the
    row tile, a bias on two) give each matrix's bits alone at the same K splits, and the
    reference's products at the splits the group's row tiles get."""
    qt = TYPES[name]
    rng = np.random.default_rng(M + qt.ggml_id + (split or 0))
    K = blocks(qt, 9 if qt.block_elems == 256 else 72)
    Ns = (200, 40, 72)
    raws = [random_blocks(qt, N, K, rng) for N in Ns]
    ws = [to_device(r) for r in raws]
    x = rng.standard_normal((M, K)).astype(np.float32)
    x16 = cp.asarray(x).astype(cp.float16)
    biases = [cp.asarray(rng.standard_normal(N).astype(np.float32)) if i != 1 else None for i, N in enumerate(Ns)]
    outs = [poisoned((M, N), cp.float32) for N in Ns]
    tc.tcgemv_group(qt, ws, x16, outs, biases=biases, split=split)
    for i, (raw, w, b) in enumerate(zip(raws, ws, biases)):
        ref = reference(qt, raw, x) + (0 if b is None else cp.asnumpy(b))
        err = rel_err(outs[i], ref)
        assert err < TOL, f"{name} M={M} matrix {i}: rel err {err:.2e}"
        if split is not None:
            alone = poisoned((M, Ns[i]), cp.float32)
            tc.tcgemv(qt, w, x16, alone, bias=b, split=split)
            assert cp.array_equal(alone, outs[i]), f"{name} M={M} matrix {i} at {split} splits"


def test_tcgemv_group_checks_arguments(to_device):
    """A group takes no residual and no partials: past 32 tokens (splits in global partials) it is
    refused by name before anything runs; so are mismatched outputs."""
    qt = TYPES["Q4_K"]
    w = to_device(random_blocks(qt, 64, 256, np.random.default_rng(0)))
    out = cp.zeros((16, 64), cp.float32)
    with pytest.raises(ValueError, match="no residual or partials"):
        tc.tcgemv_group(qt, [w, w], cp.zeros((16, 256), cp.float16), [out, out], residual=out)
    with pytest.raises(ValueError, match="not at 64 tokens"):
        tc.tcgemv_group(qt, [w, w], cp.zeros((64, 256), cp.float16), [cp.zeros((64, 64), cp.float32)] * 2)
    with pytest.raises(ValueError, match="one output and one bias slot each"):
        tc.tcgemv_group(qt, [w, w], cp.zeros((16, 256), cp.float16), [out])
    with pytest.raises(ValueError, match="1..3 matrices"):
        tc.tcgemv_group(qt, [w] * 4, cp.zeros((16, 256), cp.float16), [out] * 4)


def test_checks_arguments(to_device):
    qt = TYPES["Q4_K"]
    w = to_device(random_blocks(qt, 64, 256, np.random.default_rng(0)))
    x16 = cp.zeros((16, 256), cp.float16)
    with pytest.raises(ValueError, match="out must be"):
        tc.tcgemv(qt, w, x16, cp.zeros((16, 63), cp.float32))
    unsupported = next(t for t in sorted(TYPES) if t not in tc.SUPPORTED)
    with pytest.raises(ValueError, match="not supported"):
        tc.tcgemv(TYPES[unsupported], w, x16, cp.zeros((16, 64), cp.float32))
    with pytest.raises(ValueError, match="outside"):
        tc.tcgemv(qt, w, cp.zeros((65, 256), cp.float16), cp.zeros((65, 64), cp.float32))
    with pytest.raises(ValueError, match="x16 must be"):
        tc.tcgemv(qt, w, cp.zeros((16, 256), cp.float32), cp.zeros((16, 64), cp.float32))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", sorted(tc.CONFIGS))
@pytest.mark.parametrize("M", [16, 40, 64])
def test_every_config(name, config, M, to_device):
    """Each config bench/mmq_small.py times (more warps a CTA, two blocks a warp in flight) gives
    the reference's products, K split and over a partial row tile."""
    qt = TYPES[name]
    rng = np.random.default_rng(M + 7 * len(config))
    K = blocks(qt, 9 if qt.block_elems == 256 else 72)
    raw = random_blocks(qt, 90, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    err = rel_err(run(qt, to_device(raw), x, config=config), reference(qt, raw, x))
    assert err < TOL, f"{name} {config} M={M}: rel err {err:.2e}"


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
def test_any_split_count(name, to_device):
    """The K splits a caller names (bench/tc_splits.py sweeps them) give the reference's products
    from one split to one a block, through partials and through clusters; a count the launch
    cannot take is refused by name before anything runs."""
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id)
    nb = 9 if qt.block_elems == 256 else 72
    K = blocks(qt, nb)
    raw = random_blocks(qt, 90, K, rng)
    w, x = to_device(raw), rng.standard_normal((16, K)).astype(np.float32)
    ref = reference(qt, raw, x)
    for config, counts in (("base", (1, 2, 5, nb)), ("cl", (1, 2, 4, 8))):
        for s in counts:
            err = rel_err(run(qt, w, x, config=config, split=s), ref)
            assert err < TOL, f"{name} {config} {s} splits: rel err {err:.2e}"
    for config, s in (("base", 0), ("base", nb + 1), ("cl", 3)):
        with pytest.raises(ValueError, match=f"{s} K splits for {nb} blocks"):
            run(qt, w, x, config=config, split=s)


@pytest.mark.parametrize("M", [16, 32])
def test_an_sm_holds_the_ctas_splits_aims_at(M):
    """splits() sizes the grid for CONFIGS[config][3] CTAs an SM; the 16- and 32-token kernels of
    the types a dense model's big matrices use must fit that many (registers grow with a decoder
    change, and the grid would then run in more waves than it was sized for)."""
    for name in ("Q4_K", "Q6_K", "Q8_0"):
        held = tc.ctas_per_sm(TYPES[name], M)
        assert held >= tc.CONFIGS[tc.CONFIG][3], f"{name} M={M}: an SM holds {held} CTAs"
