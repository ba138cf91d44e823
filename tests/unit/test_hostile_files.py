"""Hostile GGUF files: every one is refused with one ModelFileError naming the file and the problem,
quickly and without allocating much; random mutations of a valid file never raise anything else."""
from __future__ import annotations

import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minferd.errors import ModelFileError
from minferd.model.loader import open_model_file
from minferd.model.tokenizer import Tokenizer, read_tokenizer_metadata
from tests.gguf_raw import parse
from tests.hostile_gguf import make_corpus

MAX_SECONDS = 2.0
MAX_PEAK_BYTES = 64 << 20


@pytest.fixture(scope="module")
def good(synth_model):
    return synth_model("qwen2", "q4_0")


@pytest.fixture(scope="module")
def corpus(good, tmp_path_factory):
    return make_corpus(good, tmp_path_factory.mktemp("hostile"))


def open_and_tokenize(path):
    """What the daemon does with a file before it uploads anything: open and check it, build the
    tokenizer (host.py does exactly these two steps)."""
    mf = open_model_file(path)
    return mf, Tokenizer.from_metadata(read_tokenizer_metadata(mf.gguf))


def test_good_file_opens(good):
    mf, tok = open_and_tokenize(good)
    assert mf.spec.arch == "qwen2" and tok.vocab_size == mf.spec.n_vocab


def test_corpus_is_large_and_varied(corpus):
    assert len(corpus) >= 50
    assert len({p.name.split("-", 1)[1] for p, _ in corpus}) == len(corpus)


def test_every_hostile_file_is_refused(corpus):
    failures, messages = [], set()
    for path, words in corpus:
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            open_and_tokenize(path)
            outcome = "opened"
        except ModelFileError as e:
            outcome = str(e)
        except Exception as e:  # noqa: BLE001 - the point: nothing but ModelFileError
            outcome = f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if not outcome.startswith(f"{path}: "):
            failures.append(f"{path.name}: not a ModelFileError naming the file: {outcome[:300]}")
            continue
        problem = outcome[len(f"{path}: "):]
        messages.add(problem)
        missing = [w for w in words if w not in problem]
        if missing:
            failures.append(f"{path.name}: {missing} not in {problem[:300]!r}")
        if seconds > MAX_SECONDS:
            failures.append(f"{path.name}: took {seconds:.2f} s")
        if peak > MAX_PEAK_BYTES:
            failures.append(f"{path.name}: peak Python allocation {peak >> 20} MiB")
    assert not failures, "\n".join(failures)
    assert len(messages) >= 40  # the refusals say what is wrong, not one generic line


# ---- fuzz: random mutations of a small valid file -----------------------------------------------
# Little-endian values that cross parsers' edges: counts, lengths, type ids, offsets.
EDGES = [struct.pack("<Q", v) for v in (0, 1, 2, 4, 5, 31, 63, 1 << 31, (1 << 32) - 1, 1 << 32,
                                         1 << 40, 1 << 62, 1 << 63, (1 << 64) - 1)]


@st.composite
def mutation(draw, size: int, meta_end: int):
    # Mostly where the parser looks (header, metadata, tensor infos), sometimes anywhere.
    at = draw(st.one_of(st.integers(0, meta_end), st.integers(0, meta_end),
                        st.integers(0, meta_end), st.integers(0, size)))
    kind = draw(st.sampled_from(["overwrite", "edge", "truncate", "insert", "delete"]))
    if kind == "overwrite":
        return kind, at, draw(st.binary(min_size=1, max_size=8))
    if kind == "edge":
        value = draw(st.sampled_from(EDGES))
        return kind, at, value[:draw(st.sampled_from([1, 2, 4, 8]))]
    if kind == "insert":
        return kind, at, draw(st.binary(min_size=1, max_size=16))
    if kind == "delete":
        return kind, at, draw(st.integers(1, 16))
    return kind, at, None


def apply(data: bytes, muts) -> bytes:
    b = bytearray(data)
    for kind, at, arg in muts:
        at = min(at, len(b))
        if kind in ("overwrite", "edge"):
            b[at:at + len(arg)] = arg
        elif kind == "truncate":
            del b[at:]
        elif kind == "insert":
            b[at:at] = arg
        else:
            del b[at:at + arg]
    return bytes(b)


@pytest.fixture(scope="module")
def fuzz_base(good, tmp_path_factory):
    data = good.read_bytes()
    _, layout = parse(data)
    return data, layout.data_offset + 64, tmp_path_factory.mktemp("fuzz") / "mutant.gguf"


def test_fuzz_opens_or_refuses(fuzz_base):
    data, meta_end, path = fuzz_base

    @settings(max_examples=200, deadline=2000, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(mutation(len(data), meta_end), min_size=1, max_size=3))
    def check(muts):
        path.write_bytes(apply(data, muts))
        try:
            open_and_tokenize(path)
        except ModelFileError as e:
            assert str(e).startswith(f"{path}: ")

    check()
