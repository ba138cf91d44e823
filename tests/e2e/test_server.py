"""A real `minferd serve` on a real socket: load with progress, status == ledger, streaming
generate == `minferd run`, cancel, unload, every error code from a real request, health,
reflection, the allowlist, transport rules and draining."""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from minferd._proto import pb2
from tests.e2e.daemon import Daemon


@pytest.fixture(scope="module")
def models(tmp_path_factory, synth_model):
    d = tmp_path_factory.mktemp("models")
    for arch, quant in (("qwen2", "q8_0"), ("llama", "q4_k"), ("gemma3", "q5_0")):
        shutil.copy(synth_model(arch, quant), d / f"{arch}.gguf")
    return d


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, models):
    d = Daemon(tmp_path_factory.mktemp("daemon"), "--models-dir", models, "--budget", "256MiB", "--threads", "1")
    yield d
    assert d.stop() == 0


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_socket_is_owner_only(daemon):
    assert stat.S_IMODE(os.stat(daemon.sock).st_mode) == 0o600


def test_load_progress_status_and_unload(daemon, models):
    events = daemon.load("qwen2.gguf", "q", ctx=256)
    phases = [e.phase for e in events]
    assert phases[0] == "planning" and phases[-1] == "ready" and "weights" in phases
    weights = [e for e in events if e.phase == "weights"]
    assert weights[-1].bytes_done == weights[-1].bytes_total > 0
    info = events[-1].model
    assert info.name == "q" and info.matmul_path == "mmq" and "under the w16 gate" in info.reason
    st = daemon.status()
    (m,) = [m for m in st.models if m.name == "q"]
    by_kind = m.bytes.weights + m.bytes.w16 + m.bytes.kv + m.bytes.scratch
    assert st.pool.used_bytes == sum(x.bytes.weights + x.bytes.w16 + x.bytes.kv + x.bytes.scratch for x in st.models)
    freed = daemon.stub().UnloadModel(pb2.UnloadModelRequest(name="q")).freed_bytes
    assert freed == by_kind and daemon.status().pool.used_bytes == st.pool.used_bytes - by_kind


def test_generate_streams_what_minferd_run_prints(daemon, models):
    daemon.load("llama.gguf", "l", ctx=128)
    req = pb2.GenerateRequest(model="l", ids=pb2.TokenIds(ids=[300, 301, 302]),
                              sampling=pb2.SamplingParams(temperature=0.9, seed=7, max_tokens=10))
    events = list(daemon.stub().Generate(req))
    last = events[-1]
    assert last.finish_reason in ("length", "stop") and last.timings.prompt_tokens == 3
    ids = [e.token_id for e in events[:-1] if e.token_id >= 0]
    text = "".join(e.text for e in events)
    run = subprocess.run([sys.executable, "-m", "minferd.cli", "run", str(models / "llama.gguf"), "--prompt-ids",
                          "300,301,302", "--temperature", "0.9", "--seed", "7", "--max-tokens", "10", "--json"],
                         capture_output=True, text=True, check=True)
    ref = json.loads(run.stdout)
    assert ids == ref["token_ids"] and text == ref["text"]
    assert last.timings.generated_tokens == len(ids)


def test_cancel_frees_the_slot(daemon):
    daemon.load("gemma3.gguf", "g", ctx=2048)
    stub = daemon.stub()
    long = pb2.GenerateRequest(model="g", ids=pb2.TokenIds(ids=[300]),
                               sampling=pb2.SamplingParams(temperature=0, max_tokens=2000))
    call = stub.Generate(long)
    next(call)  # it is running
    call.cancel()
    t = time.monotonic()
    quick = pb2.GenerateRequest(model="g", ids=pb2.TokenIds(ids=[301]), sampling=pb2.SamplingParams(max_tokens=2))
    assert list(stub.Generate(quick))[-1].finish_reason in ("length", "stop")
    assert time.monotonic() - t < 20  # did not wait behind 2000 tokens
    (m,) = [m for m in daemon.status().models if m.name == "g"]
    assert not m.busy


def test_error_codes(daemon, models, tmp_path):
    s = daemon.stub()
    C = grpc.StatusCode
    assert code_of(lambda: s.UnloadModel(pb2.UnloadModelRequest(name="nope")))[0] == C.NOT_FOUND
    assert code_of(lambda: list(s.Generate(pb2.GenerateRequest(model="nope", text="x"))))[0] == C.NOT_FOUND
    assert code_of(lambda: daemon.load("/etc/hostname", "x"))[0] == C.PERMISSION_DENIED
    assert code_of(lambda: daemon.load(f"{models}/../../etc/hostname", "x"))[0] == C.PERMISSION_DENIED
    link = models / "link.gguf"
    if not link.exists():
        link.symlink_to("/etc/hostname")
    assert code_of(lambda: daemon.load("link.gguf", "x"))[0] == C.PERMISSION_DENIED
    assert code_of(lambda: daemon.load("missing.gguf", "x"))[0] == C.NOT_FOUND
    bad = models / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    code, msg = code_of(lambda: daemon.load("bad.gguf", "x"))
    assert code == C.INVALID_ARGUMENT and "bad.gguf" in msg
    daemon.load("qwen2.gguf", "e", ctx=64)
    assert code_of(lambda: daemon.load("llama.gguf", "e"))[0] == C.FAILED_PRECONDITION  # name in use
    big = pb2.GenerateRequest(model="e", ids=pb2.TokenIds(ids=[300] * 60), sampling=pb2.SamplingParams(max_tokens=10))
    assert code_of(lambda: list(s.Generate(big)))[0] == C.INVALID_ARGUMENT  # prompt + max_tokens > ctx
    neg = pb2.GenerateRequest(model="e", text="hi", sampling=pb2.SamplingParams(temperature=-1))
    code, msg = code_of(lambda: list(s.Generate(neg)))
    assert code == C.INVALID_ARGUMENT and "temperature" in msg
    assert code_of(lambda: daemon.load("llama.gguf", "huge", ctx=1 << 20))[0] == C.INVALID_ARGUMENT  # > training ctx
    s.UnloadModel(pb2.UnloadModelRequest(name="e"))


def test_resource_exhausted(tmp_path, models):
    d = Daemon(tmp_path, "--models-dir", models, "--budget", "2MiB", "--threads", "1")
    try:
        code, msg = code_of(lambda: d.load("llama.gguf", "l", ctx=2048))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "needs" in msg and "free" in msg
        assert d.status().pool.used_bytes == 0
    finally:
        assert d.stop() == 0


def test_health_and_reflection(daemon):
    ch = daemon.channel()
    h = health_pb2_grpc.HealthStub(ch)
    assert h.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.SERVING
    assert h.Check(health_pb2.HealthCheckRequest(service="minferd.v1.Minferd")).status == \
        health_pb2.HealthCheckResponse.SERVING
    daemon.load("qwen2.gguf", "hq", ctx=64)
    assert h.Check(health_pb2.HealthCheckRequest(service="model/hq")).status == health_pb2.HealthCheckResponse.SERVING
    r = reflection_pb2_grpc.ServerReflectionStub(ch)
    resp = next(r.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in resp.list_services_response.service}
    assert {"minferd.v1.Minferd", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflection"} <= names
    # v1 (what grpcurl asks first): the same messages under the v1 method name, and it describes itself.
    v1 = ch.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                          request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                          response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    asks = [reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="minferd.v1.Minferd"),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection")]
    listed, minferd_file, v1_file = list(v1(iter(asks)))
    assert {s.name for s in listed.list_services_response.service} == names
    from google.protobuf import descriptor_pb2
    files = []
    for r in (minferd_file, v1_file):
        fdp = descriptor_pb2.FileDescriptorProto()
        fdp.ParseFromString(r.file_descriptor_response.file_descriptor_proto[0])
        files.append(fdp)
    assert [f.name for f in files] == ["minferd/v1/minferd.proto", "grpc/reflection/v1/reflection.proto"]
    assert files[1].service[0].method[0].input_type == ".grpc.reflection.v1.ServerReflectionRequest"
    daemon.stub().UnloadModel(pb2.UnloadModelRequest(name="hq"))


def test_tcp_needs_tls_or_token(tmp_path, models):
    p = subprocess.run([sys.executable, "-m", "minferd.cli", "serve", "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "refusing plain TCP" in p.stderr
    p = subprocess.run([sys.executable, "-m", "minferd.cli", "serve", "--listen", "0.0.0.0:0", "--insecure"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "loopback" in p.stderr


def test_token_auth(tmp_path, models):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "s3cret-0123456789abcdef"
    d = Daemon(tmp_path, "--models-dir", models, token=token, listen=f"127.0.0.1:{port}")  # MINFERD_TOKEN
    try:
        stub = d.stub()
        code, _ = code_of(lambda: stub.GetStatus(pb2.GetStatusRequest()))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = code_of(lambda: stub.GetStatus(pb2.GetStatusRequest(), metadata=(("authorization", "Bearer x"),)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert stub.GetStatus(pb2.GetStatusRequest(), metadata=(("authorization", f"Bearer {token}"),)).pool.device
        h = health_pb2_grpc.HealthStub(d.channel())  # probes need no token
        assert h.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        assert token not in d.log.read_text()
    finally:
        assert d.stop() == 0


def test_sigterm_drains_in_flight_requests(tmp_path, models):
    d = Daemon(tmp_path, "--models-dir", models, "--threads", "1")
    d.load("gemma3.gguf", "g", ctx=512)
    req = pb2.GenerateRequest(model="g", ids=pb2.TokenIds(ids=[300]), sampling=pb2.SamplingParams(max_tokens=40))
    call = d.stub().Generate(req)
    first = next(call)
    d.proc.send_signal(signal.SIGTERM)
    rest = list(call)  # the request in flight finishes
    assert (rest or [first])[-1].finish_reason in ("length", "stop")
    assert d.proc.wait(60) == 0
    assert not os.path.exists(d.sock)


def test_restart_after_sigkill(tmp_path, models):
    d = Daemon(tmp_path, "--models-dir", models)
    d.stop(signal.SIGKILL)
    assert os.path.exists(d.sock)  # stale
    d2 = Daemon(tmp_path, "--models-dir", models)
    try:
        assert d2.status().pool.used_bytes == 0
    finally:
        assert d2.stop() == 0


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_tls(tmp_path, models):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    port = _free_port()
    token = "tls-token-0123456789abcdef"  # TLS alone lets anyone in: refused without a token or client CA
    d = Daemon(tmp_path, "--models-dir", models, "--tls-cert", cert, "--tls-key", key, listen=f"127.0.0.1:{port}",
               token=token)
    try:
        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        ch = grpc.secure_channel(f"localhost:{port}", creds)
        from minferd._proto import pb2_grpc
        assert pb2_grpc.MinferdStub(ch).GetStatus(pb2.GetStatusRequest(), timeout=30,
                                                  metadata=(("authorization", f"Bearer {token}"),)).pool.device == "cpu"
        plain = pb2_grpc.MinferdStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        assert code_of(lambda: plain.GetStatus(pb2.GetStatusRequest(), timeout=5))[0] == grpc.StatusCode.UNAVAILABLE
    finally:
        assert d.stop() == 0


def test_metrics(tmp_path, models):
    import urllib.request
    port = _free_port()
    d = Daemon(tmp_path, "--models-dir", models, "--metrics-port", port, "--threads", "1")
    try:
        d.load("qwen2.gguf", "m", ctx=64)
        list(d.stub().Generate(pb2.GenerateRequest(model="m", ids=pb2.TokenIds(ids=[300]),
                                                   sampling=pb2.SamplingParams(max_tokens=3))))
        code_of(lambda: d.stub().UnloadModel(pb2.UnloadModelRequest(name="nope")))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        import re
        scraped = float(re.search(r'minferd_pool_bytes\{device="cpu",state="used"\} (\S+)', text).group(1))
        assert scraped == d.status().pool.used_bytes > 0  # the ledger, as status shows it
        for name in ("minferd_model_bytes{", 'minferd_requests_total{model="m",outcome="length"} 1.0', "minferd_request_seconds_bucket",
                     'minferd_refusals_total{code="NOT_FOUND"} 1.0', 'minferd_tokens_total{kind="generated",model="m"}'):
            assert name in text, name
    finally:
        assert d.stop() == 0


def test_preload(tmp_path, models):
    d = Daemon(tmp_path, "--models-dir", models, "--preload", f"{models / 'qwen2.gguf'}=pre", "--threads", "1")
    try:
        (m,) = d.status().models
        assert m.name == "pre" and m.pinned and m.keep_alive_seconds < 0
        h = health_pb2_grpc.HealthStub(d.channel())
        assert h.Check(health_pb2.HealthCheckRequest(service="model/pre")).status == \
            health_pb2.HealthCheckResponse.SERVING
    finally:
        assert d.stop() == 0
