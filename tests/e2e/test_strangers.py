"""Who may talk to a real `minferd serve` (issue 13, item 4): TCP needs a token or client
certificates, a token never comes from argv and is never echoed, per-model health and /metrics
answer only with the token, and per-model health reads the model table, not a copy of it."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from minferd._proto import pb2, pb2_grpc
from tests.e2e.daemon import Daemon

TOKEN = "t0ken-for-tests-" + "7f3a9c" * 3  # 34 characters, no whitespace
C = grpc.StatusCode
SERVING = health_pb2.HealthCheckResponse.SERVING


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*args, env=None, timeout=60):
    """`minferd serve ARGS` expected to refuse at start: (exit status, stderr)."""
    full = {k: v for k, v in os.environ.items() if k != "MINFERD_TOKEN"}
    full.update(env or {})
    p = subprocess.run([sys.executable, "-m", "minferd.cli", "serve", *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env=full)
    return p.returncode, p.stderr


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details() or ""


def bearer(token=TOKEN):
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def models(tmp_path_factory, synth_model):
    d = tmp_path_factory.mktemp("models")
    shutil.copy(synth_model("qwen2", "q8_0"), d / "qwen2.gguf")
    return d


@pytest.mark.parametrize("bad, why", [("", "blank"), ("   ", "blank"), ("has a space in it 0123456789", "whitespace"),
                                      ("short", "fewer than 16"), ("tab\tinside-0123456789", "whitespace")])
@pytest.mark.parametrize("how", ["env", "file"])
def test_a_weak_token_is_refused_at_start(tmp_path, bad, why, how):
    if how == "env":
        rc, err = serve("--listen", "127.0.0.1:0", env={"MINFERD_TOKEN": bad})
    else:
        f = tmp_path / "token"
        f.write_text(bad + "\n")
        rc, err = serve("--listen", "127.0.0.1:0", "--token-file", f)
    assert rc == 2 and why in err and "openssl rand -hex 16" in err, err
    assert len(err.strip().splitlines()) == 1, err
    if bad.strip():
        assert bad not in err


def test_a_token_in_argv_is_refused_in_one_line():
    secret = "argv-secret-0123456789abcdef"
    # --device nonsense: before this rule, the daemon took the token and failed later on the device
    rc, err = serve("--listen", "127.0.0.1:0", "--token", secret, "--device", "nonsense")
    assert rc == 2 and "--token-file" in err and "MINFERD_TOKEN" in err, err
    assert secret not in err and len(err.strip().splitlines()) == 1
    rc, err = serve(f"--token={secret}", "--device", "nonsense")
    assert rc == 2 and "--token-file" in err and secret not in err
    p = subprocess.run([sys.executable, "-m", "minferd.ctl", "--address", "unix:/nonexistent.sock", "--token", secret,
                        "status"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--token-file" in p.stderr and "MINFERD_TOKEN" in p.stderr, p.stderr
    assert secret not in p.stderr and "Traceback" not in p.stderr


def test_tls_alone_is_refused_at_start(tmp_path):
    rc, err = serve("--listen", f"127.0.0.1:{free_port()}", "--tls-cert", tmp_path / "c.pem", "--tls-key",
                    tmp_path / "k.pem", "--device", "nonsense")
    assert rc == 2 and "--tls-client-ca" in err and "token" in err, err


def test_metrics_off_loopback_need_a_token(tmp_path):
    rc, err = serve("--listen", f"unix:{tmp_path}/d.sock", "--metrics-listen", f"0.0.0.0:{free_port()}",
                    "--device", "nonsense")
    assert rc == 2 and "not loopback" in err and "token" in err, err


def _openssl(*args, cwd):
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, cwd=cwd, timeout=60)


def _certificates(d):
    """A CA, a server certificate for localhost and a client certificate, both signed by the CA."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=test ca", cwd=d)
    for name, ext in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
                      ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificates")
def test_client_certificates_let_in_only_their_holders(tmp_path, models):
    _certificates(tmp_path)
    port = free_port()
    d = Daemon(tmp_path, "--models-dir", models, "--tls-cert", tmp_path / "server.pem", "--tls-key",
               tmp_path / "server.key", "--tls-client-ca", tmp_path / "ca.pem", listen=f"127.0.0.1:{port}")
    try:
        ca = (tmp_path / "ca.pem").read_bytes()
        holder = grpc.ssl_channel_credentials(ca, (tmp_path / "client.key").read_bytes(),
                                              (tmp_path / "client.pem").read_bytes())
        stub = pb2_grpc.MinferdStub(grpc.secure_channel(f"localhost:{port}", holder))
        assert stub.GetStatus(pb2.GetStatusRequest(), timeout=30).pool.device == "cpu"
        stranger = pb2_grpc.MinferdStub(grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(ca)))
        assert code_of(lambda: stranger.GetStatus(pb2.GetStatusRequest(), timeout=10))[0] == C.UNAVAILABLE
    finally:
        assert d.stop() == 0


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, models):
    """A TCP daemon with the token in a file, metrics on loopback, and a model `known` loaded."""
    work = tmp_path_factory.mktemp("guarded")
    token_file = work / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port, metrics = free_port(), free_port()
    d = Daemon(work, "--models-dir", models, "--token-file", token_file, "--metrics-port", metrics,
               "--threads", "1", listen=f"127.0.0.1:{port}")
    d.token = TOKEN
    d.metrics_port = metrics
    d.load("qwen2.gguf", "known", ctx=64)
    yield d
    assert d.stop() == 0
    assert TOKEN not in d.log.read_text()


def test_the_api_needs_the_token_and_never_echoes_it(guarded):
    stub = guarded.stub()
    for md in ((), bearer("wrong-token-0123456789"), bearer(""), (("authorization", TOKEN),)):
        code, details = code_of(lambda md=md: stub.GetStatus(pb2.GetStatusRequest(), metadata=md, timeout=30))
        assert code == C.UNAUTHENTICATED and TOKEN not in details
    assert stub.GetStatus(pb2.GetStatusRequest(), metadata=bearer(), timeout=30).models[0].name == "known"
    cmdline = Path(f"/proc/{guarded.proc.pid}/cmdline").read_bytes().decode()
    assert TOKEN not in cmdline and "--token-file" in cmdline


def test_model_health_needs_the_token_and_hides_which_models_exist(guarded):
    h = health_pb2_grpc.HealthStub(guarded.channel())
    check = health_pb2.HealthCheckRequest
    # The probes' entries stay open: the kubelet sends no token.
    assert h.Check(check(service=""), timeout=30).status == SERVING
    assert h.Check(check(service="minferd.v1.Minferd"), timeout=30).status == SERVING
    answers = set()
    for svc in ("model/known", "model/nobody"):
        for md in ((), bearer("wrong-token-0123456789")):
            code, details = code_of(lambda svc=svc, md=md: h.Check(check(service=svc), metadata=md, timeout=30))
            answers.add((code, details))
    assert answers == {(C.UNAUTHENTICATED, "missing or wrong bearer token")}  # the same for both names
    assert h.Check(check(service="model/known"), metadata=bearer(), timeout=30).status == SERVING
    assert code_of(lambda: h.Check(check(service="model/nobody"), metadata=bearer(), timeout=30))[0] == C.NOT_FOUND
    code, _ = code_of(lambda: next(h.Watch(check(service="model/known"), timeout=30)))
    assert code == C.UNAUTHENTICATED
    watch = h.Watch(check(service="model/known"), metadata=bearer(), timeout=30)
    assert next(watch).status == SERVING
    watch.cancel()


def _scrape(port, token=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_need_the_token(guarded):
    for token in (None, "wrong-token-0123456789", ""):
        status, body = _scrape(guarded.metrics_port, token)
        assert status == 401 and "known" not in body and "minferd_" not in body
    status, body = _scrape(guarded.metrics_port, TOKEN)
    assert status == 200 and 'model="known"' in body


def test_metrics_on_any_address_with_a_token(tmp_path, models):
    port = free_port()
    d = Daemon(tmp_path, "--models-dir", models, "--metrics-listen", f"0.0.0.0:{port}", token=TOKEN)
    try:
        assert _scrape(port)[0] == 401
        assert _scrape(port, TOKEN)[0] == 200
    finally:
        assert d.stop() == 0
    assert TOKEN not in d.log.read_text()


def test_model_health_follows_the_table(tmp_path, models):
    """model/<name> is what the host has now: not SERVING after the keep-alive reaper unloaded it
    (the health table used to keep saying SERVING), and NOT_FOUND after an unload."""
    d = Daemon(tmp_path, "--models-dir", models, "--threads", "1")
    try:
        h = health_pb2_grpc.HealthStub(d.channel())
        d.load("qwen2.gguf", "brief", ctx=64, keep_alive_seconds=0)  # unloaded as soon as it is idle
        deadline = time.monotonic() + 30
        while any(m.name == "brief" for m in d.status().models):
            assert time.monotonic() < deadline, "the reaper never unloaded it"
            time.sleep(0.2)
        code, _ = code_of(lambda: h.Check(health_pb2.HealthCheckRequest(service="model/brief"), timeout=30))
        assert code == C.NOT_FOUND
        d.load("qwen2.gguf", "kept", ctx=64)
        assert h.Check(health_pb2.HealthCheckRequest(service="model/kept"), timeout=30).status == SERVING
        watch = h.Watch(health_pb2.HealthCheckRequest(service="model/kept"), timeout=30)
        assert next(watch).status == SERVING
        d.stub().UnloadModel(pb2.UnloadModelRequest(name="kept"))
        code, _ = code_of(lambda: h.Check(health_pb2.HealthCheckRequest(service="model/kept"), timeout=30))
        assert code == C.NOT_FOUND
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN  # a watcher hears it too
        watch.cancel()
    finally:
        assert d.stop() == 0


def test_bytes_that_do_not_parse_are_invalid_argument_not_internal(tmp_path):
    """Invalid UTF-8 in a string field, over a real socket, for a unary and two streaming methods, and
    bytes that are no protobuf at all: INVALID_ARGUMENT naming the method, no traceback in the log,
    and the daemon serves on (minferd/decode_guard.py)."""
    d = Daemon(tmp_path, "--device", "cpu", "--threads", "1")
    try:
        ch = d.channel()
        for method, data, stream in (("Tokenize", b"\x0a\x01q\x12\x03\xed\xa0\x80", False),
                                     ("Generate", b"\x0a\x02\xc0\x80\x12\x02hi", True),
                                     ("LoadModel", b"\x0a\x02\xe2\x82\x12\x06q.gguf", True),
                                     ("GetStatus", b"\xff\xff\xff\xff", False)):
            call = (ch.unary_stream if stream else ch.unary_unary)(f"/minferd.v1.Minferd/{method}")
            with pytest.raises(grpc.RpcError) as e:
                r = call(data, timeout=10)
                list(r) if stream else r
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, e.value.code(), e.value.details())
            assert e.value.details().startswith(f"{method}: the request does not parse"), e.value.details()
        assert d.status().pool.capacity_bytes > 0
        log = d.log.read_text()
        assert "Traceback" not in log and "deserializ" not in log, log[-2000:]
    finally:
        d.stop()


def test_generations_past_max_streams_are_refused_and_status_still_answers(tmp_path):
    """--max-streams 2: two long generations hold their places (one of them never read), a third is
    RESOURCE_EXHAUSTED at once, GetStatus answers meanwhile; when one ends a new one is admitted."""
    from minferd.model.synth import write_model
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "q.gguf", "qwen2", "tiny", "q8_0", seed=1)
    d = Daemon(tmp_path, "--device", "cpu", "--threads", "1", "--models-dir", models, "--max-streams", "2")
    try:
        d.load("q.gguf", "q", ctx=2048)
        stub = d.stub()
        long = pb2.GenerateRequest(model="q", text="hi", sampling=pb2.SamplingParams(temperature=0, max_tokens=1500))
        held = [stub.Generate(long, timeout=120) for _ in range(2)]
        next(held[0])
        next(held[1])
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(pb2.GenerateRequest(model="q", text="hi"), timeout=30))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "2 generations" in e.value.details()
        assert time.monotonic() - t0 < 5
        assert d.status().models[0].name == "q"
        held[0].cancel()
        deadline = time.monotonic() + 30
        while True:  # the place frees once the server has seen the cancel
            try:
                list(stub.Generate(pb2.GenerateRequest(model="q", text="hi", sampling=pb2.SamplingParams(max_tokens=2)),
                                   timeout=30))
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.1)
        held[1].cancel()
    finally:
        d.stop()
