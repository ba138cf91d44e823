"""The committed gRPC stubs: identical to what the script generates, importable, and usable on the wire."""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from minferd._proto import pb2, pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "minferd" / "_proto" / "minferd"  # everything under here is the script's output
TOOLS_SERIES = "1.84."  # the GPU image runs grpcio 1.84.0; see scripts/gen_protos.sh


def _tools_version():
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        return None


def _tree(base: Path) -> dict[str, bytes]:
    return {str(p.relative_to(base)): p.read_bytes()
            for p in sorted(base.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_regenerating_changes_nothing(tmp_path):
    have = _tools_version()
    if have is None:
        pytest.skip("grpcio-tools is not installed: cannot regenerate the stubs to compare")
    if not have.startswith(TOOLS_SERIES):
        pytest.skip(f"grpcio-tools {have} installed; the committed stubs are generated with {TOOLS_SERIES}x")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)],
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    fresh, committed = _tree(tmp_path / "minferd"), _tree(GENERATED)
    assert sorted(fresh) == sorted(committed), "the set of generated files differs"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs {stale}: run scripts/gen_protos.sh and commit the result"


def test_stubs_generated_for_the_device_runtime():
    # Checked without grpcio-tools too: a regeneration with newer tools would raise the
    # grpcio floor above what the GPU image has, and the stubs would refuse to import there.
    from minferd._proto.minferd.v1 import minferd_pb2_grpc
    assert minferd_pb2_grpc.GRPC_GENERATED_VERSION.startswith(TOOLS_SERIES)


def test_service_shape():
    svc = pb2.DESCRIPTOR.services_by_name["Minferd"]
    assert svc.full_name == "minferd.v1.Minferd"
    assert pb2.DESCRIPTOR.name == "minferd/v1/minferd.proto"  # what reflection will report
    streaming = {m.name for m in svc.methods if m.server_streaming}
    assert streaming == {"LoadModel", "Generate", "Chat", "Session"}
    assert {m.name for m in svc.methods if m.client_streaming} == {"Session"}
    assert {m.name for m in svc.methods} == {
        "LoadModel", "UnloadModel", "ListModels", "ListAvailable", "GetStatus", "Generate", "Chat", "Session",
        "Tokenize", "Detokenize", "SetModelOptions", "Demote", "Promote"}


def test_messages_round_trip():
    req = pb2.GenerateRequest(model="m", ids=pb2.TokenIds(ids=[2, 651, 6037]))
    req.sampling.temperature = 0.0  # set to zero is not the same as unset: greedy on purpose
    req.sampling.stop.append("\n\n")
    back = pb2.GenerateRequest.FromString(req.SerializeToString())
    assert back == req and back.WhichOneof("prompt") == "ids"
    assert back.sampling.HasField("temperature") and not back.sampling.HasField("top_k")
    assert not back.HasField("add_special")  # unset means true; the server must see the difference

    info = pb2.ModelInfo(name="g", matmul_path="mmq", type_mix={"Q4_K": 120, "F32": 50},
                         bytes=pb2.ByKind(weights=253_000_000, kv=12_582_912), keep_alive_seconds=-1)
    status = pb2.Status(pool=pb2.PoolInfo(device="cpu", capacity_bytes=1 << 30), models=[info])
    back = pb2.Status.FromString(status.SerializeToString())
    assert back == status and back.models[0].type_mix["Q4_K"] == 120

    load = pb2.LoadModelRequest(name="g", path="g.gguf", matmul_path=pb2.FUSED_B, keep_alive_seconds=0)
    back = pb2.LoadModelRequest.FromString(load.SerializeToString())
    assert back.HasField("keep_alive_seconds") and back.keep_alive_seconds == 0  # 0 = unload when idle
    assert pb2.MatmulPath.Name(back.matmul_path) == "FUSED_B"


class _Echo(pb2_grpc.MinferdServicer):
    """Just enough of a servicer to carry a unary and a streaming call over a real channel."""

    def Tokenize(self, request, context):
        return pb2.TokenizeResponse(ids=[ord(c) for c in request.text])

    def Generate(self, request, context):
        for i, ch in enumerate(request.text):
            yield pb2.GenerateEvent(text=ch, token_id=i)
        yield pb2.GenerateEvent(token_id=-1, finish_reason="stop",
                                timings=pb2.Timings(prompt_tokens=len(request.text)))


def test_stubs_over_a_unix_socket(tmp_path):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_MinferdServicer_to_server(_Echo(), server)
    address = f"unix://{tmp_path}/t.sock"
    server.add_insecure_port(address)
    server.start()
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb2_grpc.MinferdStub(channel)
            assert list(stub.Tokenize(pb2.TokenizeRequest(model="m", text="ab"), timeout=10).ids) == [97, 98]
            events = list(stub.Generate(pb2.GenerateRequest(model="m", text="hey"), timeout=10))
            assert "".join(e.text for e in events) == "hey"
            assert events[-1].finish_reason == "stop" and events[-1].timings.prompt_tokens == 3
            with pytest.raises(grpc.RpcError) as err:  # a method the servicer leaves out
                stub.ListModels(pb2.ListModelsRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(None)
