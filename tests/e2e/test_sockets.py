"""The daemon's unix socket, every way it is spelled (issue 13, item 9), against real daemons:
owner-only, never replacing what is not a stale socket, and never taking a successor's socket
with it when it exits."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from minferd._proto import pb2
from minferd.model.synth import write_model
from tests.e2e.daemon import Daemon


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def is_socket(path) -> bool:
    return os.path.exists(path) and stat.S_ISSOCK(os.lstat(path).st_mode)


def answers(address: str) -> bool:
    from minferd.client import Client
    c = Client(address, timeout=10)
    try:
        return c.status()["pool"]["device"] == "cpu"
    finally:
        c.close()


@pytest.mark.parametrize("spelling", ["unix:{abs}", "unix://{abs}", "unix:{rel}"])  # abs starts with /
def test_every_spelling_is_a_unix_socket_and_owner_only(tmp_path, spelling):
    """unix:/path (one slash) was taken for TCP and refused; under umask 0 the socket must still be 0600."""
    sock = tmp_path / "s.sock"
    listen = spelling.format(abs=sock, rel="s.sock")
    d = Daemon(tmp_path, listen=listen, cwd=tmp_path, umask=0)
    try:
        assert is_socket(sock) and mode(sock) == 0o600
        assert answers(f"unix:{sock}")
    finally:
        assert d.stop() == 0
    assert not os.path.exists(sock)


def test_a_created_parent_directory_is_owner_only(tmp_path):
    sock = tmp_path / "made" / "deeper" / "d.sock"
    d = Daemon(tmp_path, listen=f"unix://{sock}", umask=0)
    try:
        assert mode(tmp_path / "made") == 0o700 and mode(tmp_path / "made" / "deeper") == 0o700
        assert mode(sock) == 0o600
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("what", ["file", "directory", "symlink"])
def test_what_is_not_a_socket_is_refused_and_kept(tmp_path, what):
    path = tmp_path / "d.sock"
    if what == "file":
        path.write_text("someone's notes\n")
    elif what == "directory":
        path.mkdir()
    else:
        (tmp_path / "target").write_text("kept\n")
        path.symlink_to(tmp_path / "target")
    p = subprocess.run([sys.executable, "-m", "minferd.cli", "serve", "--listen", f"unix://{path}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "not a socket" in p.stderr, p.stderr
    if what == "file":
        assert path.read_text() == "someone's notes\n"
    elif what == "directory":
        assert path.is_dir()
    else:
        assert path.is_symlink() and (tmp_path / "target").read_text() == "kept\n"


def test_a_stale_socket_is_replaced(tmp_path):
    path = tmp_path / "d.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # bound, never listening: connect is refused, as after a SIGKILL
    stale.close()
    d = Daemon(tmp_path, listen=f"unix:{path}")
    try:
        assert answers(f"unix:{path}") and mode(path) == 0o600
    finally:
        assert d.stop() == 0


def test_a_second_daemon_on_a_live_socket_is_refused(tmp_path):
    d = Daemon(tmp_path)
    try:
        p = subprocess.run([sys.executable, "-m", "minferd.cli", "serve", "--listen", d.address],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "another daemon is listening" in p.stderr
        assert answers(d.address)
    finally:
        assert d.stop() == 0


def test_a_successor_keeps_its_socket_when_the_draining_daemon_exits(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "long.gguf", "qwen2", "tiny", "q8_0", seed=1, overrides={"ctx": 8192})
    old = Daemon(tmp_path, "--models-dir", models, "--threads", "1", log_name="old.log")
    old.load("long.gguf", "long", ctx=8192)
    stream = old.stub().Generate(pb2.GenerateRequest(model="long", ids=pb2.TokenIds(ids=[300]),
                                                     sampling=pb2.SamplingParams(temperature=0, max_tokens=8000)))
    next(stream)  # it is generating: SIGTERM leaves the old daemon draining
    old.proc.send_signal(15)
    deadline = time.monotonic() + 30
    while _accepts(old.sock):  # until the old one takes no new connections on the path
        assert time.monotonic() < deadline, "the old daemon still accepts 30 s after SIGTERM"
        time.sleep(0.1)
    new = Daemon(tmp_path, "--models-dir", models, log_name="new.log")
    try:
        assert old.proc.poll() is None, "the old daemon should still be draining its stream"
        stream.cancel()
        assert old.proc.wait(60) == 0
        assert is_socket(new.sock), "the old daemon's exit removed its successor's socket"
        assert answers(new.address)
    finally:
        assert new.stop() == 0
    assert not os.path.exists(new.sock)


def _accepts(path) -> bool:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_unix_double_slash_with_a_relative_path_is_refused(tmp_path):
    p = subprocess.run([sys.executable, "-m", "minferd.cli", "serve", "--listen", "unix://relative.sock"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2 and "absolute path" in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "relative.sock")
