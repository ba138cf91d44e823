"""The CUDA backend against the CPU reference: attention, whole models teacher-forced (every
architecture x type, real-shaped presets, the cut real gemma3), the decode graph, and the pool's
ledger against CuPy's allocator. Skipped where CuPy or a GPU is missing."""
import os

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception as e:  # no driver
    pytest.skip(f"no CUDA device ({type(e).__name__})", allow_module_level=True)

from minferd.backend.batch import Batch  # noqa: E402
from minferd.backend.cpu import CpuBackend  # noqa: E402
from minferd.backend.cuda import CudaBackend, DeviceMemory  # noqa: E402
from minferd.model.generate import decode_one, generate, prefill  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402
from minferd.model.sampler import SamplingParams  # noqa: E402
from minferd.model.synth import write_model  # noqa: E402
from tests.conftest import ARCHS, TABLE_ARCHS, TABLE_TYPES, TYPES  # noqa: E402

CUT_GEMMA = os.environ.get("MINFERD_CUT_GEMMA", ".devcarry/gemma3-cut.gguf")
rng = np.random.default_rng(0)


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def teacher_forced(path, n_seq=2, n_tok=32, matmul_path="mmq", kernel=None):
    """(relative error, top-1 agreement) of CUDA logits against the CPU's on the same sequences;
    kernel: the one prefill kernel the CUDA model runs (None: the gate table picks per matmul)."""
    cpu = load_local(str(path), matmul_path, device="cpu", ctx=256)
    gpu = load_local(str(path), matmul_path, device="cuda", ctx=256)
    gpu.model.be.prefill_kernel = kernel
    errs, agree = [], []
    for s in range(n_seq):
        ids = np.random.default_rng(s).integers(300, min(cpu.spec.n_vocab, 30000) - 1, n_tok)
        a = prefill(cpu.model, ids, cpu.model.new_cache(cpu.model.be.untracked(), n_tok), all_logits=True)
        b = prefill(gpu.model, ids, gpu.model.new_cache(gpu.model.be.untracked(), n_tok), all_logits=True)
        b = gpu.model.be.to_host(b)
        errs.append(rel(b, a))
        agree.append(float((a.argmax(1) == b.argmax(1)).mean()))
    return max(errs), min(agree)


@pytest.mark.parametrize("arch,quant", [(a, q) for q in TYPES for a in ARCHS] + [(a, q) for q in TABLE_TYPES for a in TABLE_ARCHS])
def test_tiny_models_match_cpu(synth_model, arch, quant):
    err, agree = teacher_forced(synth_model(arch, quant))
    assert err < 2e-2 and agree >= 0.95, (err, agree)


@pytest.mark.parametrize("arch, preset", [("qwen2", "0.5b"), ("qwen3", "0.6b"), ("gemma3", "270m"), ("llama", "8b"),
                                          ("qwen2", "7b")])
def test_real_shapes_match_cpu(tmp_path, arch, preset):
    """Real widths, vocabularies and head layouts (two layers; six for Gemma's pattern)."""
    path = tmp_path / f"{arch}-{preset}.gguf"
    write_model(path, arch, preset, "q8_0", overrides={"layers": 6 if arch == "gemma3" else 2})
    err, agree = teacher_forced(path, n_seq=1, n_tok=24)
    assert err < 2e-2 and agree >= 0.95, (err, agree)


PATH_KERNELS = [("w16", None), ("mmq", None), ("fused_b", None), ("mmq", "mmq"), ("mmq", "fused_b"), ("mmq", "tiles")]


@pytest.mark.skipif(not os.path.exists(CUT_GEMMA), reason="the cut gemma3 is carried to the device as .devcarry/")
@pytest.mark.parametrize("matmul_path,kernel", PATH_KERNELS)
def test_cut_real_gemma_matches_cpu(matmul_path, kernel):
    err, agree = teacher_forced(CUT_GEMMA, matmul_path=matmul_path, kernel=kernel)
    assert err < 2e-2 and agree >= 0.95, (err, agree)


def top1_agreement(got: np.ndarray, ref: np.ndarray) -> float:
    """Share of positions whose top-1 agrees, a flip excused where the reference's top two are
    closer than the two paths' largest logit difference there: a near-tie the measured error
    can explain (random-block models have many; the H200 run of 2026-11-29 saw MMQ at 6e-4
    relative error flip 2 of 32 positions, each such a tie)."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    tie = (top2[:, 1] - top2[:, 0]) <= 2 * np.abs(got - ref).max(axis=1)
    return float(((got.argmax(1) == ref.argmax(1)) | tie).mean())


def _path_logits(path, matmul_path, seqs, kernel=None):
    lm = load_local(str(path), matmul_path, device="cuda", ctx=64)
    be = lm.model.be
    be.prefill_kernel = kernel
    return [be.to_host(prefill(lm.model, ids, lm.model.new_cache(be.untracked(), len(ids)), all_logits=True))
            for ids in seqs]


@pytest.mark.parametrize("which", ["qwen2-7b", "cut-gemma3"])
def test_w16_mmq_fused_b_agree(tmp_path, which):
    """The prefill paths and each no-copy kernel alone (mmq, fused_b, dequantized tiles), teacher-
    forced on the same 8 x 32 tokens: within 2e-2 and >= 95% top-1 of W16 (cuBLAS on the f16 copy)."""
    if which == "cut-gemma3":
        if not os.path.exists(CUT_GEMMA):
            pytest.skip("the cut gemma3 is carried to the device as .devcarry/")
        path = CUT_GEMMA
    else:
        path = tmp_path / "q7b.gguf"
        write_model(path, "qwen2", "7b", "q4_k_m", overrides={"layers": 2}, random_blocks_=True)  # centred, scaled: seconds, not minutes
    seqs = [np.random.default_rng(s).integers(300, 30000, 32) for s in range(8)]
    ref = _path_logits(path, "w16", seqs)
    for other in PATH_KERNELS[1:]:
        got = _path_logits(path, other[0], seqs, other[1])
        err = max(rel(g, r) for g, r in zip(got, ref))
        agree = min(top1_agreement(g, r) for g, r in zip(got, ref))
        raw = min(float((g.argmax(1) == r.argmax(1)).mean()) for g, r in zip(got, ref))
        assert err < 2e-2 and agree >= 0.95, (other, err, agree, raw)


@pytest.mark.parametrize("window", [0, 7, 70])
@pytest.mark.parametrize("d,chunk", [(128, 16), (128, 100), (64, 130), (256, 70), (192, 16)])
def test_attention_prefill_and_decode_match_numpy(window, d, chunk):
    """Prefill chunks (the flash kernel for d in 64/128/256, cuBLAS for others; chunks past
    one CTA's 64 queries), then single-token decode steps, over a paged cache whose block table
    is shuffled, against the NumPy attention."""
    hq, hkv, bs = 8, 2, 16
    n_ctx = 3 * chunk + 16
    n_blocks = -(-n_ctx // bs)
    table = [int(t) for t in rng.permutation(n_blocks)]
    cpu, gpu = CpuBackend(2), CudaBackend(DeviceMemory())
    cc = cpu.alloc_kv(cpu.untracked(), 1, n_blocks, bs, hkv, d)
    gc = gpu.alloc_kv(gpu.untracked(), 1, n_blocks, bs, hkv, d)
    for start in range(0, n_ctx, chunk):
        n = chunk if start < 3 * chunk else 1  # prefill chunks, then single-token decode steps
        for t0 in range(start, min(start + chunk, n_ctx), n):
            batch = Batch.build([(list(range(n)), t0, table)], bs)
            k, v = (rng.standard_normal((n, hkv, d)).astype(np.float32) for _ in range(2))
            q = rng.standard_normal((n, hq, d)).astype(np.float32)
            k16, v16 = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
            cpu.kv_write(cc, 0, batch, k16, v16)  # the reference sees the f16-rounded cache too
            want = cpu.attention(q, cc, 0, batch, window, 0.1)
            with gpu.scope():
                gpu.prepare(batch)
                gpu.kv_write(gc, 0, batch, cp.asarray(k), cp.asarray(v))
                got = cp.asnumpy(gpu.attention(cp.asarray(q), gc, 0, batch, window, 0.1))
            # The flash kernel multiplies f16 q and f16 probabilities (f32 sums): ~1e-4..1e-3.
            assert rel(got, want) < 2e-3, (t0, n, rel(got, want))


def test_decode_graph_equals_eager(synth_model):
    lm = load_local(str(synth_model("gemma3", "q4_k")), device="cuda", ctx=64)
    be, m = lm.model.be, lm.model
    ids = [300, 301, 302, 303]
    a = m.new_cache(be.untracked(), 64)
    b = m.new_cache(be.untracked(), 64)
    prefill(m, np.array(ids[:2]), a)
    prefill(m, np.array(ids[:2]), b)
    for t in ids[2:] + [304, 305, 306]:
        eager = be.to_host(m.forward(np.array([t]), a))
        graph = be.to_host(decode_one(m, t, b))
        assert np.allclose(eager, graph, rtol=1e-5, atol=1e-5)
    assert len(be.graphs) == 1
    be.free(b)  # its graph writes b's blocks: it goes with them (a later cache may get b's id)
    assert not be.graphs


def test_generate_greedy_matches_cpu(synth_model):
    path = str(synth_model("qwen2", "q6_k"))
    p = SamplingParams(temperature=0, max_tokens=16)
    out = [generate(load_local(path, device=d, ctx=64).model, load_local(path, ctx=64).tokenizer, [300, 301, 302],
                    p, ctx=64).token_ids for d in ("cpu", "cuda")]
    n = next((i for i, (x, y) in enumerate(zip(*out)) if x != y), 16)
    assert n >= 8, out


def test_pool_ledger_equals_cupy_allocator(synth_model, device_memory):
    """Load (W16 warm included), generate, demote, unload: the ledger equals what the CuPy pool
    holds, within the budget, and unload returns every byte."""
    from minferd.devices import MatmulPath, cuda_traits
    from minferd.host import Host, LoadOptions
    budget = 2 << 30
    mem = device_memory(budget)
    h = Host(lambda **kw: CudaBackend(mem, **kw), mem, cuda_traits(), budget, w16_min_bytes=0, device="cuda:0")

    def check():
        cp.cuda.Stream.null.synchronize()
        assert h.ledger.held() == h.allocator.held_bytes() == mem.used_bytes() <= budget

    check()
    h.load("a", str(synth_model("llama", "q4_k")), LoadOptions(MatmulPath.W16, ctx=256))
    check()
    assert h.models["a"].ws.w16_bytes() > 0
    h.generate("a", [300, 301], SamplingParams(temperature=0, max_tokens=8))
    check()
    h.load("b", str(synth_model("gemma3", "q5_0")), LoadOptions(ctx=512))
    h.generate("b", list(range(300, 340)), SamplingParams(max_tokens=4))
    check()
    h.demote("a")
    check()
    h.unload("a")
    h.unload("b")
    check()
    assert h.ledger.held() == 0 == mem.used_bytes()
