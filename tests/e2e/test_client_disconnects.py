"""Clients that die mid-stream (issue 7, item 4: "a client killed mid-stream frees its slot"),
against one real daemon: a killed client's running generation stops, a queued one never runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minferd._proto import pb2
from minferd.model.synth import write_model
from tests.e2e.daemon import Daemon

ROOT = Path(__file__).resolve().parents[2]
LONG_CTX = 8192


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = tmp_path_factory.mktemp("disconnect-models")
    # The tiny presets train at 2048 tokens; the mid-stream kill needs room for 5000.
    write_model(d / "long.gguf", "qwen2", "tiny", "q8_0", seed=1, overrides={"ctx": LONG_CTX})
    daemon = Daemon(tmp_path_factory.mktemp("disconnect-daemon"), "--models-dir", d, "--budget", "256MiB",
                    "--threads", "1")
    yield daemon
    assert daemon.stop() == 0


@pytest.fixture(scope="module")
def stub(daemon):
    return daemon.stub()


def gen(stub, model, **kw):
    return list(stub.Generate(pb2.GenerateRequest(model=model, **kw), timeout=120))


def ids(*xs):
    return pb2.TokenIds(ids=list(xs))


def sp(**kw):
    return pb2.SamplingParams(**kw)


CLIENT = """
import sys, time, grpc
from minferd._proto import pb2, pb2_grpc
stub = pb2_grpc.MinferdStub(grpc.insecure_channel(sys.argv[1]))
call = stub.Generate(pb2.GenerateRequest(model=sys.argv[2], ids=pb2.TokenIds(ids=[300]),
                     sampling=pb2.SamplingParams(temperature=0, max_tokens=5000)))
if sys.argv[3] == "first":
    next(call)
print("ready", flush=True)
time.sleep(600)
"""


def _client(daemon, model: str, wait: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.Popen([sys.executable, "-c", CLIENT, daemon.address, model, wait], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _model(daemon, name):
    return [m for m in daemon.status().models if m.name == name][0]


def _wait_idle(daemon, name, within: float) -> float:
    t = time.monotonic()
    while _model(daemon, name).busy:
        assert time.monotonic() - t < within, f"{name} still busy after {within} s"
        time.sleep(0.02)
    return time.monotonic() - t


@pytest.fixture(scope="module")
def long_model(daemon):
    daemon.load("long.gguf", "long", ctx=LONG_CTX)
    yield "long"
    daemon.stub().UnloadModel(pb2.UnloadModelRequest(name="long"))


def test_client_killed_mid_stream_frees_its_slot(daemon, stub, long_model):
    before = _model(daemon, long_model)
    p = _client(daemon, long_model, "first")  # it has its first token: the generation runs
    try:
        time.sleep(0.3)
        assert _model(daemon, long_model).busy, "the 5000-token generation should still be running"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert _wait_idle(daemon, long_model, within=5.0) < 5.0
    t = time.monotonic()
    assert gen(stub, long_model, ids=ids(301), sampling=sp(max_tokens=3))[-1].finish_reason in ("length", "stop")
    assert time.monotonic() - t < 5.0
    after = _model(daemon, long_model)
    assert after.requests == before.requests + 2  # the killed one ended ("cancelled") and the new one
    assert after.tokens_generated - before.tokens_generated < 4000  # far short of its 5000


def test_client_killed_while_batched_with_another_ends(daemon, stub, long_model):
    """A request batched with another on the same model, whose client dies, ends at the engine's
    next step (the cancel reaches it through the RPC's done callback, not at its next token)."""
    before = _model(daemon, long_model)
    running = stub.Generate(pb2.GenerateRequest(model=long_model, ids=ids(300),
                                                sampling=sp(temperature=0, max_tokens=5000)))
    next(running)
    p = _client(daemon, long_model, "sent")
    try:
        time.sleep(1.0)  # the request is on the server, in the batch with `running`
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    time.sleep(1.0)  # the daemon notices the closed connection
    running.cancel()
    _wait_idle(daemon, long_model, within=5.0)
    after = _model(daemon, long_model)
    assert after.requests == before.requests + 2  # both ran, and both were cancelled
    assert after.tokens_generated - before.tokens_generated < 8000  # far short of their 10000
