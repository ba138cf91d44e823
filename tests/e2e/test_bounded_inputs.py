"""Bounded inputs against one real daemon (issue 13, items 7 and 8): chat templates a model file
brings (checked at load, rendered within steps, seconds and sizes), and requests whose size would
amplify into work or answers (each refused before any work, naming the field, the limit and the
size received). Every refusal is a typed status within bounded time, and the daemon keeps serving."""
from __future__ import annotations

import time

import grpc
import pytest

from minferd import config
from minferd._proto import pb2
from minferd.model.gguf_file import GGUFFile
from tests.e2e.daemon import Daemon
from tests.gguf_edit import rewrite

C = grpc.StatusCode
CTX = 128
LONG_ID = 500  # the token the "long" model's vocabulary makes 66 bytes long
TEMPLATES = {  # model -> (its tokenizer.chat_template, the code Chat answers, words its message holds)
    "t-syntax": ("{% for m in messages %}\n{{ m.role }\n", C.FAILED_PRECONDITION, "line 2"),
    "t-zero": ("{{ 1 / 0 }}", C.INVALID_ARGUMENT, "ZeroDivisionError"),
    "t-type": ("{{ messages[0]['content'] + 1 }}", C.INVALID_ARGUMENT, "TypeError"),
    "t-undefined": ("{{ nope() }}", C.INVALID_ARGUMENT, "UndefinedError"),
    "t-loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                C.INVALID_ARGUMENT, "ran past"),
    "t-string": ("{{ 'x' * 10 ** 10 }}", C.INVALID_ARGUMENT, "10000000000"),
    "t-recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", C.INVALID_ARGUMENT, "RecursionError"),
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synth_model):
    d = tmp_path_factory.mktemp("bounded-models")
    base = synth_model("qwen2", "q8_0")
    rewrite(base, d / "q.gguf")
    for name, (template, _, _) in TEMPLATES.items():
        rewrite(base, d / f"{name}.gguf", metadata={"tokenizer.chat_template": template})
    tokens = list(GGUFFile(base).field("tokenizer.ggml.tokens"))
    tokens[LONG_ID] = "<" + "L" * 64 + ">"
    rewrite(base, d / "long.gguf", metadata={"tokenizer.ggml.tokens": tokens})
    daemon = Daemon(tmp_path_factory.mktemp("bounded-daemon"), "--models-dir", d, "--budget", "256MiB",
                    "--threads", "1")
    for name in ("q", "long", *TEMPLATES):
        daemon.load(f"{name}.gguf", name, ctx=CTX)
    yield daemon
    assert daemon.stop() == 0


@pytest.fixture(scope="module")
def stub(daemon):
    return daemon.stub()


def refused(call, within: float = 30.0):
    """(code, message, seconds) of a call that must fail; never INTERNAL."""
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        call()
    took = time.monotonic() - t0
    assert took < within, took
    assert e.value.code() != C.INTERNAL, e.value.details()
    return e.value.code(), e.value.details(), took


def chat(stub, model, *contents, timeout=60):
    msgs = [pb2.ChatMessage(role="user", content=c) for c in contents or ("hi",)]
    return list(stub.Chat(pb2.ChatRequest(model=model, messages=msgs, sampling=pb2.SamplingParams(max_tokens=2)),
                          timeout=timeout))


def generates(stub, model) -> bool:
    events = list(stub.Generate(pb2.GenerateRequest(model=model, text="hi", sampling=pb2.SamplingParams(
        max_tokens=2, temperature=0)), timeout=60))
    return events[-1].finish_reason in ("length", "stop")


# ---- chat templates ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", TEMPLATES)
def test_a_bad_template_is_a_typed_refusal_and_the_model_still_generates(stub, model):
    _, code, words = TEMPLATES[model]
    got, msg, _ = refused(lambda: chat(stub, model), within=config.TEMPLATE_SECONDS + 1)
    assert got == code and "chat template" in msg and words in msg, (got, msg)
    assert len(msg) < 400, msg
    assert generates(stub, model)
    assert chat(stub, "q")[-1].finish_reason in ("length", "stop")  # the daemon serves others meanwhile


# ---- names ---------------------------------------------------------------------------------------
def test_a_100kb_model_name_is_not_found_with_a_short_message(stub):
    """The name was echoed whole into the status message and passed gRPC's metadata limit:
    RESOURCE_EXHAUSTED instead of NOT_FOUND."""
    name = "x" * 100_000
    calls = {
        "Generate": lambda: list(stub.Generate(pb2.GenerateRequest(model=name, text="hi"))),
        "Chat": lambda: chat(stub, name),
        "Tokenize": lambda: stub.Tokenize(pb2.TokenizeRequest(model=name, text="hi")),
        "Detokenize": lambda: stub.Detokenize(pb2.DetokenizeRequest(model=name, ids=[300])),
        "UnloadModel": lambda: stub.UnloadModel(pb2.UnloadModelRequest(name=name)),
    }
    for rpc, call in calls.items():
        code, msg, _ = refused(call)
        assert code == C.NOT_FOUND and len(msg) < 1000, (rpc, code, msg[:300])


# ---- sizes ---------------------------------------------------------------------------------------
def test_millions_of_ids_to_detokenize_are_refused_at_once(stub):
    """3.5 M ids built a 168 MB answer outside any budget."""
    request = pb2.DetokenizeRequest(model="q", ids=[300] * 3_500_000)
    code, msg, _ = refused(lambda: stub.Detokenize(request, timeout=30), within=3.0)
    assert code == C.INVALID_ARGUMENT and "ids" in msg and "3500000" in msg \
        and str(config.MAX_DETOKENIZE_IDS) in msg, msg


def test_detokenize_refuses_text_past_the_bound_before_building_it(stub):
    assert len(stub.Detokenize(pb2.DetokenizeRequest(model="long", ids=[LONG_ID] * 10)).text) == 660
    ids = [LONG_ID] * config.MAX_DETOKENIZE_IDS  # within the id bound; 17 MB of text
    code, msg, _ = refused(lambda: stub.Detokenize(pb2.DetokenizeRequest(model="long", ids=ids), timeout=30),
                           within=5.0)
    assert code == C.INVALID_ARGUMENT and str(66 * config.MAX_DETOKENIZE_IDS) in msg \
        and str(config.MAX_TOKENIZE_BYTES) in msg, msg


def test_tokenize_text_is_bounded(stub):
    n = config.MAX_TOKENIZE_BYTES + 1
    code, msg, _ = refused(lambda: stub.Tokenize(pb2.TokenizeRequest(model="q", text="a" * n)), within=2.0)
    assert code == C.INVALID_ARGUMENT and "text" in msg and str(n) in msg \
        and str(config.MAX_TOKENIZE_BYTES) in msg, msg
    assert stub.Tokenize(pb2.TokenizeRequest(model="q", text="a b c")).ids


def test_chat_messages_and_their_text_are_bounded(stub):
    n = config.MAX_CHAT_MESSAGES + 1
    code, msg, _ = refused(lambda: chat(stub, "q", *["hi"] * n), within=5.0)
    assert code == C.INVALID_ARGUMENT and "messages" in msg and str(n) in msg \
        and str(config.MAX_CHAT_MESSAGES) in msg, msg
    half = config.MAX_TOKENIZE_BYTES // 2 + 1
    code, msg, _ = refused(lambda: chat(stub, "q", "a" * half, "b" * half), within=5.0)
    assert code == C.INVALID_ARGUMENT and "content" in msg and str(2 * half) in msg \
        and str(config.MAX_TOKENIZE_BYTES) in msg, msg


def test_the_daemon_still_serves_and_logged_nothing_internal(daemon, stub):
    assert {m.name for m in daemon.status().models} >= {"q", "long", *TEMPLATES}
    assert generates(stub, "q")
    log = daemon.log.read_text()
    for bad in ("internal error", "Traceback"):
        assert bad not in log, log[-3000:]
