"""The servicer's SamplingParams from a request's message: made once per distinct small message."""
import pytest

from minferd._proto import pb2
from minferd.errors import InvalidRequest
from minferd.server import SAMPLING_CACHE_BYTES, _sampling_cached, sampling


def test_the_same_parameters_give_the_same_checked_object():
    a = sampling(pb2.SamplingParams(temperature=0.0, max_tokens=3, stop=["\n"]))
    assert sampling(pb2.SamplingParams(temperature=0.0, max_tokens=3, stop=["\n"])) is a
    assert (a.temperature, a.max_tokens, a.stop, a.top_k) == (0.0, 3, ("\n",), 40)  # unset: llama.cpp's defaults
    b = sampling(pb2.SamplingParams(temperature=0.0, max_tokens=4, stop=["\n"]))
    assert b is not a and b.max_tokens == 4


def test_bad_parameters_are_refused_every_time():
    for _ in range(2):
        with pytest.raises(InvalidRequest, match="top_p"):
            sampling(pb2.SamplingParams(top_p=1.5))


def test_long_stop_strings_are_checked_but_never_kept():
    before = _sampling_cached.cache_info().currsize
    p = sampling(pb2.SamplingParams(stop=["x" * SAMPLING_CACHE_BYTES]))
    assert p.stop == ("x" * SAMPLING_CACHE_BYTES,)
    assert _sampling_cached.cache_info().currsize == before
    assert sampling(pb2.SamplingParams(stop=["x" * SAMPLING_CACHE_BYTES])) is not p
