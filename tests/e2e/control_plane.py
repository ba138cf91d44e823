"""What the control-plane tests share: the models they load, a fixture that starts daemons, and
small helpers over gRPC (status, health, bytes counted once per weight set)."""
from __future__ import annotations

import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from minferd._proto import pb2, pb2_grpc
from minferd.model.synth import write_model
from tests.e2e.daemon import Daemon

C = grpc.StatusCode
SERVING = health_pb2.HealthCheckResponse.SERVING
LONG_CTX = 8192  # f.gguf trains at 16384, so a long stream and a large KV both fit
# What a stream whose model was unloaded under it may end with (besides a normal finish).
STREAM_ENDS = {C.NOT_FOUND, C.FAILED_PRECONDITION, C.CANCELLED, C.ABORTED}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp-models")
    write_model(d / "f.gguf", "qwen2", "tiny", "q8_0", seed=1, overrides={"ctx": 16384})
    write_model(d / "g.gguf", "llama", "tiny", "q4_k", seed=2)
    write_model(d / "h.gguf", "gemma3", "tiny", "q5_0", seed=3)
    return d


@pytest.fixture(scope="module")
def big_model(models) -> str:
    """About 525 MB of Q8_0 (qwen2 0.5b shapes, random blocks): a load that takes over a second."""
    write_model(models / "big.gguf", "qwen2", "0.5b", "q8_0", seed=1, random_blocks_=True, overrides={"ctx": 4096})
    return "big.gguf"


@pytest.fixture
def start(tmp_path, models):
    """start(*flags) -> a Daemon on the CPU over `models`, stopped after the test."""
    daemons = []

    def make(*flags) -> Daemon:
        home = tmp_path / f"d{len(daemons)}"
        home.mkdir()
        d = Daemon(home, "--device", "cpu", "--models-dir", models, "--threads", "1", *flags)
        daemons.append(d)
        return d

    yield make
    for d in daemons:
        try:
            d.stop(timeout=60)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()


# ---- small helpers -----------------------------------------------------------------------------
def stub_of(d: Daemon) -> pb2_grpc.MinferdStub:
    return pb2_grpc.MinferdStub(d.channel())


def health_of(d: Daemon) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(d.channel())


def load(s, path, name, ctx=64, keep=None, timeout=60, **kw) -> pb2.ModelInfo:
    if keep is not None:
        kw["keep_alive_seconds"] = keep
    events = list(s.LoadModel(pb2.LoadModelRequest(name=name, path=str(path), ctx=ctx, **kw), timeout=timeout))
    return events[-1].model


def outcome(fn):
    """(code, details) of a call: C.OK and "" when it answered."""
    try:
        fn()
        return C.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def status(s, timeout=10) -> pb2.Status:
    return s.GetStatus(pb2.GetStatusRequest(), timeout=timeout)


def names(s, timeout=10) -> set[str]:
    return {m.name for m in s.ListModels(pb2.ListModelsRequest(), timeout=timeout).models}


def model_health(h, name: str):
    """SERVING / NOT_SERVING / SERVICE_UNKNOWN, or "NOT_FOUND" where Check refuses the service."""
    try:
        return h.Check(health_pb2.HealthCheckRequest(service=f"model/{name}"), timeout=10).status
    except grpc.RpcError as e:
        if e.code() == C.NOT_FOUND:  # grpc's HealthServicer: an unknown service
            return "NOT_FOUND"
        raise


def health_name(v) -> str:
    return v if isinstance(v, str) else health_pb2.HealthCheckResponse.ServingStatus.Name(v)


def is_gone(v) -> bool:
    return v in ("NOT_FOUND", health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)


def wait_gone(s, name: str, within: float) -> float:
    """Poll ListModels until `name` is not there; returns the monotonic time it was first seen gone."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if name not in names(s):
            return time.monotonic()
        time.sleep(0.002)
    raise AssertionError(f"{name} still loaded after {within} s")


def dedup_bytes(st: pb2.Status) -> int:
    """The per-model bytes with each weight set counted once: kv and scratch are each model's,
    weights and w16 belong to the weight set (ModelInfo.weight_set)."""
    sets = {}
    for m in st.models:
        sets[m.weight_set] = m.bytes.weights + m.bytes.w16
    return sum(sets.values()) + sum(m.bytes.kv + m.bytes.scratch for m in st.models)


def snapshot(st: pb2.Status):
    return sorted((m.name, m.path, m.matmul_path, m.weight_set, m.bytes.weights, m.bytes.w16, m.bytes.kv,
                   m.bytes.scratch, m.pinned) for m in st.models), st.pool.used_bytes, st.pool.allocated_bytes


def log_tail(d: Daemon, n=3000) -> str:
    return d.log.read_text()[-n:]


def gen_req(model, max_tokens, ids=(300,), **sp):
    return pb2.GenerateRequest(model=model, ids=pb2.TokenIds(ids=list(ids)),
                               sampling=pb2.SamplingParams(temperature=0, max_tokens=max_tokens, **sp))


def drain_stream(call):
    """Read a Generate stream to its end: ("finish", reason) or ("error", code, details)."""
    last = None
    try:
        for ev in call:
            last = ev
    except grpc.RpcError as e:
        return ("error", e.code(), e.details() or "")
    return ("finish", last.finish_reason if last is not None else "")
