"""Write synthetic GGUF models: real architecture shapes, any type of kernels/quant.py, a tokenizer of
the preset's vocabulary size, so that both minferd and llama.cpp load them.

Weights come from a seeded random float model quantized by the project's reference quantizers,
or (`random_blocks=True`) straight from random quantized blocks with benign scales, which is
fast enough for multi-GB performance files where the values do not matter.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from minferd.errors import InvalidRequest
from minferd.kernels.quant import QK_K, TYPES, QuantType, row_bytes
from minferd.kernels.dequant_ref import dequantize
from minferd.kernels.quantize_ref import quantize
from minferd.kernels.random_blocks import center_blocks, random_blocks, scale_blocks
from minferd.model.arch import MODELS
from minferd.model.arch.llama import EMBED, EXPERTS, ROUTER, VECTOR
from minferd.model.spec import GEMMA3_SWA_PERIOD, spec_from_metadata
from minferd.model.synth_vocab import add_metadata, synth_vocab


@dataclass(frozen=True, slots=True)
class Preset:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    ctx: int = 4096
    rope_base: float = 1e6
    eps: float = 1e-6
    tied: bool = True
    window: int = 0
    experts: int = 0  # MoE: experts per layer, each token's share of them, one expert's width
    experts_used: int = 0
    expert_ffn: int = 0
    experts_type: str = ""  # the experts' type whatever the quant asked ("": the quant's)
    shared_ffn: int = 0  # qwen2moe: the shared expert's width
    yarn: tuple = ()  # YaRN rope scaling: (factor, original context)


_TINY = Preset(vocab=1024, hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, ctx=2048)
PRESETS: dict[tuple[str, str], Preset] = {
    ("llama", "tiny"): replace(_TINY, rope_base=10000.0, eps=1e-5, tied=False),
    ("qwen2", "tiny"): _TINY,
    ("qwen3", "tiny"): _TINY,
    # Six layers so that the tiny Gemma has five sliding-window layers and one global one.
    ("gemma3", "tiny"): replace(_TINY, layers=GEMMA3_SWA_PERIOD, kv_heads=1, window=16),
    ("qwen3moe", "tiny"): replace(_TINY, tied=False, experts=8, experts_used=2, expert_ffn=128),
    ("qwen2moe", "tiny"): replace(_TINY, tied=False, experts=8, experts_used=2, expert_ffn=128, shared_ffn=256),
    # Two layers: a sliding-window one, then a full one. q_dim (256) differs from hidden, as in the real ones.
    # Four experts a token (as the real ones): a near-tied route then moves a token's output less.
    ("gpt-oss", "tiny"): replace(_TINY, hidden=192, layers=2, ffn=128, rope_base=150000.0, eps=1e-5, tied=False,
                                 window=16, experts=8, experts_used=4, expert_ffn=128, experts_type="MXFP4",
                                 yarn=(8.0, 256)),
    ("qwen2", "0.5b"): Preset(151936, 896, 24, 14, 2, 64, 4864, 32768),
    ("qwen2", "7b"): Preset(152064, 3584, 28, 28, 4, 128, 18944, 32768, tied=False),
    ("llama", "8b"): Preset(128256, 4096, 32, 32, 8, 128, 14336, 131072, rope_base=500000.0, eps=1e-5, tied=False),
    ("qwen3", "0.6b"): Preset(151936, 1024, 28, 16, 8, 128, 3072, 40960),
    ("gemma3", "270m"): Preset(262144, 640, 18, 4, 1, 256, 2048, 32768, window=512),
    # Qwen3-30B-A3B's config.json: 128 experts, 8 per token, moe_intermediate_size 768.
    ("qwen3moe", "30b-a3b"): Preset(151936, 2048, 48, 32, 4, 128, 6144, 40960, tied=False,
                                    experts=128, experts_used=8, expert_ffn=768),
    # gpt-oss-20b's config.json; its experts ship as MXFP4 (so do the GGUFs made from it).
    ("gpt-oss", "20b"): Preset(201088, 2880, 24, 64, 8, 64, 2880, 131072, rope_base=150000.0, eps=1e-5,
                               tied=False, window=128, experts=32, experts_used=4, expert_ffn=2880,
                               experts_type="MXFP4", yarn=(32.0, 4096)),
}
VOCAB_KIND = {"llama": "gpt2", "qwen2": "gpt2", "qwen3": "gpt2", "gemma3": "llama", "qwen3moe": "gpt2",
              "qwen2moe": "gpt2", "gpt-oss": "gpt2"}
# llama.cpp's fallbacks when a row is not a whole number of 256-element super-blocks
# (llama-quant.cpp; since IQ4_NL exists it gives Q2_K/Q3_K IQ4_NL too, Q4_0 here keeps those
# files loadable on the CUDA backend, which has no IQ4_NL kernels).
K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}
QUANTS = tuple(n.lower() for n in TYPES) + ("q4_k_m",)


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: which layers Q4_K_M gives Q6_K for attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, role: str, quant: str, n_layers: int, row_elems: int, tied: bool) -> QuantType:
    if role in (VECTOR, ROUTER):  # llama.cpp's quantizer keeps routers in f32 too
        return TYPES["F32"]
    if quant != "q4_k_m":
        t = quant.upper()
    elif name == "output.weight" or (tied and name == "token_embd.weight"):
        t = "Q6_K"
    elif name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")):
        t = "Q6_K" if _more_bits(int(name.split(".")[1]), n_layers) else "Q4_K"
    else:
        t = "Q4_K"
    if t in K_FALLBACK and row_elems % QK_K:
        t = K_FALLBACK[t]
    return TYPES[t]


def _metadata(arch: str, p: Preset, name: str) -> dict:
    a = arch + "."
    md = {
        "general.architecture": arch, "general.name": name, "general.type": "model",
        a + "context_length": p.ctx, a + "embedding_length": p.hidden, a + "block_count": p.layers,
        a + "feed_forward_length": p.ffn, a + "attention.head_count": p.heads,
        a + "attention.head_count_kv": p.kv_heads, a + "attention.key_length": p.head_dim,
        a + "attention.value_length": p.head_dim, a + "rope.freq_base": p.rope_base,
        a + "attention.layer_norm_rms_epsilon": p.eps,
    }
    if p.window:
        md[a + "attention.sliding_window"] = p.window
    if p.experts:
        md.update({a + "expert_count": p.experts, a + "expert_used_count": p.experts_used,
                   a + "expert_feed_forward_length": p.expert_ffn})
    if p.shared_ffn:
        md[a + "expert_shared_feed_forward_length"] = p.shared_ffn
    if p.yarn:
        md.update({a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": p.yarn[0],
                   a + "rope.scaling.original_context_length": p.yarn[1]})
    return md


def _vector(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if name.endswith("attn_sinks.weight"):  # logits of the scores' size: some heads sink much
        return rng.standard_normal(n).astype(np.float32)
    if name.endswith(".bias"):
        return (rng.standard_normal(n) * 0.1).astype(np.float32)
    if name.endswith("ffn_gate_inp_shexp.weight"):  # a row of a matmul (the shared expert's gate)
        return (rng.standard_normal(n) / np.sqrt(n)).astype(np.float32)
    return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)  # norm weights near 1


def _std(name: str, role: str, cols: int) -> float:
    # Activations keep unit size through the random network; embeddings larger so that tied
    # logits spread over a useful range. An untied output is scaled up the same way: peaked
    # logits make top-1 comparisons meaningful.
    return 1.0 if role == EMBED else (3.0 if name == "output.weight" else 1.0) / np.sqrt(cols)


def _matrix(name: str, role: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((rows, cols), dtype=np.float32) * _std(name, role, cols)).astype(np.float32)


def _random_rows(qt, name, role, rows, row_elems, rng, sample: int = 16) -> np.ndarray:
    # Random blocks are off-centre and of one size whatever K: centred, then scaled to the float
    # model's std (measured on a few rows), a 28-layer random 7B keeps its activations inside
    # f16's range like a real one.
    data = random_blocks(qt, rows, row_elems, rng)
    center_blocks(qt, data)
    n = min(rows, sample)
    rms = float(np.sqrt(np.mean(np.square(dequantize(qt, data[:n], n, row_elems).astype(np.float64)))))
    if rms > 0:
        scale_blocks(qt, data, _std(name, role, row_elems) / rms)
    return data


def write_model(out: str | os.PathLike, arch: str, preset: str = "tiny", quant: str = "q8_0",
                seed: int = 0, random_blocks_: bool = False, overrides: dict | None = None) -> dict:
    """Write a synthetic model; returns {tensor name: type name}."""
    if (arch, preset) not in PRESETS:
        known = ", ".join(f"{a}/{p}" for a, p in PRESETS)
        raise InvalidRequest(f"no preset {arch}/{preset}; known: {known}")
    quant = quant.lower()
    if quant not in QUANTS:
        raise InvalidRequest(f"unknown quant {quant!r}; one of {', '.join(QUANTS)}")
    p = replace(PRESETS[(arch, preset)], **(overrides or {}))
    md = _metadata(arch, p, f"minferd-synth {arch} {preset} {quant}")
    md.update(synth_vocab(VOCAB_KIND[arch], p.vocab, arch=arch))
    names = () if p.tied else ("output.weight",)
    spec = spec_from_metadata(md, out, names, p.vocab)
    layout = MODELS[arch].expected_tensors(spec)
    rng = np.random.default_rng(seed)

    w = GGUFWriter(os.fspath(out), arch)
    add_metadata(w, {k: v for k, v in md.items() if k != "general.architecture"})
    plan = []
    for name, (shape, role) in layout.items():
        row_elems, rows = shape[0], int(np.prod(shape[1:])) if len(shape) > 1 else 1
        qt = TYPES[p.experts_type] if role == EXPERTS and p.experts_type else tensor_type(
            name, role, quant, p.layers, row_elems, p.tied)
        nbytes = rows * row_bytes(qt, row_elems)
        # The writer takes NumPy order, its last axis in bytes: a 3D tensor (stacked experts) stays 3D.
        byte_shape = (*reversed(shape[1:]), nbytes // rows) if len(shape) > 1 else (nbytes,)
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=GGMLQuantizationType(qt.ggml_id))
        plan.append((name, role, qt, rows, row_elems))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, role, qt, rows, row_elems in plan:
        if role == VECTOR:
            data = _vector(name, row_elems * rows, rng).view(np.uint8)
        elif random_blocks_:
            data = _random_rows(qt, name, role, rows, row_elems, rng)
        else:
            data = _quantize_rows(qt, name, role, rows, row_elems, rng)
        w.write_tensor_data(data)
    w.close()
    return {name: qt.name for name, _, qt, _, _ in plan}


def _quantize_rows(qt, name, role, rows, row_elems, rng, chunk: int = 4096) -> np.ndarray:
    out = np.empty((rows, row_bytes(qt, row_elems)), np.uint8)
    for r in range(0, rows, chunk):
        n = min(chunk, rows - r)
        out[r:r + n] = quantize(qt, _matrix(name, role, n, row_elems, rng))
    return out
