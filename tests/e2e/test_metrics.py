"""/metrics as a scraper reads it, parsed by prometheus_client's own parser: the byte series sum to
the pool's ledger (a shared file's weights once), labels hold still, requests count by outcome
(cancelled included), and a non-loopback listener needs the token."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families

from minferd._proto import pb2
from minferd.model.synth import write_model
from tests.e2e.daemon import Daemon

TOKEN = "metrics-token-0123456789abcdef"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int, token: str | None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def _samples(families, name):
    return [s for s in families[name].samples if s.name == name or s.name == name + "_total"]


def test_series_sum_to_the_ledger_and_count_every_outcome(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "qwen2.gguf", "qwen2", "tiny", "q8_0", seed=1)
    write_model(models / "llama.gguf", "llama", "tiny", "q4_0", seed=1)
    port = _port()
    d = Daemon(tmp_path, "--device", "cpu", "--models-dir", models, "--metrics-listen", f"0.0.0.0:{port}",
               "--threads", "2", token=TOKEN)
    try:
        for path, name in (("qwen2.gguf", "a"), ("qwen2.gguf", "b"), ("llama.gguf", "c")):  # a and b share weights
            d.load(path, name, ctx=2048)
        stub, md = d.stub(), d.metadata()
        list(stub.Generate(pb2.GenerateRequest(model="a", text="hi", sampling=pb2.SamplingParams(max_tokens=3)),
                           metadata=md))
        call = stub.Generate(pb2.GenerateRequest(model="b", text="hi", sampling=pb2.SamplingParams(
            temperature=0, max_tokens=2000)), metadata=md)
        next(call)
        call.cancel()  # the client goes away mid-answer
        try:
            list(stub.Generate(pb2.GenerateRequest(model="c", ids=pb2.TokenIds(ids=[10 ** 7])), metadata=md))
        except grpc.RpcError:
            pass

        try:
            _scrape(port, None)
            raise AssertionError("scraped without the token")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        import time
        deadline = time.monotonic() + 10
        while True:  # the cancelled request is counted once its stream has ended on the server
            fam = _scrape(port, TOKEN)
            outcomes = {(s.labels["model"], s.labels["outcome"]): s.value for s in _samples(fam, "minferd_requests")}
            if ("b", "cancelled") in outcomes or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        st = d.status()
        own = sum(s.value for s in _samples(fam, "minferd_model_bytes"))
        shared = sum(s.value for s in _samples(fam, "minferd_weight_set_bytes"))
        assert own + shared == st.pool.used_bytes > 0
        assert len({s.labels["weight_set"] for s in _samples(fam, "minferd_weight_set_bytes")}) == 2
        (cap,) = _samples(fam, "minferd_pool_capacity_bytes")
        assert cap.value == st.pool.capacity_bytes
        assert {s.labels["state"] for s in _samples(fam, "minferd_pool_bytes")} == {"used", "reserved", "free"}
        paths = [s for s in _samples(fam, "minferd_model_matmul_path") if s.labels["model"] == "a"]
        assert sorted(s.labels["path"] for s in paths) == ["fused_b", "mmq", "w16"] and sum(s.value for s in paths) == 1
        assert outcomes[("a", "length")] == 1 and outcomes[("b", "cancelled")] == 1
        assert outcomes[("c", "INVALID_ARGUMENT")] == 1
        ttft = [s for s in fam["minferd_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
        assert sum(s.value for s in ttft) >= 2
        assert "process_resident_memory_bytes" in fam and "minferd_model_sequences" in fam
    finally:
        d.stop()


def test_unloaded_names_leave_no_series_and_idle_connections_no_threads(tmp_path):
    """Load, use and unload 20 names: the next scrape holds series of the loaded one only. 60 idle
    connections to the metrics port add no threads to the daemon (one event loop serves them), and
    a scrape answers while they are open."""
    import os
    import time
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "q.gguf", "qwen2", "tiny", "q8_0", seed=1)
    port = _port()
    d = Daemon(tmp_path, "--device", "cpu", "--models-dir", models, "--metrics-port", str(port), "--threads", "1")
    try:
        stub, md = d.stub(), d.metadata()
        for i in range(21):
            d.load("q.gguf", f"m{i}", ctx=256)
            list(stub.Generate(pb2.GenerateRequest(model=f"m{i}", text="hi", sampling=pb2.SamplingParams(max_tokens=2)),
                               metadata=md))
            if i < 20:
                stub.UnloadModel(pb2.UnloadModelRequest(name=f"m{i}"), metadata=md)
        fam = _scrape(port, None)
        named = {s.labels["model"] for f in fam.values() for s in f.samples if "model" in s.labels}
        assert named == {"m20"}, sorted(named)[:5]
        threads = lambda: len(os.listdir(f"/proc/{d.proc.pid}/task"))  # noqa: E731
        before = threads()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(60)]
        try:
            time.sleep(0.5)
            t0 = time.monotonic()
            assert "minferd_pool_bytes" in _scrape(port, None)
            assert time.monotonic() - t0 < 2
            assert threads() <= before + 2, (before, threads())
        finally:
            for s in idle:
                s.close()
    finally:
        d.stop()
