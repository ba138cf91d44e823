"""Tiny synthetic models of every architecture and type load, generate, and decode through the
KV cache exactly as a single prefill of the same tokens computes."""
import numpy as np
import pytest

from minferd.model.generate import generate, prefill
from minferd.model.loader import load_local
from minferd.model.sampler import SamplingParams
from tests.conftest import ARCHS, TABLE_ARCHS, TABLE_TYPES, MOE_ARCHS, MOE_TYPES, TYPES

N_TOKENS = 24


def _ids(n_vocab, n, seed=0):
    return np.random.default_rng(seed).integers(260, n_vocab - 16, n)


@pytest.mark.parametrize("arch,quant", [(a, q) for q in TYPES for a in ARCHS] +
                         [(a, q) for q in TABLE_TYPES for a in TABLE_ARCHS])
def test_decode_matches_prefill(synth_model, arch, quant):
    lm = load_local(synth_model(arch, quant), "mmq", threads=1)
    s, be = lm.spec, lm.model.be
    ids = _ids(s.n_vocab, N_TOKENS)
    whole = prefill(lm.model, ids, lm.model.new_cache(be.untracked(), N_TOKENS), all_logits=True)
    cache = lm.model.new_cache(be.untracked(), N_TOKENS)
    stepped = np.concatenate([be.to_host(lm.model.forward(ids[i:i + 1], cache)) for i in range(N_TOKENS)])
    scale = np.abs(whole).max()
    assert np.abs(stepped - whole).max() <= 1e-4 * scale
    assert np.isfinite(whole).all() and whole.std() > 0


@pytest.mark.parametrize("quant", MOE_TYPES)
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_decode_matches_prefill(synth_model, arch, quant):
    test_decode_matches_prefill(synth_model, arch, quant)


@pytest.mark.parametrize("arch", ARCHS + MOE_ARCHS)
def test_generate(synth_model, arch):
    lm = load_local(synth_model(arch, "q4_k"), "mmq", threads=1)
    res = generate(lm.model, lm.tokenizer, _ids(lm.spec.n_vocab, 5).tolist(),
                   SamplingParams(temperature=0.7, seed=3, max_tokens=12), ctx=64)
    again = generate(lm.model, lm.tokenizer, _ids(lm.spec.n_vocab, 5).tolist(),
                     SamplingParams(temperature=0.7, seed=3, max_tokens=12), ctx=64)
    assert res.token_ids == again.token_ids  # seeded sampling is reproducible
    assert 1 <= len(res.token_ids) <= 12 and res.prompt_tokens == 5
    assert res.finish_reason in ("length", "stop")


@pytest.mark.parametrize("arch", ARCHS + MOE_ARCHS)
def test_w16_plan_matches_dequant_at_use(synth_model, arch):
    """The resident f16 copy holds exactly the f16-rounded dequantized weights."""
    path = synth_model(arch, "q4_k")
    a, b = load_local(path, "mmq", threads=1), load_local(path, "w16", threads=1)
    held = sum(w.w16.nbytes for w in b.model.w.values() if w.w16 is not None)
    assert held == 2 * b.file.matmul_elems()
    assert all(w.w16 is None for w in a.model.w.values())
    ids = _ids(a.spec.n_vocab, 8)
    la = prefill(a.model, ids, a.model.new_cache(a.model.be.untracked(), 8))
    lb = prefill(b.model, ids, b.model.new_cache(b.model.be.untracked(), 8))
    assert np.abs(la - lb).max() <= 2e-2 * np.abs(la).max()


def test_gemma_layer_pattern(synth_model):
    s = load_local(synth_model("gemma3", "f32"), "mmq", threads=1).spec
    assert s.sliding_window == 16 and s.swa_layers == (True,) * 5 + (False,)
    assert s.rope_base_swa == 10000.0 and s.rope_base == 1e6 and s.tied_embeddings
