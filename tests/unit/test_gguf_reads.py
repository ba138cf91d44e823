"""GGUFFile reads through one descriptor with pread, never a memory map: a file that shrinks or
changes while it loads is a ModelFileError (through a map it was SIGBUS), and no refusal keeps a
descriptor open."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from minferd.devices import MatmulPath
from minferd.errors import ModelFileError
from minferd.model import gguf_file
from minferd.model.gguf_file import GGUFFile
from minferd.model.loader import make_backend, open_model_file, upload_weights
from minferd.model.source import ModelSource
from tests.hostile_gguf import make_corpus


@pytest.fixture()
def model(tmp_path, synth_model):
    p = tmp_path / "m.gguf"
    shutil.copy(synth_model("qwen2", "q8_0"), p)
    return p


def last_tensor(gf):
    return max(gf.tensors.values(), key=lambda t: t.offset)


def test_a_file_that_shrank_is_a_short_read(model):
    gf = GGUFFile(model)
    t = last_tensor(gf)
    os.truncate(model, t.offset + 10)
    with pytest.raises(ModelFileError) as e:
        gf.raw(t.name)
    msg = str(e.value)
    assert msg.startswith(f"{model}: changed while loading: tensor {t.name} needs {t.n_bytes} bytes at {t.offset}")
    assert f"the file now has {t.offset + 10} bytes" in msg


def test_the_memory_map_this_replaces_was_sigbus(model):
    """What the test above guards against: the same read through np.memmap kills the process."""
    code = ("import numpy as np, os, sys; m = np.memmap(sys.argv[1], mode='r'); "
            "os.truncate(sys.argv[1], 0); print(int(m[-1]))")
    assert subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True).returncode == -7


def test_a_file_written_to_while_loading_is_refused(model):
    mf = open_model_file(model)
    backend, _ = make_backend("cpu", 1)
    st = os.stat(model)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # as a `cp` over it leaves it
    with pytest.raises(ModelFileError, match="changed while loading: it was written to"):
        upload_weights(mf, backend, backend.untracked(), MatmulPath.MMQ)
    mf.close()


def test_the_file_read_is_the_file_opened(model, synth_model):
    gf = GGUFFile(model)
    t = last_tensor(gf)
    before = gf.raw(t.name).copy()
    shutil.copy(synth_model("llama", "q8_0"), model.with_name("other.gguf"))
    os.replace(model.with_name("other.gguf"), model)  # a new file under the same name
    assert np.array_equal(gf.raw(t.name), before)
    assert gf.architecture == "qwen2"


def test_raw_is_a_fresh_array(model):
    gf = GGUFFile(model)
    t = last_tensor(gf)
    a, b = gf.raw(t.name), gf.raw(t.name)
    assert a.shape == (t.n_rows, t.n_bytes // t.n_rows) and a.dtype == np.uint8
    a[...] = 0
    assert b.any() and not np.shares_memory(a, b)


def test_a_header_past_the_first_read_is_read_again_longer(model, monkeypatch):
    whole = GGUFFile(model)
    reads = []
    real_read = ModelSource.read

    def counted(self, offset, n, what):
        reads.append((offset, n))
        return real_read(self, offset, n, what)

    monkeypatch.setattr(gguf_file, "FIRST_READ", 64)
    monkeypatch.setattr(ModelSource, "read", counted)
    small = GGUFFile(model)
    assert small.metadata == whole.metadata and small.tensors == whole.tensors
    assert small.field("tokenizer.ggml.tokens") == whole.field("tokenizer.ggml.tokens")
    header_reads = [n for off, n in reads if off == 0][1:]  # after the 24 bytes of the magic check
    # Each read at least doubles: a parse that restarts costs at most as much again as the last.
    assert all(b >= 2 * a for a, b in zip(header_reads, header_reads[1:]))
    assert len(header_reads) <= (whole.reader.data_offset // 64).bit_length() + 1
    assert small.reader.data.size < 2 * whole.reader.data_offset + 64


def test_a_file_that_shrank_before_the_header_was_read(model):
    src = ModelSource.open(model)
    os.truncate(model, 1000)
    with pytest.raises(ModelFileError, match="changed while loading: the header needs"):
        GGUFFile(src)
    assert src.closed  # the GGUFFile owned it, and closed it when it refused


def test_model_file_identity_and_close(model):
    mf = open_model_file(model)
    st = os.stat(model)
    assert mf.identity == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    mf.close()
    mf.close()  # twice is harmless
    assert mf.gguf.source.closed
    with pytest.raises(ModelFileError, match="cannot read"):
        mf.gguf.raw(last_tensor(mf.gguf).name)


def test_not_a_regular_file(tmp_path):
    with pytest.raises(ModelFileError, match="not a regular file"):
        GGUFFile(tmp_path)
    os.mkfifo(tmp_path / "fifo.gguf")
    with pytest.raises(ModelFileError, match="not a regular file"):  # and it does not wait for a writer
        GGUFFile(tmp_path / "fifo.gguf")


def test_refused_files_keep_no_descriptor(synth_model, tmp_path):
    corpus = make_corpus(synth_model("qwen2", "q4_0"), tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    for path, _ in corpus:
        try:
            open_model_file(path).close()
        except ModelFileError:
            pass
        with pytest.raises(ModelFileError):
            open_model_file(tmp_path / "missing.gguf")
    assert len(os.listdir("/proc/self/fd")) == before  # no gc.collect(): closed when refused
