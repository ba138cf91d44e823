"""Tests of the other model, and of the factory handing out the one handle it already made."""


def test_llama_generates(llama, calls):
    res = calls.generate(llama, "Once upon a time")
    assert res["finish_reason"] in ("length", "stop") and len(res["token_ids"]) <= 4


def test_seeded_sampling_repeats(llama, calls):
    a = calls.generate(llama, "Once upon a time", temperature=0.9, seed=7)
    b = calls.generate(llama, "Once upon a time", temperature=0.9, seed=7)
    assert a["token_ids"] == b["token_ids"]


def test_factory_returns_the_same_handle(llama, minferd_model):
    assert minferd_model(llama.path) is llama
    assert llama.info["architecture"] == "llama"
