"""Every malformed model file is refused with one ModelFileError naming the file and the problem."""
import struct

import numpy as np
import pytest

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
    # IQ4_NL has Q4_0's block size (18 bytes per 32), so only the type id is wrong.
    rewrite(good, p, tensors={"blk.0.attn_q.weight": {"type": "IQ4_NL"}})
    msg = refused(p, "blk.0.attn_q.weight", "IQ4_NL")
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
