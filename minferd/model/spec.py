"""ModelSpec: the shapes and hyperparameters of a model, read from GGUF metadata alone."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minferd.errors import ModelFileError

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe", "gpt-oss")
# llama.cpp's rope type per architecture: NORM rotates adjacent pairs, NEOX the two halves.
ROPE_TYPE = {"llama": "normal", "qwen2": "neox", "qwen3": "neox", "gemma3": "neox", "qwen3moe": "neox",
             "qwen2moe": "neox", "gpt-oss": "neox"}
# Gemma 3: five sliding-window layers, then one global layer; local layers use base 10k.
GEMMA3_SWA_PERIOD = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
# Sliding-window layers, then a full one, in periods of this many layers (the file may say otherwise).
SWA_PERIOD = {"gemma3": GEMMA3_SWA_PERIOD, "gpt-oss": 2}
# Limits past which a header is absurd rather than big (they keep estimates finite).
MAX_LAYERS, MAX_HIDDEN, MAX_HEADS, MAX_CTX = 1024, 1 << 17, 1024, 1 << 24
MAX_FFN = 1 << 20
MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS
MOE_ARCHITECTURES = ("qwen3moe", "qwen2moe", "gpt-oss")
# YaRN rope scaling: only where the forward pass passes it to rope (the CUDA rope lacks it so far).
YARN_ARCHITECTURES = ("gpt-oss",)


@dataclass(frozen=True, slots=True)
class Yarn:
    """YaRN rope scaling as llama.cpp applies it (ggml's rope_yarn). Each rotary pair's angle blends
    the position-scaled one (interpolated, ModelSpec.rope_scale) into the unscaled one (extrapolated)
    along a ramp over the pair index, from full extrapolation below corr_dims()[0] to full
    interpolation past corr_dims()[1]; cos and sin are multiplied by 1 + 0.1 ln(1 / rope_scale)."""

    orig_ctx: int  # the context the model was trained at before the stretch
    # The ramp runs from the pair that turns beta_fast times over orig_ctx positions to the one that
    # turns beta_slow times (llama.cpp's defaults; a file may set them).
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def corr_dims(self, n_dims: int, base: float) -> tuple[float, float]:
        def dim(rotations):  # the pair index that turns `rotations` times over orig_ctx positions
            return n_dims * math.log(self.orig_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))
        return max(0.0, math.floor(dim(self.beta_fast))), min(n_dims - 1.0, math.ceil(dim(self.beta_slow)))

    def freq_factors(self, n_dims: int, base: float, scale: float) -> np.ndarray:
        """(n_dims / 2,) divisors of each pair's unscaled frequency that make YaRN's blended angle
        (rope kernels' freq_factors, with the position scale then 1): 1 / scale where the pair
        interpolates, 1 where it extrapolates, the ramp between."""
        low, high = self.corr_dims(n_dims, base)
        keep = 1 - np.clip((np.arange(n_dims // 2) - low) / max(0.001, high - low), 0, 1)
        return 1 / (scale + (1 - scale) * keep)

    @staticmethod
    def mscale(scale: float) -> float:
        """What cos and sin are multiplied by."""
        return 1 + 0.1 * math.log(1 / scale)


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
    shared_ffn: int = 0  # qwen2moe: the shared expert's hidden width
    yarn: Yarn | None = None  # YaRN rope scaling (rope_scale is then its interpolation)

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
    scale, yarn, scaling = 1.0, None, md.get(a + "rope.scaling.type")
    if scaling == "linear" or (scaling == "yarn" and arch in YARN_ARCHITECTURES):
        factor = _get(md, path, a + "rope.scaling.factor", 1.0, float)
        if not (factor > 0 and math.isfinite(factor)):  # a factor of 0 was a ZeroDivisionError
            raise ModelFileError(path, f"rope.scaling.factor {factor} must be positive")
        scale = 1.0 / factor
        if scaling == "yarn":
            yarn = _yarn(md, path, a, factor, ctx, rope_base)
    elif scaling not in (None, "none"):
        raise ModelFileError(path, f"rope scaling {scaling!r} is not supported for {arch}")

    window = 0
    swa = (False,) * n_layers
    if arch in SWA_PERIOD:
        # Range-checked: a pattern of 0 was a ZeroDivisionError, a negative window a bad cache.
        # gpt-oss must say its window (llama.cpp requires the key); Gemma's 0 means none.
        gpt_oss = arch == "gpt-oss"
        window = _check_range(path, a + "attention.sliding_window", _get(
            md, path, a + "attention.sliding_window", None if gpt_oss else 0), int(gpt_oss), MAX_CTX)
        if window:
            period = _check_range(path, a + "attention.sliding_window_pattern", _get(
                md, path, a + "attention.sliding_window_pattern", SWA_PERIOD[arch]), 1, MAX_LAYERS)
            swa = tuple((i + 1) % period != 0 for i in range(n_layers))
    rope_base_swa = rope_base
    if arch == "gemma3":
        rope_base_swa = GEMMA3_LOCAL_ROPE_BASE
    elif arch == "gpt-oss":  # llama.cpp reads it for gpt-oss (the real files do not set it)
        rope_base_swa = _positive(md, path, a + "rope.freq_base_swa", rope_base)
    n_expert = n_used = expert_ffn = 0
    if arch in MOE_ARCHITECTURES:
        # At least 2: one expert is a dense layer (and its 1-row router would be taken for a vector).
        n_expert = _check_range(path, a + "expert_count", _get(md, path, a + "expert_count"), 2, MAX_EXPERTS)
        n_used = _check_range(path, a + "expert_used_count", _get(md, path, a + "expert_used_count"), 1, n_expert)
        # llama.cpp's default when a qwen3moe file does not say: the dense width split over the
        # used experts (gpt-oss must say it).
        default = None if arch == "gpt-oss" else max(1, ffn // n_used)
        expert_ffn = _check_range(path, a + "expert_feed_forward_length", _get(
            md, path, a + "expert_feed_forward_length", default), 1, MAX_FFN)
    shared_ffn = 0
    if arch == "qwen2moe":  # the shared expert's width; llama.cpp's default: the dense width
        shared_ffn = _check_range(path, a + "expert_shared_feed_forward_length", _get(
            md, path, a + "expert_shared_feed_forward_length", ffn), 1, MAX_FFN)
    # Through _get: a string vocab_size was a ValueError from int() below, not a ModelFileError.
    if md.get(a + "vocab_size") is not None:
        n_vocab = _check_range(path, a + "vocab_size", _get(md, path, a + "vocab_size"), 1, 1 << 31)
    if not n_vocab:
        raise ModelFileError(path, "vocabulary size unknown (no tokenizer.ggml.tokens and no vocab_size)")

    return ModelSpec(
        arch=arch, n_vocab=int(n_vocab), hidden=hidden, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim, ffn=ffn, ctx_train=ctx, norm_eps=eps,
        rope_type=ROPE_TYPE[arch], rope_base=rope_base, rope_base_swa=rope_base_swa,
        rope_scale=scale, sliding_window=window, swa_layers=swa,
        tied_embeddings="output.weight" not in tensor_names,
        qkv_bias=arch in ("qwen2", "qwen2moe", "gpt-oss"), qk_norm=arch in ("qwen3", "gemma3", "qwen3moe"),
        embed_scale=math.sqrt(hidden) if arch == "gemma3" else 1.0,
        attn_scale=1.0 / math.sqrt(head_dim),
        n_expert=n_expert, n_expert_used=n_used, expert_ffn=expert_ffn, shared_ffn=shared_ffn, yarn=yarn,
    )


def _positive(md: dict, path, key: str, default: float) -> float:
    v = _get(md, path, key, default, float)
    if not (v > 0 and math.isfinite(v)):
        raise ModelFileError(path, f"metadata {key} = {v} must be positive and finite")
    return v


def _yarn(md: dict, path, a: str, factor: float, ctx: int, rope_base: float) -> Yarn:
    if factor < 1:  # YaRN stretches the context; llama.cpp's magnitude correction assumes it
        raise ModelFileError(path, f"rope.scaling.factor {factor} is below 1, which YaRN does not shrink")
    if rope_base <= 1:  # the ramp divides by ln(base)
        raise ModelFileError(path, f"rope.freq_base {rope_base} must be above 1 for YaRN")
    # llama.cpp honours these when a file sets them; nothing here models them, so refuse, not differ.
    for key, neutral in (("rope.scaling.attn_factor", 1.0), ("rope.scaling.yarn_log_multiplier", 0.0)):
        if md.get(a + key) is not None and _get(md, path, a + key, kind=float) != neutral:
            raise ModelFileError(path, f"metadata {a + key} = {md[a + key]} is not supported")
    orig = _check_range(path, a + "rope.scaling.original_context_length",
                        _get(md, path, a + "rope.scaling.original_context_length", ctx), 1, MAX_CTX)
    return Yarn(orig, _positive(md, path, a + "rope.scaling.yarn_beta_fast", 32.0),
                _positive(md, path, a + "rope.scaling.yarn_beta_slow", 1.0))
