"""The hostile corpus through a real daemon: every file refused with INVALID_ARGUMENT naming the
problem, the daemon answering throughout, no byte left in the pool, and a good file loading after."""
from __future__ import annotations

import shutil
import time

import grpc
import pytest

from minferd._proto import pb2
from tests.e2e.daemon import Daemon
from tests.hostile_gguf import make_corpus

MAX_SECONDS = 2.0


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory, synth_model):
    d = tmp_path_factory.mktemp("hostile-models")
    good = synth_model("qwen2", "q4_0")
    corpus = make_corpus(good, d)
    shutil.copy(good, d / "good.gguf")
    return d, corpus


def test_daemon_refuses_every_hostile_file(tmp_path, corpus_dir):
    models, corpus = corpus_dir
    daemon = Daemon(tmp_path, "--models-dir", models, "--budget", "256MiB", "--threads", "1")
    try:
        stub = daemon.stub()
        failures, messages = [], {}
        for i, (path, words) in enumerate(corpus):
            t0 = time.monotonic()
            try:
                daemon.load(path.name, f"hostile{i}")
                failures.append(f"{path.name}: loaded")
            except grpc.RpcError as e:
                details = e.details() or ""
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    failures.append(f"{path.name}: {e.code().name}: {details[:300]}")
                elif path.name not in details or any(w not in details for w in words):
                    failures.append(f"{path.name}: {words} not all in {details[:300]!r}")
                messages.setdefault(details.split(": ", 1)[-1], path.name)
            seconds = time.monotonic() - t0
            if seconds > MAX_SECONDS:
                failures.append(f"{path.name}: refused after {seconds:.1f} s")
            pool = daemon.status().pool  # still answering, and nothing held or promised
            if pool.used_bytes or pool.reserved_bytes:
                failures.append(f"{path.name}: {pool.used_bytes} bytes used, {pool.reserved_bytes} reserved after it")
        assert daemon.proc.poll() is None, daemon.log.read_text()[-3000:]
        log = daemon.log.read_text()
        assert "Traceback" not in log and "internal error" not in log, log[-3000:]
        assert not failures, "\n".join(failures)
        st = daemon.status()
        assert not st.models and st.pool.used_bytes == 0 and st.pool.reserved_bytes == 0
        print(f"\n{len(corpus)} hostile files refused, {len(messages)} distinct messages; a sample:")
        for msg in list(messages)[::max(1, len(messages) // 12)]:
            print(f"  {msg[:150]}")

        # and the daemon is still fit for work: a good file loads and generates
        events = daemon.load("good.gguf", "good", ctx=128)
        assert events[-1].phase == "ready"
        req = pb2.GenerateRequest(model="good", ids=pb2.TokenIds(ids=[300, 301, 302]),
                                  sampling=pb2.SamplingParams(temperature=0, max_tokens=4))
        out = list(stub.Generate(req))
        assert out[-1].finish_reason in ("length", "stop")
        assert sum(e.token_id >= 0 for e in out) >= 1
        assert daemon.status().pool.used_bytes > 0
        stub.UnloadModel(pb2.UnloadModelRequest(name="good"))
        assert daemon.status().pool.used_bytes == 0
    finally:
        assert daemon.stop() == 0
