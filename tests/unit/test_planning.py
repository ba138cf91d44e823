"""The pool's pure parts: the budget from a flag, the planner's rules and reasons, and the
header-only estimate against what a load measures (every synth preset, the real gemma)."""
import dataclasses

import pytest

from minferd.devices import MatmulPath, cpu_traits, cuda_traits
from minferd.errors import InvalidRequest
from minferd.pool.budget import parse_budget, resolve_budget
from minferd.pool.estimator import Estimate
from minferd.pool.planner import plan
from tests.unit.test_pool import MiB, check, make_host, opts


# ---- budget ----------------------------------------------------------------------------------
def test_parse_budget():
    assert parse_budget("40GiB").nbytes == 40 << 30
    assert parse_budget("512MB").nbytes == 512_000_000
    assert parse_budget("1073741824").nbytes == 1 << 30
    assert parse_budget("0.9").fraction == 0.9
    for bad in ("", "-1GiB", "0", "lots", "12 parsecs"):
        with pytest.raises(InvalidRequest, match="budget"):
            parse_budget(bad)


def test_resolve_budget():
    b = resolve_budget("cuda:0", parse_budget("0.5"), total=100 << 30, others=10 << 30, headroom=1 << 30)
    assert b.capacity == (50 << 30) - (1 << 30)
    b = resolve_budget("cuda:0", parse_budget("95GiB"), total=100 << 30, others=10 << 30, headroom=1 << 30)
    assert b.capacity == (89 << 30)  # never more than other processes leave
    with pytest.raises(InvalidRequest, match="leaves nothing"):
        resolve_budget("cuda:0", parse_budget("0.9"), total=10 << 30, others=10 << 30)


# ---- planner rules ---------------------------------------------------------------------------
def est(matmul_bytes=3 << 30, types=("Q4_K", "Q6_K")):
    return Estimate(weights=4 << 30, w16=12 << 30, kv=1 << 30, scratch=256 * MiB, matmul_bytes=matmul_bytes,
                    matmul_types=frozenset(types), ctx=4096)


BIG = 40 << 30


@pytest.mark.parametrize("env, requested, free, path, words", [
    ({}, None, BIG, "w16", ["reach the w16 gate"]),
    ({}, None, 10 << 30, "mmq", ["needs", "free", "mmq covers"]),
    ({}, MatmulPath.W16, BIG, "w16", ["requested"]),
    ({}, MatmulPath.W16, 10 << 30, "mmq", ["w16 requested but", "free"]),
    ({}, MatmulPath.FUSED_B, BIG, "fused_b", ["requested"]),
    ({}, MatmulPath.MMQ, BIG, "mmq", ["requested"]),
    ({"MINFERD_NO_W16CACHE": "1"}, None, BIG, "mmq", ["MINFERD_NO_W16CACHE=1"]),
    ({"MINFERD_NO_W16CACHE": "1"}, MatmulPath.W16, BIG, "mmq", ["MINFERD_NO_W16CACHE=1"]),
    ({"MINFERD_FUSED_B": "1"}, MatmulPath.W16, BIG, "fused_b", ["MINFERD_FUSED_B=1"]),
])
def test_planner_rules(env, requested, free, path, words):
    p = plan(est(), cuda_traits(), free, requested, env=env)
    assert p.matmul_path.value == path
    for w in words:
        assert w in p.reason
    assert p.bytes == {"weights": 4 << 30, "w16": (12 << 30) if path == "w16" else 0, "kv": 1 << 30,
                       "scratch": 256 * MiB}


def test_planner_gate_and_coverage():
    p = plan(est(matmul_bytes=(2 << 30) - 1), cuda_traits(), BIG, env={})
    assert p.matmul_path == MatmulPath.MMQ and "under the w16 gate of 2.00 GiB" in p.reason
    # A type mmq lacks beside one it has (an MoE's F32 router): MMQ, the F16 matmuls on fused_b / tiles.
    p = plan(est(types=("Q4_K", "F16")), cuda_traits(), 10 << 30, env={})
    assert p.matmul_path == MatmulPath.MMQ and "mmq covers Q4_K; F16 through fused_b or tiles" in p.reason
    p = plan(est(types=("F16",)), cuda_traits(), 10 << 30, env={})
    assert p.matmul_path == MatmulPath.FUSED_B and "no kernel for F16" in p.reason
    p = plan(est(types=("BF16",)), cuda_traits(), BIG, MatmulPath.MMQ, env={})
    assert p.matmul_path == MatmulPath.FUSED_B and "mmq requested but" in p.reason
    assert plan(est(types=("F16",)), cpu_traits(1), 10 << 30, env={}).matmul_path == MatmulPath.MMQ


def test_estimate_matches_measurement_for_presets(tmp_path):
    """Every synth preset (cut to two layers, six for Gemma's pattern; real shapes otherwise):
    the header-only estimate is within 2% of what the load measures, by kind."""
    from minferd.model.loader import open_model_file
    from minferd.model.synth import PRESETS, write_model
    from minferd.pool.estimator import estimate
    h = make_host(8 << 30)
    for (arch, preset) in PRESETS:
        cut = {"layers": 6 if arch == "gemma3" else 2}
        p = PRESETS[arch, preset]
        if p.experts:  # the real experts' shapes, but at most 16 of them or 2**27 weights a layer
            cut.update(experts=max(p.experts_used, min(16, p.experts, (1 << 27) // (3 * p.hidden * p.expert_ffn))))
            cut.update(vocab=min(p.vocab, 32768))  # gpt-oss's 201088 x 2880 embedding alone was a 1 GB file
        path = tmp_path / f"{arch}-{preset}.gguf"
        write_model(path, arch, preset, "q4_k_m", random_blocks_=True, overrides=cut)
        e = estimate(open_model_file(path), h.traits, 1024).by_kind(False)
        lm = h.load(f"{arch}-{preset}", str(path), opts(ctx=1024, matmul_path=MatmulPath.MMQ))
        measured = h.model_bytes(lm)
        for kind in e:
            assert abs(e[kind] - measured[kind]) <= 0.02 * max(measured[kind], 1), (arch, preset, kind)
        h.unload(lm.name)
        path.unlink()
    check(h)


def test_estimate_matches_measurement_for_real_gemma(gemma_path):
    from minferd.model.loader import open_model_file
    from minferd.pool.estimator import estimate
    h = make_host(2 << 30, w16_min=2 << 30)
    e = estimate(open_model_file(gemma_path), h.traits, 2048).by_kind(False)
    lm = h.load("gemma", gemma_path, opts(ctx=2048))
    assert lm.ws.plan.matmul_path == MatmulPath.MMQ  # 0.2 GiB of matmul weights: under the gate
    measured = h.model_bytes(lm)
    assert all(abs(e[k] - measured[k]) <= 0.02 * max(measured[k], 1) for k in e), (e, measured)
    assert h.unload("gemma") == sum(measured.values())


def test_a_mixtures_experts_count_toward_the_size_gate():
    """The 30b-a3b's shape: 736 MiB of dense weights (what the copy covers) beside 16 GiB of experts.
    The model is big: it takes the dense copy where that fits, and waits for it where it does not."""
    moe = Estimate(weights=17 << 30, w16=(2 << 30) + (300 << 20), kv=400 << 20, scratch=3 << 30,
                   matmul_bytes=736 << 20, matmul_types=frozenset(("Q4_K", "Q6_K")), ctx=4096,
                   expert_bytes=(16 << 30) + (350 << 20))
    p = plan(moe, cuda_traits(), 80 << 30, env={})
    assert p.matmul_path == MatmulPath.W16 and "(the experts' included) reach the w16 gate" in p.reason
    assert "the copy covers the dense weights (attention, output) only" in p.reason
    assert p.bytes["w16"] == moe.w16
    q = plan(moe, cuda_traits(), 22 << 30, env={})
    assert q.matmul_path == MatmulPath.MMQ and q.wants_w16 and q.bytes["w16"] == 0
    small = dataclasses.replace(moe, expert_bytes=100 << 20)
    assert "(the experts' included) are under the w16 gate" in plan(small, cuda_traits(), 80 << 30, env={}).reason


def test_a_mixtures_grouped_prefill_is_reserved_only_where_it_runs(tmp_path, monkeypatch):
    """The grouped GEMMs' buffers (devices.moe_grouped_bytes) are scratch of the device-routed
    path alone: with MINFERD_DEVICE_MOE=0 an MoE's estimate holds none of them."""
    from minferd.devices import cuda_scratch_bytes, moe_grouped_bytes
    from minferd.model.loader import open_model_file
    from minferd.model.synth import write_model
    write_model(tmp_path / "moe.gguf", "qwen3moe", "tiny", "q4_k_m", seed=1)
    spec = open_model_file(str(tmp_path / "moe.gguf")).spec
    monkeypatch.setenv("MINFERD_DEVICE_MOE", "0")
    off = cuda_scratch_bytes(spec, 512, 512)
    monkeypatch.delenv("MINFERD_DEVICE_MOE", raising=False)  # on by default
    on = cuda_scratch_bytes(spec, 512, 512)
    # On, the pass's grouped buffers and the prefill graphs' pool's (a 1024-token pass's) too.
    from minferd.devices import PREFILL_GRAPH_TOKENS
    assert moe_grouped_bytes(spec, 512) > 0
    assert on - off >= moe_grouped_bytes(spec, 512) + moe_grouped_bytes(spec, PREFILL_GRAPH_TOKENS)
