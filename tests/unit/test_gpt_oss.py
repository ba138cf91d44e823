"""gpt-oss on the CPU backend: the biased, clamped-SwiGLU MoE op against a per-token reference,
what the spec reads (window pattern, YaRN), that the window, the sinks and YaRN each change the
logits, the real 20b's shapes, and the refusal on CUDA before anything is allocated. (llama.cpp's
view: test_oracle.py; batching: test_engine.py; bad files: test_model_file_errors.py.)"""
import dataclasses

import numpy as np
import pytest

from minferd.backend.cpu import CpuBackend
from minferd.errors import ModelFileError
from minferd.kernels.quant import TYPES
from minferd.model import loader
from minferd.model.arch import MODELS
from minferd.model.arch.gpt_oss import SWIGLU_ALPHA, SWIGLU_LIMIT
from minferd.model.arch.llama import EXPERTS
from minferd.model.generate import prefill
from minferd.model.loader import load_local
from minferd.model.spec import Yarn, spec_from_metadata
from minferd.model.synth import PRESETS, _metadata


def reference_moe(x, router, router_b, gate, up, down, biases, k, alpha, limit):
    """Token by token, as llama.cpp's build_moe_ffn for gpt-oss: the top k of the biased logits,
    their softmax, and each expert's biased swiglu_oai."""
    out = np.zeros((len(x), down.shape[1]))
    gate_b, up_b, down_b = biases
    for t, xt in enumerate(x.astype(np.float64)):
        logits = router @ xt + router_b
        top = np.argsort(-logits)[:k]
        w = np.exp(logits[top] - logits[top].max())
        for e, we in zip(top, w / w.sum()):
            g = np.minimum(gate[e] @ xt + gate_b[e], limit)
            u = np.clip(up[e] @ xt + up_b[e], -limit, limit)
            out[t] += we * (down[e] @ (g / (1 + np.exp(-alpha * g)) * (u + 1)) + down_b[e])
    return out


def test_biased_moe_with_swiglu_oai_matches_a_per_token_reference():
    rng = np.random.default_rng(0)
    n, hidden, ffn, n_expert, k = 24, 64, 32, 8, 3
    be = CpuBackend(2)
    mem = be.untracked()

    def weight(name, a):  # a in NumPy order: GGUF's shape reversed
        a = np.asarray(a, np.float32)
        raw = np.ascontiguousarray(a.reshape(-1, a.shape[-1])).view(np.uint8)
        return be.upload(mem, name, TYPES["F32"], a.shape[::-1], raw)

    router, router_b = rng.standard_normal((n_expert, hidden)) / 8, rng.standard_normal(n_expert)
    gate, up = (rng.standard_normal((n_expert, ffn, hidden)) for _ in range(2))  # big: the clamp bites
    down = rng.standard_normal((n_expert, hidden, ffn)) / 6
    biases = [rng.standard_normal((n_expert, m)) for m in (ffn, ffn, hidden)]
    x = rng.standard_normal((n, hidden)).astype(np.float32)
    got = be.moe(x, weight("r", router), weight("g", gate), weight("u", up), weight("d", down), k,
                 router_bias=weight("rb", router_b), exps_bias=tuple(weight(f"b{i}", b) for i, b in enumerate(biases)),
                 oai_glu=(SWIGLU_ALPHA, SWIGLU_LIMIT))
    want = reference_moe(x, router, router_b, gate, up, down, biases, k, SWIGLU_ALPHA, SWIGLU_LIMIT)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert (np.abs(np.einsum("efh,nh->nef", gate, x)) > SWIGLU_LIMIT).mean() > 0.1  # the clamp was exercised
    be.close()


def test_spec_reads_the_window_pattern_and_yarn(synth_model):
    s = load_local(synth_model("gpt-oss", "q8_0"), threads=1).spec
    assert s.swa_layers == (True, False) and s.sliding_window == 16 and s.n_expert_used == 4
    assert s.yarn == Yarn(256) and s.rope_scale == 1 / 8 and not s.tied_embeddings
    md = _metadata("gpt-oss", PRESETS[("gpt-oss", "20b")], "x")
    s = spec_from_metadata(md, "x", ("output.weight",), 201088)
    assert s.swa_layers == (True, False) * 12 and s.sliding_window == 128
    # llama.cpp's ramp for the real model: pairs below 8 keep their frequency, past 18 are stretched 32x.
    assert s.yarn.corr_dims(s.head_dim, s.rope_base) == (8, 18)


def test_window_sinks_and_yarn_each_change_the_logits(synth_model):
    lm = load_local(synth_model("gpt-oss", "q8_0"), threads=1)
    model, s = lm.model, lm.spec
    ids = np.random.default_rng(1).integers(260, 1000, 40)

    def logits(spec=s):  # the model as it would be built from this spec (its rope tables included)
        m = type(model)(spec, model.w, model.be)
        return prefill(m, ids, m.new_cache(m.be.untracked(), len(ids)), all_logits=True)

    def moved(other):  # each position's relative change
        return np.linalg.norm(other - base, axis=1) / np.linalg.norm(base, axis=1)

    base = logits()
    wide = moved(logits(dataclasses.replace(s, sliding_window=0)))
    plain_rope = moved(logits(dataclasses.replace(s, yarn=None, rope_scale=1.0)))
    for i in range(s.n_layers):
        model.w[f"blk.{i}.attn_sinks.weight"].data[:] = 0
    no_sinks = moved(logits())
    # The window hides nothing from a position that has fewer keys than it.
    assert wide[:s.sliding_window].max() < 1e-6 and wide[s.sliding_window:].min() > 1e-2
    assert no_sinks.min() > 5e-3 and plain_rope.min() > 1e-2


def test_20b_preset_has_the_real_parameter_counts():
    """gpt-oss-20b: 20.9B parameters, 3.6B of them active per token (its model card, which counts
    the unembedding but not the embedding table)."""
    md = _metadata("gpt-oss", PRESETS[("gpt-oss", "20b")], "x")
    s = spec_from_metadata(md, "x", ("output.weight",), 201088)
    assert (s.n_layers, s.n_expert, s.n_expert_used, s.expert_ffn, s.q_dim, s.kv_dim) == (24, 32, 4, 2880, 4096, 512)
    layout = MODELS["gpt-oss"].expected_tensors(s)
    assert layout["blk.0.ffn_down_exps.weight"] == ((2880, 2880, 32), EXPERTS)
    total = sum(int(np.prod(shape)) for shape, _ in layout.values())
    experts = sum(int(np.prod(shape)) for shape, role in layout.values() if role == EXPERTS)
    active = total - experts + experts * s.n_expert_used // s.n_expert - s.hidden * s.n_vocab
    assert 20.8e9 < total < 21.0e9 and 3.5e9 < active < 3.7e9, (total, active)


def test_a_backend_the_arch_lacks_is_refused_before_any_allocation(synth_model, monkeypatch):
    """gpt-oss runs on CUDA since session 14; the refusal stays for the next architecture that lands
    on the CPU first."""
    path = synth_model("gpt-oss", "q8_0")
    monkeypatch.setattr(MODELS["gpt-oss"], "backends", ("cpu",))

    def no_backend(*a, **kw):
        raise AssertionError("a backend was made")

    monkeypatch.setattr(loader, "make_backend", no_backend)
    with pytest.raises(ModelFileError, match="gpt-oss runs on the CPU backend only so far"):
        load_local(str(path), device="cuda")
