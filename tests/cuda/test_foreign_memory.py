"""Another process takes GPU memory while minferd runs: the budget said the bytes were there,
the device says no. A load must then demote an idle model's f16 copy (and succeed) or be
refused with RESOURCE_EXHAUSTED, changing nothing; the daemon serves on and a model already
loaded keeps generating. Never a crash, never a half-loaded model.

A real `minferd serve --device cuda` on a socket, and a second real process holding memory
through cudaMalloc (CuPy), sized from the daemon's own figures.
"""
from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

cp = pytest.importorskip("cupy")

from minferd._proto import pb2  # noqa: E402
from minferd.model.synth import write_model  # noqa: E402
from tests.e2e.daemon import Daemon  # noqa: E402

# Holds all but argv[1] bytes of the device's free memory until its stdin closes.
HOG = """
import sys, cupy as cp
free, _ = cp.cuda.runtime.memGetInfo()
held = cp.empty(max(free - int(sys.argv[1]), 0), cp.uint8)
print(held.nbytes, flush=True)
sys.stdin.read()
"""


def model_bytes(status, name: str) -> int:
    (m,) = [m for m in status.models if m.name == name]
    b = m.bytes
    return b.weights + b.w16 + b.kv + b.scratch


def generate_ok(d: Daemon, model: str) -> None:
    req = pb2.GenerateRequest(model=model, ids=pb2.TokenIds(ids=[300, 301, 302]),
                              sampling=pb2.SamplingParams(temperature=0, max_tokens=4))
    assert list(d.stub().Generate(req))[-1].finish_reason in ("length", "stop")


def test_memory_taken_by_another_process(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for i, name in enumerate(("a", "b")):  # two files: loads of one file would share weights
        write_model(models / f"{name}.gguf", "qwen2", "7b", "q4_k_m", overrides={"layers": 4}, seed=i,
                    random_blocks_=True)
    d = Daemon(tmp_path, "--device", "cuda", "--budget", "60GiB", "--models-dir", models)
    try:
        d.load("a.gguf", "a", ctx=256, matmul_path=pb2.W16)
        w16_a = [m for m in d.status().models if m.name == "a"][0].bytes.w16
        assert w16_a > 0
        d.load("b.gguf", "b", ctx=256)  # measure what b takes, then give it back
        need_b = model_bytes(d.status(), "b")
        d.stub().UnloadModel(pb2.UnloadModelRequest(name="b"))
        before = d.status().pool.used_bytes

        # Leave the device room for b only if a's f16 copy goes.
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(need_b - w16_a // 2)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert int(hog.stdout.readline()) > 0
            try:
                d.load("b.gguf", "b", ctx=256)
                outcome = "loaded"
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                outcome = "refused"
            st = d.status()
            names = {m.name for m in st.models}
            if outcome == "loaded":
                a = [m for m in st.models if m.name == "a"][0]
                assert names == {"a", "b"} and a.bytes.w16 == 0 and a.matmul_path != "w16", a
            else:
                assert names == {"a"} and st.pool.used_bytes == before
            print(f"foreign memory: b {outcome}; pool {st.pool.used_bytes} bytes")
            generate_ok(d, "a")  # the model already there serves on, through the squeeze
        finally:
            hog.stdin.close()
            hog.wait(30)
        if "b" not in {m.name for m in d.status().models}:
            d.load("b.gguf", "b", ctx=256)  # the memory is back: the refused load now succeeds
        generate_ok(d, "b")
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0, d.log.read_text()[-3000:]
