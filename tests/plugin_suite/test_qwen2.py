"""Tests of one model: greedy decoding is reproducible, text and token-id prompts both work."""


def test_greedy_is_deterministic(qwen2, calls):
    a = calls.generate(qwen2, "The quick brown fox")
    b = calls.generate(qwen2, "The quick brown fox")
    assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]


def test_token_id_prompt(qwen2, calls):
    res = calls.generate(qwen2, [300, 301, 302], max_tokens=3)
    assert 1 <= len(res["token_ids"]) <= 3
    assert res["finish_reason"] in ("length", "stop")
    assert res["timings"]["prompt_tokens"] == 3


def test_plan_and_footprint(qwen2):
    info = qwen2.info
    assert info["matmul_path"] in ("mmq", "fused_b")  # far below the w16 size gate
    assert info["bytes"]["weights"] > 0 and info["bytes"]["kv"] > 0 and info["bytes"]["w16"] == 0
    assert info["architecture"] == "qwen2"


def test_tokenize(qwen2):
    assert len(qwen2.tokenize("hello world")) >= 2
