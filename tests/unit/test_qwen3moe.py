"""Qwen3-MoE on the CPU backend: the routed MLP against a per-token reference, the real
30B-A3B's shapes, what the estimator and the W16 plan make of expert tensors, and a CUDA plan. (llama.cpp's view: test_oracle.py; batching: test_engine.py.)"""
import numpy as np
import pytest

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.devices import cpu_traits, cuda_traits
from minferd.errors import ModelFileError
from minferd.host import Host
from minferd.kernels.quant import TYPES
from minferd.model import loader
from minferd.model.arch import MODELS
from minferd.model.arch.llama import EXPERTS, MATMUL, ROUTER, VECTOR
from minferd.model.loader import load_local, open_model_file
from minferd.model.spec import spec_from_metadata
from minferd.model.synth import PRESETS, _metadata
from minferd.plan_cmd import dry_run
from minferd.pool.estimator import VECTOR_ELEM_BYTES, estimate


def reference_moe(x, router, gate, up, down, k):
    """Token by token, as llama.cpp's build_moe_ffn: softmax over all experts, top k, renormalized."""
    out = np.zeros((len(x), down.shape[1]))
    for t, xt in enumerate(x.astype(np.float64)):
        p = np.exp(router @ xt - (router @ xt).max())
        p /= p.sum()
        top = np.argsort(-p)[:k]
        for e, w in zip(top, p[top] / p[top].sum()):
            g, u = gate[e] @ xt, up[e] @ xt
            out[t] += w * (down[e] @ (g / (1 + np.exp(-g)) * u))
    return out


@pytest.mark.parametrize("n_tokens, n_expert, k", [(40, 8, 3), (3, 16, 2), (5, 4, 4)])
def test_moe_op_matches_a_per_token_reference(n_tokens, n_expert, k):
    """Many tokens per expert, experts no token picked, and every expert picked."""
    rng = np.random.default_rng(n_tokens)
    hidden, ffn = 64, 32
    be = CpuBackend(2)
    mem = be.untracked()

    def weight(name, a):  # a in NumPy order: GGUF's shape reversed
        a = a.astype(np.float32)
        raw = np.ascontiguousarray(a.reshape(-1, a.shape[-1])).view(np.uint8)
        return be.upload(mem, name, TYPES["F32"], a.shape[::-1], raw)

    router = rng.standard_normal((n_expert, hidden)) / 8
    gate, up = (rng.standard_normal((n_expert, ffn, hidden)) / 8 for _ in range(2))
    down = rng.standard_normal((n_expert, hidden, ffn)) / 6
    x = rng.standard_normal((n_tokens, hidden)).astype(np.float32)
    residual = rng.standard_normal((n_tokens, hidden)).astype(np.float32)
    got = be.moe(x, weight("r", router), weight("g", gate), weight("u", up), weight("d", down), k, residual=residual)
    want = residual + reference_moe(x, router, gate, up, down, k)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    be.close()


def test_30b_a3b_preset_has_the_real_parameter_counts():
    """Qwen3-30B-A3B: 30.5B parameters, 3.3B of them active per token (its model card)."""
    md = _metadata("qwen3moe", PRESETS[("qwen3moe", "30b-a3b")], "x")
    s = spec_from_metadata(md, "x", ("output.weight",), 151936)
    assert (s.n_layers, s.n_expert, s.n_expert_used, s.expert_ffn, s.q_dim, s.kv_dim) == (48, 128, 8, 768, 4096, 512)
    layout = MODELS["qwen3moe"].expected_tensors(s)
    assert layout["blk.0.ffn_down_exps.weight"] == ((768, 2048, 128), EXPERTS)
    total = sum(int(np.prod(shape)) for shape, _ in layout.values())
    experts = sum(int(np.prod(shape)) for shape, role in layout.values() if role == EXPERTS)
    active = total - experts + experts * s.n_expert_used // s.n_expert
    assert 30.4e9 < total < 30.6e9 and 3.2e9 < active < 3.4e9, (total, active)


def test_estimate_counts_experts_as_weights_without_an_f16_copy(synth_model):
    mf = open_model_file(synth_model("qwen3moe", "q4_k"))
    est = estimate(mf, cpu_traits(1), 256)
    roles = {role for _, role in mf.tensors.values()}
    assert roles == {MATMUL, EXPERTS, ROUTER, VECTOR, "embed"}
    stored = sum(t.n_elems * VECTOR_ELEM_BYTES if role == VECTOR else t.n_bytes for t, role in mf.tensors.values())
    dense = [t for t, role in mf.tensors.values() if role == MATMUL]
    assert est.weights == stored
    assert est.w16 == 2 * sum(t.n_elems for t in dense) == 2 * mf.matmul_elems()
    assert est.matmul_bytes == sum(t.n_bytes for t in dense)
    # Tiny experts' rows (128) are not whole Q4_K super-blocks: their down projections fall back.
    assert est.matmul_types == {"Q4_K", "Q5_0", "F32"} == mf.matmul_types()
    res = dry_run(str(mf.path), "cpu", ctx=256, budget="1GiB")
    assert res["architecture"] == "qwen3moe" and res["fits"] and res["bytes"]["weights"] == est.weights
    experts = sum(t.n_bytes for t, role in mf.tensors.values() if role == EXPERTS)
    assert res["classes"]["experts"] == {"quantized_bytes": experts, "f16_copy_bytes": 0, "used_per_token": "2 of 8"}
    planned = dry_run(str(mf.path), "cpu", ctx=256, budget="1GiB", matmul_path="w16")
    w16 = planned["classes"]
    assert w16["dense"] == {"quantized_bytes": est.matmul_bytes, "f16_copy_bytes": est.w16}  # the dense part's copy
    assert est.expert_bytes == experts + sum(t.n_bytes for t, role in mf.tensors.values() if role == ROUTER)
    assert "not the experts and routers" in planned["plan"]["reason"]  # what status says of the plan too
    assert "not the experts and routers" not in res["plan"]["reason"]  # a quantized plan copies nothing
    assert dry_run(str(synth_model("qwen2")), "cpu", ctx=256, budget="1GiB")["classes"] is None


def test_w16_plan_copies_no_expert_or_router(synth_model):
    lm = load_local(synth_model("qwen3moe", "q4_k"), "w16", threads=1)
    for name, (_, role) in lm.file.tensors.items():
        assert (lm.model.w[name].w16 is not None) == (role == MATMUL), name


def test_cuda_plans_it(synth_model):
    """qwen3moe runs on CUDA too (its MoE expert by expert: tests/cuda/test_moe_cuda.py): a
    CUDA plan is made without a device, the W16 copy covering the dense weights only."""
    res = dry_run(str(synth_model("qwen3moe", "q8_0")), "cuda", ctx=256, budget="80GiB", matmul_path="w16")
    assert res["fits"] and res["architecture"] == "qwen3moe"
    assert res["classes"]["dense"]["f16_copy_bytes"] > 0 and res["classes"]["experts"]["f16_copy_bytes"] == 0


def test_status_shows_which_classes_hold_a_copy(synth_model):
    """GetStatus's ModelInfo.classes and minferctl status: the dense class's copy while the model
    holds one (W16), none after a demotion; the experts always quantized."""
    from minferd.client import model_dict
    from minferd.ctl_text import status_table
    from minferd.devices import MatmulPath
    from minferd.host import LoadOptions
    from minferd.server import model_info
    path = synth_model("qwen3moe", "q4_k")
    h = Host(lambda **kw: CpuBackend(threads=1, **kw), HostMemory(), cpu_traits(1), 1 << 30, device="cpu:0")
    try:
        h.load("moe", str(path), LoadOptions(ctx=256, matmul_path=MatmulPath.W16))
        h.load("dense", str(synth_model("qwen2")), LoadOptions(ctx=256))
        mf = h.get("moe").ws.file
        experts = sum(t.n_bytes for t, role in mf.tensors.values() if role == EXPERTS)
        info = model_dict(model_info(h.model_info(h.get("moe"))))  # through the proto, as a client reads it
        dense_c, experts_c = info["classes"]
        assert dense_c["name"] == "dense" and dense_c["f16_copy_bytes"] == info["bytes"]["w16"] > 0
        assert dense_c["quantized_bytes"] == mf.matmul_bytes()
        assert experts_c == {"name": "experts", "quantized_bytes": experts, "f16_copy_bytes": 0,
                             "note": "2 of 8 run per token"}
        assert model_dict(model_info(h.model_info(h.get("dense"))))["classes"] == []
        st = {"pool": {"device": "cpu:0", "capacity_bytes": 1, "used_bytes": 0, "reserved_bytes": 0, "free_bytes": 1},
              "models": [info], "events": []}
        line = next(x for x in status_table(st).splitlines() if x.startswith("moe f16 copy:"))
        assert "dense" in line and "copied" in line and "experts" in line and "quantized, 2 of 8 run per token" in line
        h.demote("moe")
        after = h.model_info(h.get("moe"))["classes"]
        assert after[0]["f16_copy_bytes"] == 0 and after[1]["f16_copy_bytes"] == 0
    finally:
        h.unload_all()
