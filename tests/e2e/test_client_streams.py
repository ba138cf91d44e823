"""minferd.Client's streams against a real daemon on a real unix socket: read on the calling
thread (client.channel_options), they must still deliver every piece in order, end a call whose
callback raises (the daemon frees the sequence at once), and honour the client's deadline."""
import time

import grpc
import pytest

from minferd.client import Client
from minferd.model.synth import write_model
from minferd.spawn import start_daemon, stop_daemon

LONG_CTX = 8192  # a generation that outlasts the deadline below on any machine


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    work = tmp_path_factory.mktemp("client-streams")
    models = work / "models"
    models.mkdir()
    write_model(models / "long.gguf", "qwen2", "tiny", "q8_0", seed=1, overrides={"ctx": LONG_CTX})
    d = start_daemon(work, ["--models-dir", str(models), "--device", "cpu", "--budget", "512MiB"])
    c = Client(d["address"], timeout=None)
    c.load(str(models / "long.gguf"), name="m", ctx=LONG_CTX)
    yield c
    c.close()
    stop_daemon(d["pid"])


def running(c: Client) -> int:
    return next(m for m in c.status()["models"] if m["name"] == "m")["engine"]["running"]


def test_pieces_arrive_in_order_and_make_the_text(client):
    pieces = []
    got = client.generate("m", [300, 301, 302], on_text=pieces.append, temperature=0, max_tokens=12)
    assert got["finish_reason"] in ("length", "stop") and 1 <= len(got["token_ids"]) <= 12
    assert "".join(pieces) == got["text"] and got["timings"]["generated_tokens"] == len(got["token_ids"])


def test_a_callback_that_raises_ends_the_call_and_frees_its_sequence(client):
    class Stop(Exception):
        pass

    seen = []

    def stop_at_three(piece):
        seen.append(piece)
        if len(seen) == 3:
            raise Stop()

    with pytest.raises(Stop):
        client.generate("m", [300, 301], on_text=stop_at_three, temperature=0, max_tokens=LONG_CTX - 8)
    deadline = time.monotonic() + 10
    while running(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(client) == 0, "the cancelled generation still runs"
    assert client.generate("m", [300], temperature=0, max_tokens=2)["finish_reason"] in ("length", "stop")


def test_the_clients_deadline_ends_a_long_stream(client):
    short = Client(client.address, timeout=0.3)
    try:
        t = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            short.generate("m", [300, 301], temperature=0, max_tokens=LONG_CTX - 8)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t < 5
    finally:
        short.close()
    deadline = time.monotonic() + 10
    while running(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(client) == 0
