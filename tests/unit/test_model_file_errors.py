"""Every malformed model file is refused with one ModelFileError naming the file and the problem."""
import struct

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from minferd.errors import ModelFileError
from minferd.model.loader import open_model_file
from tests.gguf_edit import DROP, rewrite


@pytest.fixture(scope="module")
def good(synth_model):
    return synth_model("qwen2", "q4_0")


def refused(path, *words):
    with pytest.raises(ModelFileError) as e:
        open_model_file(path)
    msg = str(e.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_good_file_opens(good):
    mf = open_model_file(good)
    assert mf.spec.arch == "qwen2" and mf.spec.n_layers == 2


def test_bad_magic(good, tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + good.read_bytes()[4:])
    refused(p, "bad magic")


def test_bad_version(good, tmp_path):
    p = tmp_path / "bad.gguf"
    data = bytearray(good.read_bytes())
    data[4:8] = struct.pack("<I", 99)
    p.write_bytes(bytes(data))
    refused(p, "version 99")


@pytest.mark.parametrize("size", [0, 10, 23])
def test_truncated_header(good, tmp_path, size):
    p = tmp_path / "bad.gguf"
    p.write_bytes(good.read_bytes()[:size])
    refused(p, "truncated header")


def test_truncated_metadata(good, tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(good.read_bytes()[:2000])
    refused(p)


def test_truncated_tensor_data(good, tmp_path):
    p = tmp_path / "bad.gguf"
    data = good.read_bytes()
    p.write_bytes(data[:len(data) - 1000])
    refused(p, "truncated tensor data")


def test_absurd_counts(good, tmp_path):
    p = tmp_path / "bad.gguf"
    data = bytearray(good.read_bytes())
    data[8:16] = struct.pack("<Q", 1 << 50)
    p.write_bytes(bytes(data))
    refused(p, "more than")


def test_unknown_architecture(good, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(good, p, metadata={"general.architecture": "mamba"})
    refused(p, "unknown architecture 'mamba'", "supported")


def test_unsupported_tensor_type(good, tmp_path):
    p = tmp_path / "bad.gguf"
    # IQ3_S has no dequantizer here; its data is of its size, so only the type is wrong.
    elems, size = GGML_QUANT_SIZES[GGMLQuantizationType.IQ3_S]
    data = np.zeros(256 * 256 // elems * size, np.uint8)
    rewrite(good, p, tensors={"blk.0.attn_q.weight": {"type": "IQ3_S", "data": data}})
    msg = refused(p, "blk.0.attn_q.weight", "IQ3_S")
    assert "Q4_K" in msg  # names the supported set


def test_vector_of_quantized_type(good, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(good, p, tensors={"blk.0.attn_norm.weight": {"type": "Q8_0", "data": np.zeros(272, np.uint8)}})
    refused(p, "blk.0.attn_norm.weight", "Q8_0")


def test_missing_tensor(good, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(good, p, tensors={"blk.1.ffn_down.weight": DROP})
    refused(p, "blk.1.ffn_down.weight", "missing")


def test_wrong_shape(good, tmp_path):
    p = tmp_path / "bad.gguf"
    raw = np.zeros(256 // 32 * 18 * 64, np.uint8)
    rewrite(good, p, tensors={"blk.0.attn_k.weight": {"shape": (256, 64), "data": raw}})
    refused(p, "blk.0.attn_k.weight", "shape [256, 64]", "expected [256, 128]")


def test_absurd_dimensions(good, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(good, p, tensors={"blk.0.attn_q.weight": {"shape": (256, 1 << 41)}})
    refused(p, "blk.0.attn_q.weight")


def test_absurd_metadata(good, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(good, p, metadata={"qwen2.block_count": 1 << 30})
    refused(p, "block_count")


def test_missing_metadata(good, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(good, p, metadata={"qwen2.embedding_length": DROP})
    refused(p, "embedding_length", "missing")


def test_not_a_file(tmp_path):
    refused(tmp_path / "nope.gguf", "cannot read")


@pytest.fixture(scope="module")
def moe(synth_model):
    return synth_model("qwen3moe", "q8_0")


def test_moe_file_opens(moe):
    s = open_model_file(moe).spec
    assert (s.n_expert, s.n_expert_used, s.expert_ffn) == (8, 2, 128)


@pytest.mark.parametrize("key, value, words", [
    ("qwen3moe.expert_used_count", 9, ("expert_used_count = 9", "[1, 8]")),
    ("qwen3moe.expert_used_count", 0, ("expert_used_count = 0",)),
    ("qwen3moe.expert_count", 1 << 20, ("expert_count",)),
    ("qwen3moe.expert_count", 1, ("expert_count",)),
    ("qwen3moe.expert_count", DROP, ("expert_count", "missing")),
    ("qwen3moe.expert_feed_forward_length", 0, ("expert_feed_forward_length",)),
])
def test_bad_moe_metadata(moe, tmp_path, key, value, words):
    p = tmp_path / "bad.gguf"
    rewrite(moe, p, metadata={key: value})
    refused(p, *words)


def test_missing_expert_tensor(moe, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(moe, p, tensors={"blk.1.ffn_down_exps.weight": DROP})
    refused(p, "blk.1.ffn_down_exps.weight", "missing")


@pytest.mark.parametrize("shape", [(256, 128, 4), (256, 1024)])  # too few experts; experts flattened to 2D
def test_wrong_expert_shape(moe, tmp_path, shape):
    p = tmp_path / "bad.gguf"
    raw = np.zeros(256 // 32 * 34 * int(np.prod(shape[1:])), np.uint8)
    rewrite(moe, p, tensors={"blk.0.ffn_up_exps.weight": {"shape": shape, "data": raw}})
    refused(p, "blk.0.ffn_up_exps.weight", f"shape {list(shape)}", "expected [256, 128, 8]")


@pytest.fixture(scope="module")
def oss(synth_model):
    return synth_model("gpt-oss", "q8_0")


@pytest.mark.parametrize("key, value, words", [
    ("gpt-oss.attention.sliding_window", DROP, ("sliding_window", "missing")),  # llama.cpp requires it
    ("gpt-oss.attention.sliding_window", 0, ("sliding_window = 0",)),
    ("gpt-oss.attention.sliding_window_pattern", 0, ("sliding_window_pattern = 0",)),
    ("gpt-oss.expert_feed_forward_length", DROP, ("expert_feed_forward_length", "missing")),
    ("gpt-oss.expert_used_count", 9, ("expert_used_count = 9", "[1, 8]")),
    ("gpt-oss.rope.scaling.factor", 0.5, ("rope.scaling.factor 0.5", "below 1")),
    ("gpt-oss.rope.freq_base", 1.0, ("rope.freq_base 1.0", "YaRN")),
    ("gpt-oss.rope.scaling.original_context_length", 0, ("original_context_length = 0",)),
    ("gpt-oss.rope.scaling.yarn_beta_fast", -1.0, ("yarn_beta_fast = -1.0",)),
    ("gpt-oss.rope.scaling.attn_factor", 2.0, ("rope.scaling.attn_factor = 2.0", "not supported")),
    ("gpt-oss.rope.scaling.type", "longrope", ("rope scaling 'longrope'", "not supported")),
])
def test_bad_gpt_oss_metadata(oss, tmp_path, key, value, words):
    p = tmp_path / "bad.gguf"
    rewrite(oss, p, metadata={key: value})
    refused(p, *words)


@pytest.mark.parametrize("name", ["output.weight", "blk.1.attn_sinks.weight", "blk.0.post_attention_norm.weight",
                                  "blk.0.attn_output.bias", "blk.0.ffn_gate_inp.bias", "blk.1.ffn_down_exps.bias"])
def test_missing_gpt_oss_tensor(oss, tmp_path, name):
    p = tmp_path / "bad.gguf"
    rewrite(oss, p, tensors={name: DROP})
    refused(p, name, "missing")


def test_wrong_expert_bias_shape(oss, tmp_path):
    p = tmp_path / "bad.gguf"
    rewrite(oss, p, tensors={"blk.0.ffn_up_exps.bias": {"shape": (128, 4), "data": np.zeros(128 * 4 * 4, np.uint8)}})
    refused(p, "blk.0.ffn_up_exps.bias", "shape [128, 4]", "expected [128, 8]")
