"""gpt-oss's parts on the CUDA backend against their references: attention sinks in the decode
merge and the flash prefill kernel (f64 NumPy), swiglu_oai (the CPU backend's), and the tiny
gpt-oss model end to end against the CPU backend (sinks, YaRN as freq factors, sliding windows,
biased MXFP4 experts through backend/moe.py), which is what lets GptOssModel.backends name cuda."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.backend.cpu import CpuBackend, HostMemory  # noqa: E402
from minferd.kernels.attn_decode import attn_decode, attn_decode_ref  # noqa: E402
from minferd.kernels.attn_prefill import attn_prefill  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402
from tests.cuda.conftest import poisoned  # noqa: E402
from tests.cuda.test_attn_decode import Case, check  # noqa: E402
from tests.cuda.test_backend import teacher_forced  # noqa: E402


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("sink_scale", [0.5, 8.0])  # a sink below the scores, and one that dominates them
def test_decode_sinks_match_reference(splits, window, sink_scale):
    rng = np.random.default_rng(splits + window)
    c = Case(rng, [1000, 1, 17, 0, 33], 8, 2, 64)
    sinks = (rng.standard_normal(8) * sink_scale).astype(np.float32)
    out = poisoned((c.B, c.hq * c.d), cp.float32)
    dv = c.dev
    attn_decode(dv["q"], dv["K"], dv["V"], dv["bt"], dv["lens"], out, block_size=c.bs, window=window,
                scale=c.d ** -0.5, splits=splits, sinks=cp.asarray(sinks))
    ref = attn_decode_ref(c.q, c.K, c.V, c.bt, c.lens, block_size=c.bs, window=window, scale=c.d ** -0.5, sinks=sinks)
    check(out, ref, c.lens, f"sinks x{sink_scale} splits {splits} window {window}")


def _prefill_ref(q, k, v, first, window, scale, sinks):
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    out = np.zeros((n, hq, d))
    for i in range(n):
        p = first + i
        keys = np.arange(0 if not window else max(0, p - window + 1), p + 1)
        for h in range(hq):
            s = k[keys, h // g].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            mx = max(s.max(), sinks[h])
            e = np.exp(s - mx)
            out[i, h] = e @ v[keys, h // g].astype(np.float64) / (e.sum() + np.exp(sinks[h] - mx))
    return out.reshape(n, hq * d)


@pytest.mark.parametrize("window", [0, 24])
def test_prefill_sinks_match_reference(window):
    rng = np.random.default_rng(window)
    n, hq, hkv, d, first = 70, 8, 2, 64, 10
    L = first + n
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    k = rng.standard_normal((L, hkv, d)).astype(np.float16)
    v = rng.standard_normal((L, hkv, d)).astype(np.float16)
    sinks = (rng.standard_normal(hq) * 3).astype(np.float32)
    out = poisoned((n, hq * d), cp.float32)
    attn_prefill(cp.asarray(q), cp.asarray(k), cp.asarray(v), out, first=first, lo=0, window=window, scale=0.125,
                 sinks=cp.asarray(sinks))
    ref = _prefill_ref(q, k, v, first, window, 0.125, sinks)
    got = cp.asnumpy(out).astype(np.float64)
    err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert err.max() < 2e-3, err.max()  # the kernel's P is f16 before P V


def test_swiglu_oai_is_the_cpu_backends(synth_model):
    lm = load_local(str(synth_model("qwen2", "q8_0")), "mmq", device="cuda", ctx=64)
    rng = np.random.default_rng(0)
    g = (rng.standard_normal((5, 96)) * 6).astype(np.float32)  # past the clamp of 7 now and then
    u = (rng.standard_normal((5, 96)) * 6).astype(np.float32)
    got = cp.asnumpy(lm.model.be.swiglu_oai(cp.asarray(g), cp.asarray(u), 1.702, 7.0))
    want = CpuBackend(1, HostMemory()).swiglu_oai(g, u, 1.702, 7.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device_moe", ["0", "1"])  # expert by expert; grouped GEMMs and device routing
@pytest.mark.parametrize("matmul_path", ["w16", "mmq"])
def test_tiny_gpt_oss_matches_cpu(synth_model, matmul_path, device_moe, monkeypatch):
    monkeypatch.setenv("MINFERD_DEVICE_MOE", device_moe)
    err, agree = teacher_forced(synth_model("gpt-oss", "q8_0"), n_tok=48, matmul_path=matmul_path)
    assert err < 2e-2 and agree >= 0.95, (err, agree)


@pytest.mark.parametrize("path", ["w16", "mmq"])
def test_a_decode_step_of_tiny_gpt_oss_in_a_graph_matches_cpu(synth_model, path, monkeypatch):
    """Five sequences' decode step routed on the device: captured (sinks, the expert biases'
    gathers and swiglu_oai inside the graph), and each row's logits the CPU backend's."""
    from tests.cuda.test_moe_cuda import decode_step_on_both
    monkeypatch.setenv("MINFERD_DEVICE_MOE", "1")
    cpu, gpu, again, be = decode_step_on_both(str(synth_model("gpt-oss", "q8_0")), path, seed=5)
    assert np.array_equal(gpu, again)
    assert not any(g.eager for g in be.graphs.values())
    assert np.abs(gpu - cpu).max() <= 2e-2 * np.abs(cpu).max()
    assert (gpu.argmax(1) == cpu.argmax(1)).mean() >= 0.8
