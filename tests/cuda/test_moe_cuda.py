"""qwen3moe and qwen2moe on the CUDA backend against the CPU backend: the MoE MLP runs expert by expert
(backend/moe.py) through the CUDA matmuls, each expert's tokens a batch of its own, so the
prefill passes cover the mat-vec kernels (<= 8 tokens an expert) and the prefill kernels alike;
batched decode steps run eagerly (the routing reads the router's logits on the host)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")  # without a device, conftest marks every test here skipped

from minferd.backend.batch import Batch  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402
from tests.conftest import MOE_TYPES  # noqa: E402
from tests.cuda.test_backend import PATH_KERNELS, teacher_forced  # noqa: E402


@pytest.mark.parametrize("matmul_path,kernel", PATH_KERNELS)
@pytest.mark.parametrize("quant", MOE_TYPES)
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_tiny_moe_matches_cpu(synth_model, arch, quant, matmul_path, kernel):
    # 64 tokens, 2 of 8 experts each: ~16 tokens an expert, some above the mat-vec limit, some under.
    err, agree = teacher_forced(synth_model(arch, quant), n_tok=64, matmul_path=matmul_path, kernel=kernel)
    # Where every dense matmul rounds x to int8 in q8_1 blocks of 32 (the CPU's Q4_K products use
    # q8_K blocks of 256), a router's near-tie picks another expert for a token now and then: on
    # the H200 q4_k's relative error was 0.046-0.059 on those paths, top-1 agreement 0.984 (the
    # f16 activations of W16 and every q8_0 / f16 model: under 0.02).
    bound = 0.1 if quant == "q4_k" and matmul_path != "w16" else 2e-2
    assert err < bound and agree >= 0.95, (err, agree)


@pytest.mark.parametrize("path", ["w16", "mmq"])
def test_batched_decode_matches_cpu(synth_model, path):
    """A prefill of five sequences then one decode step of all five, through be.decode (routed on
    the device, so a captured graph holds the step): each row's logits are the CPU's for the same
    batch."""
    cpu, gpu, again, be = decode_step_on_both(str(synth_model("qwen3moe", "q8_0")), path, seed=7)
    assert be.graphs and not any(g.eager for g in be.graphs.values())
    assert np.abs(gpu - cpu).max() <= 2e-2 * np.abs(cpu).max()
    assert (gpu.argmax(1) == cpu.argmax(1)).mean() >= 0.8


def decode_step_on_both(file: str, path: str, seed: int):
    """A prefill of five sequences, then one decode step of all five on the CPU backend and twice
    (the second a replay where a graph holds it) through the CUDA backend's be.decode: (cpu
    logits, cuda logits, cuda logits again, the CUDA backend)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, 50, 5)
    tables = [[2 * i, 2 * i + 1] for i in range(5)]
    pre = [(rng.integers(300, 1000, int(n)).tolist(), 0, t) for n, t in zip(lens, tables)]
    step = [([int(rng.integers(300, 1000))], int(n), t) for n, t in zip(lens, tables)]
    out = []
    for device in ("cpu", "cuda"):
        lm = load_local(file, path, device=device, ctx=256)
        m, be = lm.model, lm.model.be
        cache = m.new_cache(be.untracked(), 11 * 32)
        m.forward_batch(Batch.build(pre, 32), cache)
        b = Batch.build(step, 32, width=8)
        for _ in range(1 if device == "cpu" else 2):
            out.append(be.to_host(m.forward_batch(b, cache) if device == "cpu" else be.decode(m, b, cache)))
            assert out[-1].shape == (5, m.spec.n_vocab)
    return (*out, be)
