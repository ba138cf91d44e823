"""backend/cuda_moe.py (MINFERD_DEVICE_MOE=1) against its references: moe.topk against
backend/moe.py's route, mmvq_ids against each pick's expert multiplied on its own in f64,
fused_b_grouped against fused_b on each tile's expert alone (bit for bit), and tiny qwen3moe /
qwen2moe models against the CPU backend: decode steps (qwen3moe's through a captured graph) and
teacher-forced prefills through the grouped GEMMs."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.backend.moe import route  # noqa: E402
from minferd.kernels import moe as moe_kernels  # noqa: E402
from minferd.kernels.gemm_f16 import CONFIGS, GROUPED_CONFIG, fused_b, fused_b_grouped  # noqa: E402
from minferd.kernels.mmvq import quantize_x, scratch_bytes  # noqa: E402
from minferd.kernels.mmvq_ids import mmvq_ids  # noqa: E402
from minferd.kernels.quant import CUDA_TYPES, TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.conftest import MOE_TYPES  # noqa: E402
from tests.cuda.conftest import matmul_reference, poisoned, rel_err  # noqa: E402
from tests.cuda.test_backend import PATH_KERNELS, teacher_forced  # noqa: E402
from tests.cuda.test_moe_cuda import decode_step_on_both  # noqa: E402


@pytest.mark.parametrize("warp", [False, True], ids=["block", "warp"])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("n,E,k", [(1, 128, 8), (5, 60, 4), (8, 8, 2), (3, 1000, 32), (9, 256, 32), (2, 32, 4)])
def test_topk_is_route(n, E, k, norm, warp):
    """moe_topk (a CTA a token) and moe_topk_warp (a warp a token, E <= 256; warp=True past that
    takes the CTA kernel): route's experts in descending logits and its weights."""
    rng = np.random.default_rng(E + k)
    logits = rng.standard_normal((n, E)).astype(np.float32) * 3
    logits[0, 1] = logits[0, E - 1] = logits[0].max() + 1  # a tie at the top: the lower id first
    ids, wts = moe_kernels.topk(cp.asarray(logits), k, norm, warp=warp)
    ids, wts = cp.asnumpy(ids).reshape(n, k), cp.asnumpy(wts).reshape(n, k)
    assert list(ids[0][:2]) == [1, E - 1]
    top, p = route(logits, k, norm)
    for t in range(n):
        assert sorted(ids[t]) == sorted(top[t])
        assert list(ids[t]) == sorted(ids[t], key=lambda e: -logits[t, e])  # descending logits
        np.testing.assert_allclose(wts[t][np.argsort(ids[t])], p[t][np.argsort(top[t])], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("warp", [False, True], ids=["block", "warp"])
def test_topk_picks_distinct_experts_past_the_finite_logits(warp):
    """A row with fewer finite logits than k: the rest come from the -inf ones, each once (a taken
    expert marked -inf tied with them and was taken again)."""
    logits = np.full((2, 16), -np.inf, np.float32)
    logits[0, [3, 9]] = (1.0, 2.0)
    ids, wts = moe_kernels.topk(cp.asarray(logits), 4, True, warp=warp)
    ids, wts = cp.asnumpy(ids).reshape(2, 4), cp.asnumpy(wts).reshape(2, 4)
    assert list(ids[0][:2]) == [9, 3] and len(set(ids[0])) == 4 and len(set(ids[1])) == 4
    np.testing.assert_allclose(wts[0], [1 / (1 + np.exp(-1)), np.exp(-1) / (1 + np.exp(-1)), 0, 0], rtol=1e-6)


@pytest.mark.parametrize("n,E,k,bm", [(1, 8, 2, 64), (65, 128, 8, 64), (2048, 128, 8, 64), (300, 32, 4, 16),
                                      (700, 1000, 3, 64), (3000, 4, 4, 64)])
def test_align_is_the_hosts_align(n, E, k, bm):
    """moe.align (moe_count, moe_place) against backend/moe.py's align padded to the same rows, bit
    for bit: the stable order within each expert, padding rows, tiles past the layout."""
    from minferd.backend.moe import align
    rng = np.random.default_rng(n + E)
    top = np.stack([rng.choice(E, k, replace=False) for _ in range(n)]).astype(np.int32)
    if E > 8 and n > 1:  # half the tokens on the first 8 experts: tiles of many rows beside sparse ones
        top[: n // 2] = np.stack([rng.choice(8, k, replace=False) for _ in range(n // 2)])
    rows, tiles, picks = (cp.asnumpy(a) for a in moe_kernels.align(cp.asarray(top.ravel()), E, k, bm))
    want = align(top, E, bm, moe_kernels.layout_rows(n * k, E, bm))
    for got, ref, what in zip((rows, tiles, picks), want, ("rows", "tile_expert", "pick_row")):
        assert np.array_equal(got, ref), what


def test_topk_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="top 9 of 8 experts"):
        moe_kernels.topk(cp.zeros((1, 8), cp.float32), 9)
    with pytest.raises(ValueError, match="top 2 of 2000 experts"):
        moe_kernels.topk(cp.zeros((1, 2000), cp.float32), 2)


@pytest.mark.parametrize("name", CUDA_TYPES)
@pytest.mark.parametrize("xdiv", [1, 4])
def test_mmvq_ids_is_each_picks_own_product(name, xdiv, to_device):
    """Every pick's output row is its expert's rows times its x row, as a lone matmul makes it
    (67 rows an expert: not a multiple of any CTA's rows; outputs poisoned first)."""
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id + 100 * xdiv)
    E, R = 6, 67
    K = qt.block_elems * 5 if qt.is_quantized else 64
    raw = random_blocks(qt, E * R, K, rng)
    P = 8
    n = -(-P // xdiv)
    x = rng.standard_normal((n, K)).astype(np.float32)
    ids_h = rng.integers(0, E, P).astype(np.int32)
    xd, w = cp.asarray(x), to_device(raw)
    scratch = None
    if qt.is_quantized:
        scratch = cp.empty(scratch_bytes(n, K), cp.uint8)
        quantize_x(xd, scratch)
    out = poisoned((P, R), cp.float32)
    mmvq_ids(qt, w, E, xd, cp.asarray(ids_h), xdiv, out, scratch=scratch)
    for p in range(P):
        e = int(ids_h[p])
        ref = matmul_reference(qt, raw[e * R:(e + 1) * R], x[p // xdiv:p // xdiv + 1])
        err = rel_err(out[p:p + 1], ref)
        assert err < 1e-2, f"{name} pick {p} (expert {e}): rel err {err:.2e}"


def two_stacks(qt, seed: int, to_device, E: int = 6, R: int = 67, P: int = 8, k: int = 4):
    """Two stacked expert tensors of qt, x for P // k tokens (quantized where qt is) and P picks."""
    rng = np.random.default_rng(qt.ggml_id + seed)
    K = qt.block_elems * 5 if qt.is_quantized else 64
    w, w2 = (to_device(random_blocks(qt, E * R, K, rng)) for _ in range(2))
    xd = cp.asarray(rng.standard_normal((P // k, K)).astype(np.float32))
    ids = cp.asarray(rng.integers(0, E, P).astype(np.int32))
    scratch = None
    if qt.is_quantized:
        scratch = cp.empty(scratch_bytes(P // k, K), cp.uint8)
        quantize_x(xd, scratch)
    return w, w2, xd, ids, scratch, rng


@pytest.mark.parametrize("name", CUDA_TYPES)
def test_mmvq_ids_pairs_gate_and_up(name, to_device):
    """Two stacked tensors in one launch (w2 into out2, blockIdx.z) equal each one launched alone,
    bit for bit."""
    qt, E, R, P, k = TYPES[name], 6, 67, 8, 4
    w, w2, xd, ids, scratch, _ = two_stacks(qt, 7, to_device, E, R, P, k)
    out, out2, one, two = (poisoned((P, R), cp.float32) for _ in range(4))
    mmvq_ids(qt, w, E, xd, ids, k, out, scratch=scratch, w2=w2, out2=out2)
    mmvq_ids(qt, w, E, xd, ids, k, one, scratch=scratch)
    mmvq_ids(qt, w2, E, xd, ids, k, two, scratch=scratch)
    assert cp.array_equal(out, one) and cp.array_equal(out2, two)


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "MXFP4", "F16", "F32"])
def test_mmvq_ids_adds_each_picks_expert_bias(name, to_device):
    """bias (bias2): each pick's expert row of the f32 (n_expert, rows) biases, added in the
    epilogue: bit for bit the product then one f32 add (what _biased did), alone and paired."""
    qt, E, R, P, k = TYPES[name], 5, 67, 8, 4
    w, w2, xd, ids, scratch, rng = two_stacks(qt, 11, to_device, E, R, P, k)
    b, b2 = (cp.asarray(rng.standard_normal((E, R)).astype(np.float32)) for _ in range(2))
    plain, plain2, one, out, out2 = (poisoned((P, R), cp.float32) for _ in range(5))
    mmvq_ids(qt, w, E, xd, ids, k, plain, scratch=scratch)
    mmvq_ids(qt, w2, E, xd, ids, k, plain2, scratch=scratch)
    mmvq_ids(qt, w, E, xd, ids, k, one, scratch=scratch, bias=b)
    mmvq_ids(qt, w, E, xd, ids, k, out, scratch=scratch, w2=w2, out2=out2, bias=b, bias2=b2)
    assert cp.array_equal(one, plain + b[ids]) and cp.array_equal(out, one)
    assert cp.array_equal(out2, plain2 + b2[ids])


def test_mmvq_ids_refuses_a_mismatch():
    qt = TYPES["Q8_0"]
    w = cp.zeros((6 * 4, qt.block_bytes), cp.uint8)
    x = cp.zeros((2, 32), cp.float32)
    with pytest.raises(ValueError, match="not 5 experts"):
        mmvq_ids(qt, w, 5, x, cp.zeros(2, cp.int32), 1, cp.zeros((2, 4), cp.float32))
    with pytest.raises(ValueError, match="xdiv 1 for 2 rows"):
        mmvq_ids(qt, w, 6, x, cp.zeros(3, cp.int32), 1, cp.zeros((3, 4), cp.float32))
    with pytest.raises(ValueError, match="bias must be C-contiguous float32"):
        mmvq_ids(qt, w, 6, x, cp.zeros(2, cp.int32), 1, cp.zeros((2, 4), cp.float32), bias=cp.zeros((4, 6), cp.float32))
    with pytest.raises(ValueError, match="w2 and out2 come together"):
        mmvq_ids(qt, w, 6, x, cp.zeros(2, cp.int32), 1, cp.zeros((2, 4), cp.float32), w2=w[:12], out2=cp.zeros((2, 4), cp.float32))


@pytest.mark.parametrize("path", ["w16", "mmq"])
@pytest.mark.parametrize("quant", MOE_TYPES)
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_a_decode_step_routed_on_the_device_matches_cpu(synth_model, arch, quant, path, monkeypatch):
    """Five sequences' decode step: each row's logits the CPU backend's; qwen3moe's step a captured
    graph (no host round trip), qwen2moe's eager (its shared expert's gate goes through cuBLAS)."""
    monkeypatch.setenv("MINFERD_DEVICE_MOE", "1")
    cpu, gpu, again, be = decode_step_on_both(str(synth_model(arch, quant)), path, seed=11)
    assert np.array_equal(gpu, again)  # the same step again: the same keys, the same logits
    assert all(g.eager == (arch == "qwen2moe") for g in be.graphs.values())
    bound = 0.1 if quant == "q4_k" and path != "w16" else 2e-2  # test_moe_cuda.py's router near-ties
    assert np.abs(gpu - cpu).max() <= bound * np.abs(cpu).max()
    assert (gpu.argmax(1) == cpu.argmax(1)).mean() >= 0.8


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "MXFP4", "F16"])
def test_fused_b_grouped_is_fused_b_on_each_tiles_expert(name, to_device):
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id)
    E, R, bm = 5, 96, CONFIGS[GROUPED_CONFIG][0]
    K = qt.block_elems * 2 if qt.is_quantized else 128
    raw = random_blocks(qt, E * R, K, rng)
    w = to_device(raw)
    tiles = np.array([3, 0, 0, 4, 1, 3, -1, -1], np.int32)  # -1: past the layout, skipped
    x16 = cp.asarray(rng.standard_normal((tiles.size * bm, K)).astype(np.float16))
    out = poisoned((tiles.size * bm, R), cp.float32)
    before = out.copy()
    fused_b_grouped(qt, w, E, x16, cp.asarray(tiles), out)
    for t, e in enumerate(tiles):
        if e < 0:
            assert cp.array_equal(out[t * bm:(t + 1) * bm], before[t * bm:(t + 1) * bm], equal_nan=True)
            continue
        want = cp.empty((bm, R), cp.float32)
        fused_b(qt, w[e * R:(e + 1) * R], cp.ascontiguousarray(x16[t * bm:(t + 1) * bm]), want, config=GROUPED_CONFIG)
        assert cp.array_equal(out[t * bm:(t + 1) * bm], want), f"{name} tile {t} (expert {e})"


@pytest.mark.parametrize("name", ["Q8_0", "MXFP4", "Q4_K"])
def test_fused_b_grouped_adds_each_tiles_expert_bias(name, to_device):
    """bias (n_expert, R) f32: each tile's expert's row added in the epilogue, bit for bit the
    product then one f32 add (what cuda_moe's _biased does after it for other bias types); skipped
    tiles untouched."""
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id + 7)
    E, R, bm = 4, 100, CONFIGS[GROUPED_CONFIG][0]  # 100 columns: a partial column tile
    K = qt.block_elems * 3
    w = to_device(random_blocks(qt, E * R, K, rng))
    tiles = np.array([2, 0, 3, -1], np.int32)
    x16 = cp.asarray(rng.standard_normal((tiles.size * bm, K)).astype(np.float16))
    bias = cp.asarray(rng.standard_normal((E, R)).astype(np.float32))
    plain, biased = poisoned((tiles.size * bm, R), cp.float32), poisoned((tiles.size * bm, R), cp.float32)
    fused_b_grouped(qt, w, E, x16, cp.asarray(tiles), plain)
    fused_b_grouped(qt, w, E, x16, cp.asarray(tiles), biased, bias=bias)
    for t, e in enumerate(tiles):
        rows = slice(t * bm, (t + 1) * bm)
        if e < 0:
            assert cp.isnan(biased[rows]).all(), "a skipped tile was written"
            continue
        assert cp.array_equal(biased[rows], plain[rows] + bias[e]), f"{name} tile {t} (expert {e})"
    with pytest.raises(ValueError, match="bias must be C-contiguous float32"):
        fused_b_grouped(qt, w, E, x16, cp.asarray(tiles), biased, bias=bias[:, :50])


def test_a_grouped_gpt_oss_prefill_with_biases_in_the_gemm_is_the_same(synth_model, monkeypatch):
    """A tiny gpt-oss's 64-token prefill through the grouped GEMMs, expert biases in their epilogue
    (F32 biases) and gathered and added after (the path other bias types take): every position's
    logits bit for bit."""
    from minferd.backend import cuda_moe
    from minferd.model.loader import load_local
    monkeypatch.setenv("MINFERD_DEVICE_MOE", "1")
    ids = np.random.default_rng(3).integers(300, 1000, 64)
    got = []
    bias_rows = cuda_moe._bias_rows
    for in_gemm in (False, True):
        monkeypatch.setattr(cuda_moe, "_bias_rows", bias_rows if in_gemm else lambda b: None)
        lm = load_local(str(synth_model("gpt-oss", "q8_0")), "w16", device="cuda", ctx=128)
        cache = lm.model.new_cache(lm.model.be.untracked(), 128)
        got.append(lm.model.be.to_host(lm.model.forward(ids, cache, all_logits=True)))
    assert got[0].shape[0] == 64 and np.array_equal(got[0], got[1])


def test_fused_b_grouped_refuses_a_partial_tile():
    qt = TYPES["Q8_0"]
    w = cp.zeros((2 * 64, qt.block_bytes), cp.uint8)
    with pytest.raises(ValueError, match="in tiles of 64"):
        fused_b_grouped(qt, w, 2, cp.zeros((65, 32), cp.float16), cp.zeros(1, cp.int32), cp.zeros((65, 64), cp.float32))


@pytest.mark.parametrize("matmul_path,kernel", PATH_KERNELS)
@pytest.mark.parametrize("quant", MOE_TYPES)
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_a_grouped_prefill_matches_cpu(synth_model, arch, quant, matmul_path, kernel, monkeypatch):
    """test_moe_cuda.py's teacher-forced comparison with every prefill MoE layer one grouped GEMM
    a projection (64 tokens, 2 of 8 experts each) and every decode-sized pass routed on the device."""
    monkeypatch.setenv("MINFERD_DEVICE_MOE", "1")
    err, agree = teacher_forced(synth_model(arch, quant), n_tok=64, matmul_path=matmul_path, kernel=kernel)
    bound = 0.1 if quant == "q4_k" and matmul_path != "w16" else 2e-2
    assert err < bound and agree >= 0.95, (err, agree)
