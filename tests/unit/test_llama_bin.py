"""bench/llama_bin.sh: llama.cpp's binaries packed on one device machine and unpacked on the next.
A stand-in llama-bench (a script) and library here; the real ones run on the device."""
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "llama_bin.sh"
pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("xz", "sha256sum", "split", "tar")),
                                reason="llama_bin.sh needs xz, sha256sum, split and tar")


def llama_bin(env, *args):
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def dirs(tmp_path):
    built, out, store, fresh = (tmp_path / n for n in ("built", "out", "store", "fresh"))
    for d in (built, out):
        d.mkdir()
    bench = built / "llama-bench"
    # FAIL_HERE: what a machine without its libraries answers
    bench.write_text("#!/bin/sh\n[ -n \"$FAIL_HERE\" ] && exit 127\n[ \"$1\" = --help ] && echo usage && exit 0\nexit 3\n")
    bench.chmod(0o755)
    (built / "llama-batched-bench").write_text("#!/bin/sh\nexit 0\n")
    (built / "llama-batched-bench").chmod(0o755)
    (built / "libggml-cuda.so").write_bytes(os.urandom(5 << 18))  # random: xz keeps its size
    env = dict(os.environ, LLAMA_STORE=str(store))
    return env, built, out, store, fresh


def test_packed_then_fetched_then_unpacked_runs(dirs):
    env, built, out, store, fresh = dirs
    r = llama_bin(dict(env, LLAMA_BIN=str(built)), "pack", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["llama-bin.tar.xz.0", "llama-bin.tar.xz.sha256"]
    assert llama_bin(env, "fetch", str(out)).returncode == 0
    r = llama_bin(dict(env, LLAMA_BIN=str(fresh)), "unpack")
    assert r.returncode == 0, r.stderr
    for name in ("llama-bench", "llama-batched-bench", "libggml-cuda.so"):
        assert (fresh / name).read_bytes() == (built / name).read_bytes()
    assert os.access(fresh / "llama-bench", os.X_OK)


def test_parts_past_the_cap_are_not_packed(dirs):
    env, built, out, _, _ = dirs
    r = llama_bin(dict(env, LLAMA_BIN=str(built), LLAMA_BIN_MAX_MIB="1"), "pack", str(out))
    assert r.returncode == 0 and "not packed" in r.stdout
    assert not list(out.iterdir())


def test_a_part_that_changed_is_refused_and_nothing_unpacked(dirs):
    env, built, out, store, fresh = dirs
    llama_bin(dict(env, LLAMA_BIN=str(built)), "pack", str(out))
    llama_bin(env, "fetch", str(out))
    part = store / "llama-bin.tar.xz.0"
    data = bytearray(part.read_bytes())
    data[-100] ^= 1
    part.write_bytes(bytes(data))
    assert hashlib.sha256(data).hexdigest() not in (store / "llama-bin.tar.xz.sha256").read_text()
    r = llama_bin(dict(env, LLAMA_BIN=str(fresh)), "unpack")
    assert r.returncode == 1 and "checksum" in r.stderr
    assert not fresh.exists()


def test_binaries_that_do_not_run_here_are_removed(dirs):
    env, built, out, _, fresh = dirs
    llama_bin(dict(env, LLAMA_BIN=str(built)), "pack", str(out))
    llama_bin(env, "fetch", str(out))
    r = llama_bin(dict(env, LLAMA_BIN=str(fresh), FAIL_HERE="1"), "unpack")
    assert r.returncode == 1 and "do not run here" in r.stderr
    assert not fresh.exists()  # the caller builds in their place


def test_a_build_that_does_not_run_is_not_packed(dirs):
    env, built, out, _, _ = dirs
    r = llama_bin(dict(env, LLAMA_BIN=str(built), FAIL_HERE="1"), "pack", str(out))
    assert r.returncode == 1 and not list(out.iterdir())


def test_unpack_without_parts_says_build():
    r = llama_bin(dict(os.environ, LLAMA_STORE="/nonexistent-minferd", LLAMA_BIN="/tmp/none"), "unpack")
    assert r.returncode == 1
