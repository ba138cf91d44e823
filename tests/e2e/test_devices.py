"""One daemon over several devices (issue 18), with CPU stand-ins (`--device cpu:0,cpu:1`): a pool
per device in GetStatus, `minferctl status` and the metrics; LoadModel's `device`; placement and
a refusal that names every device."""
from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from minferd._proto import pb2
from minferd.config import ServeConfig
from minferd.errors import InvalidRequest
from minferd.serve import devices_of
from tests.e2e.daemon import Daemon

MiB = 1 << 20


@pytest.mark.parametrize("spec, says", [
    ("cpu:0,cpu:0", "named twice"), ("cpu,cuda:0", "do not mix"), ("gpu:0", "expected auto"),
    ("cpu:x", "expected auto"), ("cuda:9", r"CUDA device\(s\) visible"),
])
def test_bad_device_lists_are_refused(spec, says):
    with pytest.raises(InvalidRequest, match=says):
        devices_of(spec)


def test_device_lists():
    assert devices_of("cpu:0,cpu:1") == ["cpu:0", "cpu:1"]
    assert devices_of("cpu") == ["cpu"]
    assert ServeConfig().device == "auto"


@pytest.fixture(scope="module")
def two(tmp_path_factory, synth_model):
    qwen, lm = synth_model("qwen2"), synth_model("llama", "q4_k")
    d = Daemon(tmp_path_factory.mktemp("devices"), "--device", "cpu:0,cpu:1", "--budget", "24MiB",
               "--w16-min-bytes", "0", "--models-dir", qwen.parent, "--models-dir", lm.parent)
    d.files = (qwen, lm)
    yield d
    assert d.stop() == 0


def test_models_spread_over_the_devices_and_status_shows_each_pool(two):
    qwen, lm = two.files
    a = two.load(qwen, "a", ctx=256)[-1].model
    b = two.load(lm, "b", ctx=256)[-1].model
    c = two.load(qwen, "c", ctx=128, device=a.device)[-1].model
    assert {a.device, b.device} == {"cpu:0", "cpu:1"} and c.device == a.device and c.weight_set == a.weight_set
    st = two.status()
    assert [p.device for p in st.pools] == ["cpu:0", "cpu:1"] and st.pool.device == "cpu:0,cpu:1"
    assert st.pool.used_bytes == sum(p.used_bytes for p in st.pools)
    for p in st.pools:
        on = [m for m in st.models if m.device == p.device]
        sets = {m.weight_set: m.bytes.weights + m.bytes.w16 for m in on}
        assert p.used_bytes == sum(sets.values()) + sum(m.bytes.kv + m.bytes.scratch for m in on)

    out = subprocess.run([sys.executable, "-m", "minferd.ctl", "--address", two.address, "status"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "DEVICE" in out and "POOL cpu:0" in out and "POOL cpu:1" in out, out

    with pytest.raises(grpc.RpcError) as e:  # a name lives on one device
        two.load(lm, "a", ctx=256, device=b.device)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"is on {a.device}" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:  # neither device has room: both are named
        two.load(lm, "big", ctx=2048, kv_tokens=16384)  # 32 MiB of KV alone
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cpu:0:" in e.value.details() and "cpu:1:" in e.value.details(), e.value.details()
    for n in ("a", "b", "c"):
        two.stub().UnloadModel(pb2.UnloadModelRequest(name=n))
    assert two.status().pool.used_bytes == 0
