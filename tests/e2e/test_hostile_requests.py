"""Hostile requests against one real daemon (issue 7, item 2); clients that die mid-stream are
tests/e2e/test_client_disconnects.py.

Every refusal is asserted with its status code: INVALID_ARGUMENT for a request wrong in itself,
FAILED_PRECONDITION for one that contradicts the daemon's state, NOT_FOUND for an unknown model
name (the daemon's one error map, minferd/server.py), and RESOURCE_EXHAUSTED where gRPC itself
enforces the server's limits (message size, metadata size) before any servicer code runs. Never
INTERNAL, never a crash: the last test checks that the daemon still serves, that no model is left
busy, and that its log holds no internal error.
"""
from __future__ import annotations

import shutil
import threading
import time

import grpc
import pytest

from minferd._proto import pb2
from minferd.model.synth import write_model
from tests.e2e.daemon import Daemon

C = grpc.StatusCode
CTX = 256  # the context the module's models are loaded with
LOADED = {"q", "g", "l", "b"}
VOCAB = 1024  # the tiny presets' vocabulary


@pytest.fixture(scope="module")
def models(tmp_path_factory, synth_model):
    d = tmp_path_factory.mktemp("hostile-models")
    shutil.copy(synth_model("qwen2", "q8_0"), d / "qwen2.gguf")  # GPT-2 byte-level vocabulary
    shutil.copy(synth_model("gemma3", "q8_0"), d / "gemma3.gguf")  # SentencePiece, <0xXX> byte tokens
    shutil.copy(synth_model("llama", "q8_0"), d / "llama.gguf")  # byte-level, untied: varied output
    # The tied tiny presets mostly repeat their prompt token; an untied gemma3 samples all over its
    # vocabulary, byte-fallback tokens included.
    write_model(d / "bytes.gguf", "gemma3", "tiny", "q8_0", seed=1, overrides={"tied": False})
    return d


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, models):
    d = Daemon(tmp_path_factory.mktemp("hostile-daemon"), "--models-dir", models, "--budget", "256MiB",
               "--threads", "1")
    d.load("qwen2.gguf", "q", ctx=CTX)
    d.load("gemma3.gguf", "g", ctx=CTX)
    d.load("llama.gguf", "l", ctx=CTX)
    d.load("bytes.gguf", "b", ctx=CTX)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def stub(daemon):
    return daemon.stub()


def code_of(call, timeout_s: float = 30.0):
    """The status code and details of a call that must fail; never INTERNAL, and in bounded time."""
    t = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert time.monotonic() - t < timeout_s
    assert e.value.code() != C.INTERNAL, e.value.details()
    return e.value.code(), e.value.details()


def gen(stub, model="q", **kw):
    return list(stub.Generate(pb2.GenerateRequest(model=model, **kw), timeout=120))


def ids(*xs):
    return pb2.TokenIds(ids=list(xs))


def sp(**kw):
    return pb2.SamplingParams(**kw)


# ---- prompts ------------------------------------------------------------------------------------
def test_empty_prompt(stub):
    code, msg = code_of(lambda: gen(stub, text="", add_special=False))  # no tokens at all
    assert code == C.INVALID_ARGUMENT and "empty" in msg
    code, msg = code_of(lambda: gen(stub, ids=ids()))
    assert code == C.INVALID_ARGUMENT and "empty" in msg


def test_oversized_prompts(stub):
    code, msg = code_of(lambda: gen(stub, ids=ids(*[300] * (CTX + 1))))
    assert code == C.INVALID_ARGUMENT and f"context of {CTX}" in msg
    code, msg = code_of(lambda: gen(stub, text="hello world " * 200))  # tokenizes past ctx
    assert code == C.INVALID_ARGUMENT and "exceeds" in msg
    # 2 MiB of text cannot fit 256 tokens whatever it holds: refused before tokenizing it.
    code, msg = code_of(lambda: gen(stub, text="a " * (1 << 20)), timeout_s=2.0)
    assert code == C.INVALID_ARGUMENT and "cannot fit" in msg
    msgs = [pb2.ChatMessage(role="user", content="hi")] * 4000  # under MAX_CHAT_MESSAGES: renders, then cannot fit
    code, msg = code_of(lambda: list(stub.Chat(pb2.ChatRequest(model="q", messages=msgs))), timeout_s=5.0)
    assert code == C.INVALID_ARGUMENT and "cannot fit" in msg
    msgs = [pb2.ChatMessage(role="user", content="hi")] * 50_000
    code, msg = code_of(lambda: list(stub.Chat(pb2.ChatRequest(model="q", messages=msgs))), timeout_s=2.0)
    assert code == C.INVALID_ARGUMENT and "50000 messages given, at most 4096" in msg


def test_prompt_of_exactly_ctx_generates_one_token(stub):
    events = gen(stub, ids=ids(*[300] * CTX), sampling=sp(temperature=0))
    assert events[-1].finish_reason in ("ctx", "stop") and events[-1].timings.generated_tokens <= 1


def test_prompt_plus_max_tokens_beyond_ctx(stub):
    code, msg = code_of(lambda: gen(stub, ids=ids(*[300] * 10), sampling=sp(max_tokens=CTX - 9)))
    assert code == C.INVALID_ARGUMENT and "max_tokens" in msg
    code, msg = code_of(lambda: gen(stub, ids=ids(300), sampling=sp(max_tokens=(1 << 32) - 1)))
    assert code == C.INVALID_ARGUMENT and "max_tokens" in msg
    chat = pb2.ChatRequest(model="q", messages=[pb2.ChatMessage(role="user", content="hi")],
                           sampling=sp(max_tokens=CTX))
    code, msg = code_of(lambda: list(stub.Chat(chat)))
    assert code == C.INVALID_ARGUMENT and "max_tokens" in msg
    # Exactly at the edge is fine.
    assert gen(stub, ids=ids(*[300] * 10), sampling=sp(max_tokens=CTX - 10))[-1].finish_reason


@pytest.mark.parametrize("field,value", [
    ("temperature", -1.0), ("temperature", float("nan")), ("temperature", float("inf")),
    ("top_p", 1.5), ("top_p", 0.0), ("top_p", float("nan")), ("min_p", 1.01), ("min_p", -0.1),
    ("top_k", -1), ("repeat_penalty", 0.0), ("repeat_penalty", -1.0), ("repeat_penalty", float("inf")),
    ("repeat_last_n", -2), ("max_tokens", 0),
])
def test_bad_sampling_parameters(stub, field, value):
    code, msg = code_of(lambda: gen(stub, text="hi", sampling=sp(**{field: value})))
    assert code == C.INVALID_ARGUMENT and field in msg


@pytest.mark.parametrize("stop,words", [(["x"] * 17, "at most 16"), (["ok", ""], "non-empty")])
def test_bad_stop_strings(stub, stop, words):
    code, msg = code_of(lambda: gen(stub, text="hi", sampling=sp(stop=stop)))
    assert code == C.INVALID_ARGUMENT and words in msg
    chat = pb2.ChatRequest(model="q", messages=[pb2.ChatMessage(role="user", content="hi")], sampling=sp(stop=stop))
    assert code_of(lambda: list(stub.Chat(chat)))[0] == C.INVALID_ARGUMENT


@pytest.mark.parametrize("kw", [
    dict(repeat_penalty=1e-308, temperature=1.0), dict(repeat_penalty=1e308, temperature=1.0),
    dict(repeat_penalty=1e-308, temperature=0.0), dict(temperature=1e-300), dict(temperature=1e300),
    dict(top_k=(1 << 31) - 1, top_p=1e-300, min_p=1.0), dict(seed=(1 << 64) - 1),
    dict(repeat_last_n=(1 << 31) - 1, repeat_penalty=1.5), dict(stop=["\n" * 1000] * 16),
])
def test_extreme_but_valid_sampling_completes(stub, kw):
    """Valid values at the edges of their ranges generate. (A repeat_penalty of 1e-308 overflowed
    penalized logits to inf and came back INTERNAL.)"""
    prompt = ids(*range(300, 340))  # a history for the penalty to act on
    events = gen(stub, ids=prompt, sampling=sp(**{"max_tokens": 8, "repeat_last_n": -1, **kw}))
    assert events[-1].finish_reason in ("length", "stop")


def test_token_ids_outside_the_vocabulary(stub):
    for bad in (-1, -(1 << 31), VOCAB, (1 << 31) - 1):
        code, msg = code_of(lambda: gen(stub, ids=ids(300, bad)))
        assert code == C.INVALID_ARGUMENT and "outside the vocabulary" in msg, bad
        code, msg = code_of(lambda: stub.Detokenize(pb2.DetokenizeRequest(model="q", ids=[300, bad])))
        assert code == C.INVALID_ARGUMENT and "outside the vocabulary" in msg, bad


# ---- names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["nope", "", "q ", "x" * 1000])
def test_unknown_model_names_for_every_rpc(stub, name):
    """NOT_FOUND, the daemon's code for a model that is not loaded, from each RPC that takes a name."""
    calls = {
        "Generate": lambda: list(stub.Generate(pb2.GenerateRequest(model=name, text="hi"))),
        "Chat": lambda: list(stub.Chat(pb2.ChatRequest(model=name, messages=[pb2.ChatMessage(role="user",
                                                                                              content="hi")]))),
        "Tokenize": lambda: stub.Tokenize(pb2.TokenizeRequest(model=name, text="hi")),
        "Detokenize": lambda: stub.Detokenize(pb2.DetokenizeRequest(model=name, ids=[300])),
        "UnloadModel": lambda: stub.UnloadModel(pb2.UnloadModelRequest(name=name)),
        "SetModelOptions": lambda: stub.SetModelOptions(pb2.SetModelOptionsRequest(name=name, pinned=True)),
        "Demote": lambda: stub.Demote(pb2.DemoteRequest(name=name)),
        "Promote": lambda: stub.Promote(pb2.PromoteRequest(name=name)),
    }
    for rpc, call in calls.items():
        code, msg = code_of(call)
        assert code == C.NOT_FOUND and "no model named" in msg, rpc


def test_load_model_names_and_options(daemon, stub):
    def load(**kw):
        return list(stub.LoadModel(pb2.LoadModelRequest(**{"path": "qwen2.gguf", "ctx": 64, **kw})))

    for name in ("a b", "tab\tname", "x" * 1000, "ctl\x01name", "zero\u200bwidth", "bidi\u202ename"):
        code, msg = code_of(lambda: load(name=name))
        assert code == C.INVALID_ARGUMENT and "model name" in msg, repr(name)
    code, msg = code_of(lambda: load(name="p", path="a" * 300))  # one path component past NAME_MAX
    assert code == C.INVALID_ARGUMENT and "too long" in msg
    code, msg = code_of(lambda: load(name="p", path="a/" * 3000 + "x.gguf"))  # a path past PATH_MAX
    assert code in (C.INVALID_ARGUMENT, C.PERMISSION_DENIED, C.NOT_FOUND), msg
    code, msg = code_of(lambda: load(name="p", matmul_path=7))  # proto3 enums are open
    assert code == C.INVALID_ARGUMENT and "matmul_path" in msg
    code, msg = code_of(lambda: load(name="p", keep_alive_seconds=float("nan")))
    assert code == C.INVALID_ARGUMENT and "keep_alive" in msg
    before = [m for m in daemon.status().models if m.name == "q"][0]
    code, msg = code_of(lambda: stub.SetModelOptions(pb2.SetModelOptionsRequest(
        name="q", pinned=not before.pinned, keep_alive_seconds=float("nan"))))
    assert code == C.INVALID_ARGUMENT and "keep_alive" in msg
    after = [m for m in daemon.status().models if m.name == "q"][0]
    assert (after.pinned, after.keep_alive_seconds) == (before.pinned, before.keep_alive_seconds)  # all or nothing
    assert {m.name for m in daemon.status().models} - {"long"} == LOADED  # nothing half-loaded


def test_name_in_use_is_failed_precondition(stub):
    req = pb2.LoadModelRequest(name="q", path="gemma3.gguf", ctx=64)
    code, msg = code_of(lambda: list(stub.LoadModel(req)))
    assert code == C.FAILED_PRECONDITION and "in use" in msg


def test_ctx_zero_takes_the_default_and_past_training_is_refused(daemon, stub):
    events = daemon.load("qwen2.gguf", "c0", ctx=0)
    assert events[-1].model.ctx == 2048  # min(training context 2048, the daemon's default 4096)
    stub.UnloadModel(pb2.UnloadModelRequest(name="c0"))
    for ctx in (2049, 1 << 20, (1 << 32) - 1):
        code, msg = code_of(lambda: daemon.load("qwen2.gguf", "cbig", ctx=ctx))
        assert code == C.INVALID_ARGUMENT and "training context" in msg, ctx
    assert {m.name for m in daemon.status().models} - {"long"} == LOADED


# ---- chat ----------------------------------------------------------------------------------------
def test_chat_without_messages_or_with_unknown_roles(stub):
    def chat(model, *msgs):
        return list(stub.Chat(pb2.ChatRequest(model=model, messages=[pb2.ChatMessage(role=r, content=c)
                                                                      for r, c in msgs], sampling=sp(max_tokens=2))))

    code, msg = code_of(lambda: chat("q"))
    assert code == C.INVALID_ARGUMENT and "no messages" in msg
    for role in ("wizard", "", "user<|im_end|>", "USER"):
        code, msg = code_of(lambda: chat("q", (role, "hi")))
        assert code == C.INVALID_ARGUMENT and "role" in msg, role
    # A template's own refusal (gemma's turns must alternate) is the request's fault, not ours.
    code, msg = code_of(lambda: chat("g", ("user", "a"), ("user", "b")))
    assert code == C.INVALID_ARGUMENT and "chat template" in msg
    assert chat("q", ("system", "be brief"), ("user", "hi"))[-1].finish_reason in ("length", "stop")


# ---- transport limits ----------------------------------------------------------------------------
def test_huge_message_is_refused_by_grpc(daemon, stub):
    """Beyond the server's 16 MiB receive limit gRPC answers RESOURCE_EXHAUSTED itself; under it,
    a prompt that cannot fit is INVALID_ARGUMENT at once, and status stays quick meanwhile."""
    code, msg = code_of(lambda: gen(stub, text="a" * (20 << 20)))
    assert code == C.RESOURCE_EXHAUSTED and "larger than max" in msg
    slow = []

    def probe(stop):
        s = daemon.stub()
        while not stop.is_set():
            t = time.monotonic()
            s.GetStatus(pb2.GetStatusRequest(), timeout=30)
            slow.append(time.monotonic() - t)
            time.sleep(0.02)

    stop = threading.Event()
    th = threading.Thread(target=probe, args=(stop,))
    th.start()
    try:
        for text in ("a " * (6 << 20), "\u00e9" * (7 << 20)):  # 12 and 14 MiB
            code, msg = code_of(lambda: gen(stub, text=text), timeout_s=5.0)
            assert code == C.INVALID_ARGUMENT and "cannot fit" in msg
        # Tokenize has no context to check against; a long text must not freeze the daemon.
        r = stub.Tokenize(pb2.TokenizeRequest(model="q", text="hello " * (1 << 17)), timeout=120)
        assert len(r.ids) >= 1 << 17
    finally:
        stop.set()
        th.join()
    assert slow and max(slow) < 2.0, max(slow)


def test_oversized_metadata_is_refused_by_grpc(stub):
    """The server caps request metadata at 16 KiB (gRPC's hard limit is 1.25x that)."""
    code, msg = code_of(lambda: stub.GetStatus(pb2.GetStatusRequest(), metadata=(("x-big", "a" * 65536),)))
    assert code == C.RESOURCE_EXHAUSTED and "metadata" in msg
    many = tuple((f"x-{i}", "a" * 100) for i in range(400))  # 40 KiB in many small headers
    code, msg = code_of(lambda: stub.GetStatus(pb2.GetStatusRequest(), metadata=many))
    assert code == C.RESOURCE_EXHAUSTED and "metadata" in msg
    assert stub.GetStatus(pb2.GetStatusRequest(), metadata=(("x-ok", "a" * 4096),)).pool.device == "cpu"


# ---- streamed text -------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["l", "b"])
def test_streamed_text_is_valid_utf8(stub, model):
    """Byte tokens that are only part of a UTF-8 character are held back until it completes (or
    become U+FFFD when it cannot): every streamed `text` is valid UTF-8 (protobuf's parser would
    refuse anything else) and the stream adds up to Detokenize of the same ids."""
    partial = held = 0
    for seed in range(4):
        events = gen(stub, model, ids=ids(300), sampling=sp(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                                            seed=seed, max_tokens=CTX - 1))
        toks = [e.token_id for e in events if e.token_id >= 0]
        text = "".join(e.text for e in events)
        for e in events:
            e.text.encode("utf-8")  # no lone surrogates either
        held += sum(1 for e in events if e.token_id >= 0 and e.text == "")
        for t in set(toks):
            if "\ufffd" in stub.Detokenize(pb2.DetokenizeRequest(model=model, ids=[t])).text:
                partial += 1  # a token that is not whole UTF-8 by itself
        whole = stub.Detokenize(pb2.DetokenizeRequest(model=model, ids=toks)).text
        # Detokenize drops the leading space SentencePiece puts on the first word; the stream keeps it.
        assert text == whole or (text[:1] == " " and text[1:] == whole), (model, seed)
    assert partial > 0 and held > 0  # the test did exercise split characters


# ---- and after all of it -------------------------------------------------------------------------
def test_daemon_still_serves(daemon, stub):
    events = gen(stub, "q", text="hello world", sampling=sp(max_tokens=4, seed=1))
    assert events[-1].finish_reason in ("length", "stop")
    chat = list(stub.Chat(pb2.ChatRequest(model="g", messages=[pb2.ChatMessage(role="user", content="hi")],
                                          sampling=sp(max_tokens=4))))
    assert chat[-1].finish_reason in ("length", "stop")
    st = daemon.status()
    assert not any(m.busy for m in st.models), [m.name for m in st.models if m.busy]
    assert st.pool.reserved_bytes == 0
    assert daemon.proc.poll() is None
    log = daemon.log.read_text()
    for bad in ("internal error", "Traceback", "Exception calling callback"):
        assert bad not in log, log[-3000:]
