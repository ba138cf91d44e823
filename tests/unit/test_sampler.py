import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minferd.errors import InvalidRequest
from minferd.model.sampler import SamplingParams, Sampler, StopChecker

# Everything off but temperature, so one filter at a time can be tested.
PLAIN = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def logits_for(probs, vocab=None):
    out = np.full(vocab or len(probs), -np.inf, dtype=np.float32)
    out[: len(probs)] = np.log(np.asarray(probs, dtype=np.float64))
    return out


def draws(params, logits, n=3000, history=()):
    s = Sampler(params)
    return np.array([s.sample(logits, history) for _ in range(n)])


# --- SamplingParams ---------------------------------------------------------------

def test_defaults_are_llama_cpp_server_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.seed, p.max_tokens, p.stop) == (1.0, 64, None, 128, ())


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "1"),
        ("top_k", -1), ("top_k", 2.5), ("top_k", True),
        ("top_p", 0.0), ("top_p", 1.01), ("top_p", float("nan")),
        ("min_p", -0.01), ("min_p", 1.5),
        ("repeat_penalty", 0.0), ("repeat_penalty", -1.0), ("repeat_penalty", float("inf")),
        ("repeat_last_n", -2),
        ("seed", -1), ("seed", 1 << 64), ("seed", 1.5),
        ("max_tokens", 0), ("max_tokens", (1 << 20) + 1),
        ("stop", ("ok", "")), ("stop", "</s>"), ("stop", tuple(f"s{i}" for i in range(17))), ("stop", (3,)), ("stop", None),
    ],
)
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(InvalidRequest, match=field) as info:
        SamplingParams(**{field: value})
    assert "must be" in str(info.value)  # and say what is allowed


def test_stop_list_becomes_tuple_and_params_stay_hashable_and_frozen():
    p = SamplingParams(stop=["a", "b"], seed=3)
    assert p.stop == ("a", "b")
    hash(p)
    with pytest.raises(AttributeError):
        p.temperature = 1.0


def test_edge_values_are_accepted():
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=0.0, repeat_last_n=-1, seed=0, max_tokens=1)
    SamplingParams(min_p=1.0, seed=(1 << 64) - 1, max_tokens=1 << 20, stop=tuple("abcdefghijklmnop"))


# --- Sampler ----------------------------------------------------------------------

def test_greedy_picks_argmax_and_lowest_id_on_ties():
    rng = np.random.default_rng(0)
    s = Sampler(SamplingParams(temperature=0))
    for _ in range(20):
        row = rng.standard_normal(1000).astype(np.float32)
        assert s.sample(row, []) == int(np.argmax(row))
    tied = np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)
    assert s.sample(tied, []) == 1


def test_same_seed_same_sequence_different_seeds_differ():
    row = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    a = draws(SamplingParams(seed=42, **PLAIN), row, 200)
    b = draws(SamplingParams(seed=42, **PLAIN), row, 200)
    c = draws(SamplingParams(seed=43, **PLAIN), row, 200)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_top_k_1_equals_greedy():
    rng = np.random.default_rng(2)
    greedy, top1 = Sampler(SamplingParams(temperature=0)), Sampler(SamplingParams(top_k=1, temperature=5.0, seed=1))
    for _ in range(50):
        row = rng.standard_normal(4096).astype(np.float32)
        assert top1.sample(row, []) == greedy.sample(row, [])


def test_top_k_restricts_support():
    row = logits_for([0.3, 0.25, 0.2, 0.15, 0.1])
    assert set(draws(SamplingParams(seed=3, **{**PLAIN, "top_k": 2}), row)) == {0, 1}


@pytest.mark.parametrize("top_p, support", [(0.4, {0}), (0.75, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_smallest_prefix_reaching_p(top_p, support):
    row = logits_for([0.5, 0.3, 0.15, 0.05], vocab=64)
    assert set(draws(SamplingParams(seed=4, **{**PLAIN, "top_p": top_p}), row)) == support


def test_top_p_over_a_large_flat_vocab_matches_a_full_sort():
    # The nucleus here is far bigger than the first head the sampler sorts, so it must grow.
    row = np.random.default_rng(5).standard_normal(5000).astype(np.float32)
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    order = np.argsort(-p)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    n = int(np.searchsorted(np.cumsum(p[order]), 0.5)) + 1  # llama.cpp keeps the crossing token
    got = rank[draws(SamplingParams(seed=5, **{**PLAIN, "top_p": 0.5}), row, 400)]
    assert n > 300 and got.max() < n and got.max() > 256


@pytest.mark.parametrize("min_p, support", [(0.0, {0, 1, 2, 3}), (0.2, {0, 1, 2}), (0.5, {0, 1}), (1.0, {0})])
def test_min_p_drops_tokens_below_fraction_of_the_best(min_p, support):
    row = logits_for([0.5, 0.3, 0.15, 0.05])
    assert set(draws(SamplingParams(seed=6, **{**PLAIN, "min_p": min_p}), row)) == support


def test_draws_follow_the_softmax_also_over_a_large_vocab():
    # 3000 tokens: past one block of the two-level inverse CDF.
    probs = np.full(3000, 0.4 / 2997)
    probs[[0, 1500, 2999]] = [0.3, 0.2, 0.1]
    got = np.bincount(draws(SamplingParams(seed=7, **PLAIN), logits_for(probs), 8000), minlength=3000) / 8000
    assert got[[0, 1500, 2999]] == pytest.approx([0.3, 0.2, 0.1], abs=0.02)


def test_temperature_sharpens_and_flattens():
    row = logits_for([0.6, 0.4])
    cold = (draws(SamplingParams(seed=8, **{**PLAIN, "temperature": 0.2}), row) == 0).mean()
    hot = (draws(SamplingParams(seed=8, **{**PLAIN, "temperature": 5.0}), row) == 0).mean()
    assert cold > 0.85 and 0.45 < hot < 0.6
    assert set(draws(SamplingParams(seed=8, **{**PLAIN, "temperature": 1e-40}), row, 200)) == {0}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    greedy = dict(temperature=0, repeat_penalty=1.1)
    pos = np.array([2.0, 1.9, 0.0], dtype=np.float32)  # 2.0 / 1.1 = 1.82 < 1.9
    assert Sampler(SamplingParams(**greedy)).sample(pos, [0]) == 1
    neg = np.array([-1.0, -1.05, -9.0], dtype=np.float32)  # -1.0 * 1.1 = -1.1 < -1.05
    assert Sampler(SamplingParams(**greedy)).sample(neg, [0, 0, 0]) == 1
    assert pos[0] == 2.0  # the caller's row is untouched


@pytest.mark.parametrize(
    "last_n, history, picked",
    [(0, [0], 0), (1, [0, 2], 0), (2, [0, 2], 1), (64, [0] + [2] * 64, 0), (-1, [0] + [2] * 64, 1)],
)
def test_repetition_penalty_window(last_n, history, picked):
    row = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=1.1, repeat_last_n=last_n))
    assert s.sample(row, history) == picked


def test_bad_logits_and_history_raise():
    s = Sampler(SamplingParams(seed=0))
    with pytest.raises(ValueError):
        s.sample(np.array([0.0, np.nan], dtype=np.float32), [])
    with pytest.raises(ValueError):
        Sampler(SamplingParams(temperature=0)).sample(np.array([np.nan, 0.0], dtype=np.float32), [])
    with pytest.raises(ValueError):
        s.sample(np.zeros((2, 3), dtype=np.float32), [])
    with pytest.raises(ValueError):
        Sampler(SamplingParams(repeat_penalty=1.2)).sample(np.zeros(3, dtype=np.float32), [3])


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    top_k=st.integers(0, 50),
    min_p=st.floats(0, 1),
    top_p=st.floats(0.01, 1),
    temperature=st.floats(0.01, 10),
)
def test_sample_respects_top_k_and_min_p(seed, top_k, min_p, top_p, temperature):
    row = np.random.default_rng(seed).standard_normal(300).astype(np.float32) * 4
    tok = Sampler(SamplingParams(seed=seed, top_k=top_k, min_p=min_p, top_p=top_p, temperature=temperature)).sample(row, [])
    if top_k:
        assert row[tok] >= np.sort(row)[-top_k]
    assert np.exp(np.float64(row[tok]) - row.max()) >= min_p * (1 - 1e-5)


# --- StopChecker ------------------------------------------------------------------

def run(stops, pieces):
    sc = StopChecker(stops)
    out, stopped = [], False
    for piece in pieces:
        text, stopped = sc.feed(piece)
        out.append(text)
        if stopped:
            break
    return "".join(out) + sc.flush(), stopped, out


def test_stop_split_across_pieces_is_never_emitted():
    text, stopped, out = run(["</s>"], ["Hello <", "/", "s>world"])
    assert (text, stopped) == ("Hello ", True)
    assert out == ["Hello ", "", ""]  # "<" and "</" were held back, not emitted then retracted


def test_stop_at_the_start():
    assert run(["</s>"], ["</s>after"])[:2] == ("", True)


def test_absent_stop_emits_everything_and_flushes_the_held_tail():
    sc = StopChecker(["</s>"])
    assert sc.feed("a<") == ("a", False)
    assert sc.feed("b") == ("<b", False)
    assert sc.feed("</") == ("", False)
    assert sc.flush() == "</"
    assert StopChecker([]).feed("anything") == ("anything", False)


def test_overlapping_prefixes():
    assert run(["abc", "abd"], ["xab", "d", "more"])[:2] == ("x", True)
    assert run(["abc", "abd"], ["xab", "x"])[:2] == ("xabx", False)
    # "c" completes first, but "abcd" begins earlier and may still complete: wait for it.
    assert run(["abcd", "c"], ["ab", "c", "d"])[:2] == ("", True)
    assert run(["abcd", "c"], ["ab", "c", "x"])[:2] == ("ab", True)
    sc = StopChecker(["abcd", "c"])
    assert sc.feed("abc") == ("", False)
    assert (sc.flush(), sc.stopped) == ("ab", True)


def test_after_a_stop_nothing_more_is_emitted():
    sc = StopChecker(["x"])
    assert sc.feed("ax") == ("a", True)
    assert sc.feed("more") == ("", True)
    assert sc.flush() == ""


def test_empty_stop_string_rejected():
    with pytest.raises(InvalidRequest, match="stop"):
        StopChecker(["ok", ""])


ALPHABET = "ab</>"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=5), max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=12),
)
def test_streamed_output_equals_text_truncated_at_first_stop(text, stops, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(found)] if found else text
    got, _, _ = run(stops, pieces)
    assert got == expected
