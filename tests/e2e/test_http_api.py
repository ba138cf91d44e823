"""The OpenAI-compatible HTTP front through the official openai client, against a real daemon:
models listed from --models-dir, loaded on demand, the same greedy text as gRPC Generate,
streamed or not, usage that counts the tokenizer's tokens, OpenAI error classes."""
from __future__ import annotations

import shutil
import socket
import threading
import urllib.error
import urllib.request

import pytest

from minferd._proto import pb2
from tests.e2e.daemon import Daemon

openai = pytest.importorskip("openai")
TOKEN = "http-front-token-0123456789"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def front(tmp_path_factory, synth_model):
    tmp = tmp_path_factory.mktemp("http")
    models = tmp / "models"
    models.mkdir()
    shutil.copy(synth_model("qwen2"), models / "tiny.gguf")
    port = _port()
    d = Daemon(tmp, "--models-dir", models, "--device", "cpu", "--budget", "1GiB", "--http", f"127.0.0.1:{port}",
               token=TOKEN)
    yield d, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=TOKEN, max_retries=0)
    d.stop()


def _grpc_text(d: Daemon, prompt: str, n: int) -> str:
    events = d.stub().Generate(pb2.GenerateRequest(model="tiny", text=prompt, sampling=pb2.SamplingParams(
        temperature=0, max_tokens=n)), metadata=d.metadata())
    return "".join(e.text for e in events)


def test_a_models_dir_file_is_listed_then_loaded_on_demand(front):
    d, client = front
    assert {m.id: m.model_extra.get("loaded") for m in client.models.list().data} == {"tiny": False}
    r = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert [m.name for m in d.status().models] == ["tiny"]
    assert r.choices[0].text == _grpc_text(d, "The quick brown fox", 8)
    ids = d.stub().Tokenize(pb2.TokenizeRequest(model="tiny", text="The quick brown fox"), metadata=d.metadata()).ids
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 8)
    assert r.choices[0].finish_reason == "length"


def test_streaming_gives_the_same_text(front):
    d, client = front
    whole = client.completions.create(model="tiny", prompt="Once upon", max_tokens=10, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Once upon", max_tokens=10, temperature=0, stream=True))
    assert streamed == whole.choices[0].text
    msgs = [{"role": "user", "content": "hello there"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens == 6


def test_four_requests_at_once_all_answer(front):
    _, client = front
    out, errors = [None] * 4, []

    def go(i):
        try:
            out[i] = client.completions.create(model="tiny", prompt=f"number {i}", max_tokens=6, temperature=0)
        except Exception as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and all(r.usage.completion_tokens == 6 for r in out)
    solo = client.completions.create(model="tiny", prompt="number 2", max_tokens=6, temperature=0)
    assert out[2].choices[0].text == solo.choices[0].text


def test_errors_are_openai_errors(front):
    d, client = front
    with pytest.raises(openai.NotFoundError, match="no model named 'nope'"):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="exceeds the model's context"):
        client.completions.create(model="tiny", prompt="x", max_tokens=10 ** 6)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
    stranger = openai.OpenAI(base_url=str(client.base_url), api_key="wrong-token-0123456789", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    with pytest.raises(openai.AuthenticationError, match="missing or wrong bearer token"):
        stranger.completions.create(model="tiny", prompt="x", max_tokens=2, stream=True)
    root = str(client.base_url).removesuffix("/v1/")
    for path, want in (("/", 200), ("/v1/minferd/status", 401), ("/v1/models", 401)):  # the page alone is open
        try:
            got = urllib.request.urlopen(root + path, timeout=30).status
        except urllib.error.HTTPError as e:
            got = e.code
        assert got == want, path
    assert [m.name for m in d.status().models] == ["tiny"]  # nothing changed


@pytest.mark.parametrize("args, says", [
    (("--http", "127.0.0.1:{port}"), "without a token"),
    (("--http", "0.0.0.0:{port}", "--insecure"), "loopback address only"),
    (("--http", "nonsense"), "expected HOST:PORT"),
])
def test_the_front_needs_a_token_or_insecure_loopback(tmp_path, args, says):
    port = _port()
    d = Daemon(tmp_path, "--device", "cpu", *(a.format(port=port) for a in args), wait=False)
    assert d.proc.wait(60) != 0
    assert says in d.log.read_text()


def test_oversized_and_malformed_bodies_are_refused(front):
    import http.client
    import urllib.error
    import urllib.request
    d, client = front
    url = str(client.base_url).rstrip("/") + "/completions"

    def post(data: bytes):
        req = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {TOKEN}",
                                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as e:
            # answered 413 and closed before the body was all sent: the client sees the reset
            reason = getattr(e, "reason", e)
            assert isinstance(reason, ConnectionError | http.client.HTTPException), e
            return 413, b""

    client.completions.create(model="tiny", prompt="x", max_tokens=1)  # loaded, whichever test ran first
    code, body = post(b"{not json")
    assert code == 400 and b"not JSON" in body
    code, body = post(b"[1, 2]")
    assert code == 400 and b"JSON object" in body
    code, body = post(b'{"model": "tiny", "prompt": "' + b"x" * (17 << 20) + b'"}')
    assert code == 413
    code, body = post(b'{"model": "tiny", "prompt": [1, 2], "n": 3}')
    assert code == 400 and b"only 1" in body
    # Lone surrogates, which json.loads lets through (an escape, or the bytes of an encoded one):
    # the tokenizer takes valid UTF-8 only, and this was a 500.
    for bad in (b'{"model": "tiny", "prompt": "\\ud800 hi", "max_tokens": 2}',
                b'{"model": "tiny", "prompt": "\xed\xa0\x80", "max_tokens": 2}'):
        code, body = post(bad)
        assert code == 400 and b"lone surrogate" in body and b"invalid_request_error" in body, (bad, code, body)
    assert [m.name for m in d.status().models] == ["tiny"]
    assert client.completions.create(model="tiny", prompt="still here", max_tokens=2).usage.completion_tokens == 2


def test_a_request_sets_its_model_s_keep_alive(front):
    """Ollama's per-request keep_alive, over HTTP and gRPC: -1 keeps it, 0 unloads it once idle."""
    import time
    d, client = front
    client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"keep_alive": -1})
    (m,) = d.status().models
    assert m.keep_alive_seconds == -1
    with pytest.raises(openai.BadRequestError, match="keep_alive"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"keep_alive": "soon"})
    list(d.stub().Generate(pb2.GenerateRequest(model="tiny", text="bye", keep_alive_seconds=0,
                                               sampling=pb2.SamplingParams(max_tokens=2)), metadata=d.metadata()))
    deadline = time.monotonic() + 10
    while d.status().models and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not d.status().models  # unloaded once idle; the next request loads it again
    assert client.completions.create(model="tiny", prompt="again", max_tokens=2).usage.completion_tokens == 2


def test_requests_past_the_cap_get_429_and_never_starve_the_front(tmp_path, synth_model):
    """--http-max-requests 1 with a load that takes ~1.3 s (MINFERD_LOAD_PAUSE_S): the request that
    loads its model on demand holds the one place, a second gets 429 at once, and /v1/models
    answers meanwhile. The front's generations waited on Starlette's shared pool of 40 threads:
    40 of them (waiting for a load, or for room in the batch) stalled every other call."""
    import time
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(synth_model("qwen2"), models / "tiny.gguf")
    port = _port()
    d = Daemon(tmp_path, "--models-dir", models, "--device", "cpu", "--budget", "1GiB", "--insecure",
               "--http", f"127.0.0.1:{port}", "--http-max-requests", "1", env={"MINFERD_LOAD_PAUSE_S": "0.05"})
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        first = {}
        loader = threading.Thread(target=lambda: first.setdefault("r", client.completions.create(
            model="tiny", prompt="hello", max_tokens=4, temperature=0)))
        loader.start()
        deadline = time.monotonic() + 30
        while "tiny" not in d.status().pool.loading and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "tiny" in d.status().pool.loading
        t0 = time.monotonic()
        with pytest.raises(openai.RateLimitError, match="at most 1"):
            client.completions.create(model="tiny", prompt="me too", max_tokens=4)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        assert time.monotonic() - t0 < 0.5 and "tiny" in d.status().pool.loading  # neither waited for the load
        loader.join(60)
        assert first["r"].usage.completion_tokens == 4
        # The place is free again, after a streamed answer and after a client that left mid-stream.
        assert len(list(client.completions.create(model="tiny", prompt="a", max_tokens=3, stream=True))) >= 2
        with client.completions.create(model="tiny", prompt="b", max_tokens=500, stream=True) as s:
            next(iter(s))
        deadline = time.monotonic() + 30
        while True:
            try:
                assert client.completions.create(model="tiny", prompt="c", max_tokens=2).usage.completion_tokens == 2
                break
            except openai.RateLimitError:  # the stream left behind ends at the engine's next step
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        d.stop()
