"""ModelSpec: the shapes and hyperparameters of a model, read from GGUF metadata alone."""
from __future__ import annotations

import math
from dataclasses import dataclass

from minferd.errors import ModelFileError

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe")
# llama.cpp's rope type per architecture: NORM rotates adjacent pairs, NEOX the two halves.
ROPE_TYPE = {"llama": "normal", "qwen2": "neox", "qwen3": "neox", "gemma3": "neox", "qwen3moe": "neox"}
# Gemma 3: five sliding-window layers, then one global layer; local layers use base 10k.
GEMMA3_SWA_PERIOD = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
# Limits past which a header is absurd rather than big (they keep estimates finite).
MAX_LAYERS, MAX_HIDDEN, MAX_HEADS, MAX_CTX = 1024, 1 << 17, 1024, 1 << 24
MAX_FFN = 1 << 20
MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS
MOE_ARCHITECTURES = ("qwen3moe",)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    arch: str
    n_vocab: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    ctx_train: int
    norm_eps: float
    rope_type: str  # "normal" | "neox"
    rope_base: float
    rope_base_swa: float
    rope_scale: float  # linear position scaling (1.0 = none)
    sliding_window: int  # 0 = none
    swa_layers: tuple[bool, ...]  # per layer: does it use the sliding window
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    embed_scale: float  # gemma multiplies embeddings by sqrt(hidden)
    attn_scale: float  # multiplies q before q.k
    n_expert: int = 0  # MoE: experts per layer (0 = a dense MLP)
    n_expert_used: int = 0  # experts each token is routed to
    expert_ffn: int = 0  # one expert's hidden width

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def _get(md: dict, path, key: str, default=None, kind=int):
    v = md.get(key, default)
    if v is None:
        raise ModelFileError(path, f"metadata key {key} is missing")
    if isinstance(v, (list, str)) or (kind is int and not float(v).is_integer()):
        raise ModelFileError(path, f"metadata key {key} has a value of the wrong type: {v!r}")
    return kind(v)


def _check_range(path, key: str, value, lo, hi):
    if not lo <= value <= hi:
        raise ModelFileError(path, f"metadata {key} = {value} is outside [{lo}, {hi}]")
    return value


def spec_from_metadata(md: dict, path, tensor_names=(), n_vocab: int | None = None) -> ModelSpec:
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFileError(path, f"unknown architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    a = arch + "."
    hidden = _check_range(path, a + "embedding_length", _get(md, path, a + "embedding_length"), 1, MAX_HIDDEN)
    n_layers = _check_range(path, a + "block_count", _get(md, path, a + "block_count"), 1, MAX_LAYERS)
    n_heads = _check_range(path, a + "attention.head_count", _get(md, path, a + "attention.head_count"), 1, MAX_HEADS)
    n_kv = _get(md, path, a + "attention.head_count_kv", n_heads)
    _check_range(path, a + "attention.head_count_kv", n_kv, 1, n_heads)
    if n_heads % n_kv:
        raise ModelFileError(path, f"head_count {n_heads} is not a multiple of head_count_kv {n_kv}")
    head_dim = _get(md, path, a + "attention.key_length", hidden // n_heads)
    _check_range(path, a + "attention.key_length", head_dim, 2, 1024)
    if head_dim % 2:
        raise ModelFileError(path, f"head dimension {head_dim} is odd; rope needs pairs")
    if _get(md, path, a + "attention.value_length", head_dim) != head_dim:
        raise ModelFileError(path, "attention.value_length differs from key_length (not supported)")
    ffn = _check_range(path, a + "feed_forward_length", _get(md, path, a + "feed_forward_length"), 1, MAX_FFN)
    ctx = _check_range(path, a + "context_length", _get(md, path, a + "context_length", 4096), 1, MAX_CTX)
    eps = _get(md, path, a + "attention.layer_norm_rms_epsilon", 1e-6, float)
    if not (eps >= 0 and math.isfinite(eps)):  # a NaN epsilon turns every output into NaN, silently
        raise ModelFileError(path, f"attention.layer_norm_rms_epsilon {eps} must be finite and >= 0")
    rope_base = _get(md, path, a + "rope.freq_base", 10000.0, float)
    if not (rope_base > 0 and math.isfinite(rope_base)):
        raise ModelFileError(path, f"rope.freq_base {rope_base} must be positive")
    rope_dims = _get(md, path, a + "rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise ModelFileError(path, f"partial rope ({rope_dims} of {head_dim} dims) is not supported")
    scale = 1.0
    if md.get(a + "rope.scaling.type") == "linear":
        factor = _get(md, path, a + "rope.scaling.factor", 1.0, float)
        if not (factor > 0 and math.isfinite(factor)):  # a factor of 0 was a ZeroDivisionError
            raise ModelFileError(path, f"rope.scaling.factor {factor} must be positive")
        scale = 1.0 / factor
    elif md.get(a + "rope.scaling.type") not in (None, "none"):
        raise ModelFileError(path, f"rope scaling {md[a + 'rope.scaling.type']!r} is not supported")

    window = 0
    swa = (False,) * n_layers
    if arch == "gemma3":
        # Range-checked: a pattern of 0 was a ZeroDivisionError, a negative window a bad cache.
        window = _check_range(path, a + "attention.sliding_window",
                              _get(md, path, a + "attention.sliding_window", 0), 0, MAX_CTX)
        if window:
            period = _check_range(path, a + "attention.sliding_window_pattern", _get(
                md, path, a + "attention.sliding_window_pattern", GEMMA3_SWA_PERIOD), 1, MAX_LAYERS)
            swa = tuple((i + 1) % period != 0 for i in range(n_layers))
    n_expert = n_used = expert_ffn = 0
    if arch in MOE_ARCHITECTURES:
        n_expert = _check_range(path, a + "expert_count", _get(md, path, a + "expert_count"), 1, MAX_EXPERTS)
        n_used = _check_range(path, a + "expert_used_count", _get(md, path, a + "expert_used_count"), 1, n_expert)
        # llama.cpp's default when a file does not say: the dense width split over the used experts.
        expert_ffn = _check_range(path, a + "expert_feed_forward_length", _get(
            md, path, a + "expert_feed_forward_length", max(1, ffn // n_used)), 1, MAX_FFN)
    # Through _get: a string vocab_size was a ValueError from int() below, not a ModelFileError.
    if md.get(a + "vocab_size") is not None:
        n_vocab = _check_range(path, a + "vocab_size", _get(md, path, a + "vocab_size"), 1, 1 << 31)
    if not n_vocab:
        raise ModelFileError(path, "vocabulary size unknown (no tokenizer.ggml.tokens and no vocab_size)")

    return ModelSpec(
        arch=arch, n_vocab=int(n_vocab), hidden=hidden, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim, ffn=ffn, ctx_train=ctx, norm_eps=eps,
        rope_type=ROPE_TYPE[arch], rope_base=rope_base,
        rope_base_swa=GEMMA3_LOCAL_ROPE_BASE if arch == "gemma3" else rope_base,
        rope_scale=scale, sliding_window=window, swa_layers=swa,
        tied_embeddings="output.weight" not in tensor_names,
        qkv_bias=arch == "qwen2", qk_norm=arch in ("qwen3", "gemma3", "qwen3moe"),
        embed_scale=math.sqrt(hidden) if arch == "gemma3" else 1.0,
        attn_scale=1.0 / math.sqrt(head_dim),
        n_expert=n_expert, n_expert_used=n_used, expert_ffn=expert_ffn,
    )
