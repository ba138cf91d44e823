"""IQ4_NL, IQ4_XS and MXFP4 (the table types): decoding bit for bit equal to gguf.quants (and
to ggml's own C decoders) on every scale the formats can hold, synth's fallback for rows IQ4_XS
cannot hold, and the CUDA load paths refusing up front a type the device has no kernels for (as
these were until session 10; devices.TENSOR_TYPES, narrowed here). test_quant.py covers them with the
other types as well (table sizes, round trip, random blocks, centring and scaling)."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import gguf.quants
from gguf.constants import GGMLQuantizationType

from minferd.available import describe
from minferd.backend.cpu import HostMemory
from minferd import devices
from minferd.devices import cuda_traits
from minferd.errors import ModelFileError
from minferd.host import Host
from minferd.kernels.dequant_ref import dequantize
from minferd.kernels.quant import CUDA_TYPES, QK_K, TYPES
from minferd.model.loader import check_backend, load_local, open_model_file
from minferd.model.synth import tensor_type
from minferd.model.arch.llama import MATMUL

NEW = ["IQ4_NL", "IQ4_XS", "MXFP4"]
# f16 bit patterns of d: zeros, smallest and largest subnormal, smallest normal, 1, the
# largest finite, inf, NaN; each with both signs.
F16_EDGES = np.array([0x0000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x7C00, 0x7E00], np.uint16)
F16_EDGES = np.concatenate([F16_EDGES, F16_EDGES | 0x8000])


def assert_same(name, raw, n_blocks):
    """Our decode of raw (n_blocks blocks) equals gguf's bit for bit, NaN payloads included."""
    qt = TYPES[name]
    with np.errstate(all="ignore"):
        got = dequantize(qt, raw, 1, n_blocks * qt.block_elems)[0]
        want = gguf.quants.dequantize(raw.reshape(-1), GGMLQuantizationType[name]).reshape(-1).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def test_every_type_runs_on_both_backends():
    assert set(CUDA_TYPES) == set(TYPES) and set(NEW) <= set(TYPES)


@pytest.fixture
def cuda_without(monkeypatch):
    """The CUDA backend as if it had no kernels for `names`."""
    def narrow(*names):
        monkeypatch.setitem(devices.TENSOR_TYPES, "cuda", devices.TENSOR_TYPES["cuda"] - set(names))
    return narrow


@pytest.mark.parametrize("name", NEW)
def test_arbitrary_blocks_equal_gguf(name):
    """Random bytes: every f16 d (NaN and inf ones among them), e8m0 exponent and nibble."""
    qt = TYPES[name]
    raw = np.random.default_rng(11).integers(0, 256, 4096 * qt.block_bytes, dtype=np.uint8)
    assert_same(name, raw, 4096)


@pytest.mark.parametrize("name", NEW)
def test_arbitrary_blocks_equal_ggml_itself(name):
    """The same against ggml's C dequantize_row_* (libggml-base of llama-cpp-python), where present."""
    llama_cpp = pytest.importorskip("llama_cpp")
    so = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    if not so.exists():
        pytest.skip(f"no {so}")
    fn = getattr(ctypes.CDLL(str(so)), f"dequantize_row_{name.lower()}")
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    qt = TYPES[name]
    raw = np.random.default_rng(14).integers(0, 256, (4096, qt.block_bytes), dtype=np.uint8)
    if name == "MXFP4":
        raw[:256, 0] = np.arange(256)  # every exponent
    want = np.empty(4096 * qt.block_elems, np.float32)
    fn(raw.ctypes.data, want.ctypes.data, want.size)
    with np.errstate(all="ignore"):
        got = dequantize(qt, raw, 1, want.size)[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS"])
def test_extreme_f16_scales_equal_gguf(name):
    qt = TYPES[name]
    rng = np.random.default_rng(12)
    blocks = rng.integers(0, 256, (len(F16_EDGES) * 8, qt.block_bytes), dtype=np.uint8)
    blocks[:, 0:2] = np.repeat(F16_EDGES, 8).astype("<u2").view(np.uint8).reshape(-1, 2)
    assert_same(name, blocks.reshape(-1), len(blocks))


def test_iq4_xs_every_sub_block_scale():
    """All 64 6-bit scales, in each of the 8 sub-block positions, with a plain and a subnormal d."""
    qt = TYPES["IQ4_XS"]
    rng = np.random.default_rng(13)
    blocks = rng.integers(0, 256, (128, qt.block_bytes), dtype=np.uint8)
    ls = (np.arange(128 * 8).reshape(128, 8) * 9 + np.arange(128)[:, None]) % 64  # every value at every position
    blocks[:, 0:2] = np.where(np.arange(128) % 2, 0x3C00, 0x0123).astype("<u2").reshape(-1, 1).view(np.uint8)
    blocks[:, 2:4] = np.bitwise_or.reduce((ls >> 4).astype(np.uint16) << np.arange(0, 16, 2, dtype=np.uint16),
                                          axis=1).astype("<u2").reshape(-1, 1).view(np.uint8)
    blocks[:, 4:8] = (ls[:, 0::2] & 0x0F) | ((ls[:, 1::2] & 0x0F) << 4)
    assert_same("IQ4_XS", blocks.reshape(-1), 128)
    # and the scales decode where ggml reads them: sub-block i of block b is d * (ls - 32) * kvalue
    y = dequantize(qt, blocks[1::2].reshape(-1), 1, 64 * QK_K)[0].reshape(64, 8, 32)
    q = blocks[1::2, 8:].reshape(64, 8, 16)
    first = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])[q[..., 0] & 0x0F]
    assert np.array_equal(y[..., 0], ((ls[1::2] - 32) * first).astype(np.float32))


def test_mxfp4_every_exponent_and_nibble():
    """e8m0 0..255 (0 and 1 decode as f32 subnormals, 255 to 2^127: 12 x 2^127 overflows to inf
    in ggml as here) times all 16 e2m1 codes in both nibble halves."""
    qt = TYPES["MXFP4"]
    blocks = np.zeros((256, qt.block_bytes), np.uint8)
    blocks[:, 0] = np.arange(256)
    codes = np.arange(16, dtype=np.uint8)
    blocks[:, 1:] = codes | (codes[::-1] << 4)
    assert_same("MXFP4", blocks.reshape(-1), 256)
    with np.errstate(over="ignore"):
        y = dequantize(qt, blocks.reshape(-1), 1, 256 * 32)[0].reshape(256, 32)
    assert y[127, 1] == 0.5 and y[127, 7] == 6.0 and y[127, 30] == 0.5  # e 127: scale 1, plain e2m1
    assert y[127, 15] == -6.0 and y[127, 16] == -6.0 and y[128, 7] == 12.0
    assert y[0, 1] == np.float32(2.0 ** -128) and y[1, 1] == np.float32(2.0 ** -127)
    assert np.isinf(y[255, 7]) and not np.isnan(y).any()


def test_synth_falls_back_like_llama_cpp():
    """llama.cpp's quantizer gives IQ4_NL to rows IQ4_XS cannot hold (not 256-element multiples)."""
    assert tensor_type("blk.0.attn_q.weight", MATMUL, "iq4_xs", 2, 896, True).name == "IQ4_NL"
    assert tensor_type("blk.0.attn_q.weight", MATMUL, "iq4_xs", 2, 512, True).name == "IQ4_XS"
    assert tensor_type("blk.0.attn_q.weight", MATMUL, "mxfp4", 2, 96, True).name == "MXFP4"


@pytest.mark.parametrize("quant", ["iq4_nl", "mxfp4"])
def test_cuda_refuses_a_type_it_has_no_kernels_for(synth_model, quant, cuda_without):
    cuda_without(quant.upper())
    mf = open_model_file(synth_model("qwen2", quant))
    try:
        check_backend(mf, "cpu")  # the CPU runs them
        with pytest.raises(ModelFileError) as e:
            check_backend(mf, "cuda:0")
    finally:
        mf.close()
    msg = str(e.value)
    assert str(mf.path) in msg and "token_embd.weight" in msg and quant.upper() in msg
    assert "CPU backend only so far, not cuda:0" in msg
    with pytest.raises(ModelFileError, match="CPU backend only"):  # before the CUDA backend is imported
        load_local(mf.path, device="cuda:0")


def test_a_cuda_host_refuses_before_reserving_or_making_a_backend(synth_model, cuda_without):
    """The daemon's load path on a CUDA host, without CuPy: refused from the header alone."""
    cuda_without("IQ4_XS", "IQ4_NL")
    def no_backend(**kw):
        raise AssertionError("a backend was made for a file the device cannot run")

    h = Host(no_backend, HostMemory(), cuda_traits(), 1 << 30, w16_min_bytes=0, device="cuda:0")
    path = synth_model("llama", "iq4_xs")
    with pytest.raises(ModelFileError, match="IQ4_XS, which runs on the CPU backend only"):
        h.load("m", path)
    assert h.ledger.free() == 1 << 30 and not h.models and not h.weight_sets
    listed = describe(h, [path.parent], path.stem, path)  # ListAvailable says why, with no plan
    assert "IQ4_XS, which runs on the CPU backend only" in listed["error"] and "plan" not in listed
