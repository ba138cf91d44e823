"""sample_ref (the spec of the GPU sampler, minferd/kernels/sample.py) against the CPU Sampler.

Greedy ids must be identical. When sampling, Sampler's kept candidates and probabilities are
read from Sampler itself (its _inverse_cdf is replaced by one that records the probabilities
and returns a chosen index, so each index's token comes out of _draw); they must equal
sample_ref's set, with probabilities equal to float32 rounding, and Sampler's own inverse CDF
over them, in sample_ref's order (descending logit, ascending id), must draw the same token
for the same u. Runs without a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import minferd.model.sampler as sampler_mod
from minferd.kernels.sample import MAX_TOP_K, candidates_ref, draw_ref, penalize_ref, sample_ref
from minferd.model.sampler import Sampler, SamplingParams

F32_MAX = np.finfo(np.float32).max
INVERSE_CDF = sampler_mod._inverse_cdf


def params_for(T, k, tp, mp, pen):
    return SamplingParams(temperature=float(T), top_k=int(k), top_p=float(tp), min_p=float(mp),
                          repeat_penalty=float(pen), repeat_last_n=-1, seed=0)


def one(row, T=0.0, k=40, tp=1.0, mp=0.0, pen=1.0, hist=(), u=0.5):
    """sample_ref on a single row; hist padded with -1."""
    h = np.full((1, max(len(hist), 1) + 2), -1, np.int32)
    h[0, :len(hist)] = hist
    return int(sample_ref(row[None].astype(np.float32), np.float32([T]), np.int32([k]), np.float32([tp]),
                          np.float32([mp]), np.float32([pen]), h, np.float32([u]))[0])


def sampler_kept(monkeypatch, params, pen_row):
    """(ids, probs) Sampler._draw keeps for a penalised row, in Sampler's own order."""
    seen = {}

    def fake(probs, u, block=1024):
        seen["probs"] = np.array(probs, copy=True)
        return seen["j"]
    monkeypatch.setattr(sampler_mod, "_inverse_cdf", fake)
    s = Sampler(params)
    seen["j"] = 0
    s._draw(pen_row)
    probs = seen["probs"]
    ids = []
    for j in range(probs.size):
        seen["j"] = j
        ids.append(s._draw(pen_row))
    monkeypatch.setattr(sampler_mod, "_inverse_cdf", INVERSE_CDF)
    return np.array(ids), probs


def history_row(rng, V, n):
    """Ids with repeats (drawn from a small pool) and -1 slots."""
    pool = rng.integers(0, V, size=max(1, n // 3))
    h = rng.choice(pool, size=n).astype(np.int32)
    h[rng.random(n) < 0.2] = -1
    return h


# --- greedy ----------------------------------------------------------------------------

def test_greedy_is_samplers_argmax_with_and_without_penalty():
    rng = np.random.default_rng(0)
    V, B = 3000, 120
    logits = rng.standard_normal((B, V)).astype(np.float32) * 3
    pens = np.float32(rng.choice([1.0, 1.3, 0.7, 2.5, 0.1], size=B))
    hist = np.stack([history_row(rng, V, 40) for _ in range(B)])
    # Put the row's best tokens into its history half the time, so the penalty changes the answer.
    for b in range(0, B, 2):
        hist[b, :5] = np.argsort(-logits[b])[:5]
    z = np.zeros(B, np.float32)
    got = sample_ref(logits, z, np.full(B, 40, np.int32), np.ones(B, np.float32), z, pens, hist, z)
    changed = 0
    for b in range(B):
        want = Sampler(params_for(0, 40, 1, 0, pens[b])).sample(logits[b], [int(i) for i in hist[b] if i >= 0])
        assert got[b] == want, b
        changed += want != int(np.argmax(logits[b]))
    assert changed > 10


def test_greedy_ties_and_signed_zero_go_to_the_lowest_id():
    assert one(np.array([0.0, 3.0, 1.0, 3.0])) == 1
    assert one(np.array([-1.0, -0.0, 0.0, -2.0], np.float32)) == 1
    assert one(np.full(10, -np.inf)) == 0  # np.argmax's answer for a row of -inf


def test_penalty_arithmetic_is_samplers_bit_for_bit():
    rng = np.random.default_rng(1)
    V = 500
    special = np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, F32_MAX, -F32_MAX, 1e-45, -1e-45, 1e38, -1e38])
    for pen in (1.3, 0.7, 1e-30, 1e30, 3e-45, 1.0000001, 1e38):
        row = (rng.standard_normal(V) * 50).astype(np.float32)
        row[:special.size] = special
        hist = np.concatenate([np.arange(special.size), rng.integers(0, V, 60), [-1, -1]]).astype(np.int32)
        p = np.float32(pen)
        want = Sampler(params_for(0, 40, 1, 0, p))._penalize(row, [int(i) for i in hist if i >= 0])
        got = penalize_ref(row, p, hist)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), pen


# --- sampling --------------------------------------------------------------------------

MIXES = [  # temperature, top_k, top_p, min_p, penalty
    (0.8, 40, 0.95, 0.05, 1.0), (1.0, 1, 1.0, 0.0, 1.0), (1.0, 256, 1.0, 0.0, 1.0),
    (0.7, 256, 0.5, 0.0, 1.3), (1.5, 40, 1.0, 0.5, 0.7), (1.0, 256, 0.95, 0.05, 1.3),
    (1e-6, 40, 0.95, 0.0, 1.0), (1e4, 256, 1.0, 0.0, 1.0), (1e4, 100, 0.9, 0.0, 0.7),
    (0.3, 5, 0.5, 0.5, 1.0), (2.0, 256, 0.999, 0.0, 1.0), (1.0, 17, 1.0, 1.0, 1.0),
]


@pytest.mark.parametrize("V", [3000, 200])  # 200 < top_k 256: the whole vocab is the candidate set
def test_kept_set_probabilities_and_draws_match_sampler(monkeypatch, V):
    rng = np.random.default_rng(V)
    checked = 0
    for rep in range(8):
        for T, k, tp, mp, pen in MIXES:
            scale = rng.choice([1.0, 3.0, 8.0])
            row = (rng.standard_normal(V) * scale).astype(np.float32)
            hist = history_row(rng, V, 30)
            hist[:3] = np.argsort(-row)[:3]
            T, tp, mp, p = np.float32(T), np.float32(tp), np.float32(mp), np.float32(pen)
            pen_row = penalize_ref(row, p, hist)
            ids, probs = candidates_ref(pen_row, T, k, tp, mp)
            s_ids, s_probs = sampler_kept(monkeypatch, params_for(T, k, tp, mp, p),
                                          Sampler(params_for(T, k, tp, mp, p))._penalize(row, [int(i) for i in hist if i >= 0]))
            assert sorted(ids.tolist()) == sorted(s_ids.tolist()), (T, k, tp, mp, pen)
            by_id = dict(zip(s_ids.tolist(), s_probs.tolist()))
            np.testing.assert_allclose(probs, np.float32([by_id[i] for i in ids.tolist()]), rtol=1e-6, atol=0)
            # Sampler's inverse CDF over its own probabilities, in sample_ref's order.
            order = np.lexsort((s_ids, -pen_row[s_ids]))
            for u in np.float32(rng.random(6)).tolist() + [0.0, float(np.float32(1 - 2 ** -24))]:
                want = int(s_ids[order][INVERSE_CDF(s_probs[order], u)])
                h = hist[None]
                got = sample_ref(row[None], np.float32([T]), np.int32([k]), np.float32([tp]), np.float32([mp]),
                                 np.float32([p]), h, np.float32([u]))[0]
                assert got == want, (T, k, tp, mp, pen, u)
                checked += 1
    assert checked > 500


def test_top_k_ties_at_the_boundary_keep_the_lowest_ids():
    row = np.zeros(1000, np.float32)
    row[[900, 10, 500]] = 5.0
    tied = np.array([800, 3, 400, 999, 7, 123])
    row[tied] = 2.0
    ids, probs = candidates_ref(row, np.float32(1), 5, np.float32(1), np.float32(0))
    assert ids.tolist() == [10, 500, 900, 3, 7]
    assert probs[0] == probs[2] == 1
    # -0.0 and 0.0 tie: ordered by id
    row = np.full(8, -1.0, np.float32)
    row[[6, 2]] = [0.0, -0.0]
    assert candidates_ref(row, np.float32(1), 2, np.float32(1), np.float32(0))[0].tolist() == [2, 6]
    # every logit equal: the k lowest ids, uniform
    ids, probs = candidates_ref(np.full(5000, 1.5, np.float32), np.float32(1), 256, np.float32(1), np.float32(0))
    assert ids.tolist() == list(range(256)) and (probs == 1).all()


def test_draw_rule_is_samplers_bucket_rule():
    probs = np.float32([0.5, 0.0, 0.25, 0.25, 0.0])
    for u in (0.0, 0.2, 0.5, 0.6, 0.75, 0.9, 0.9999999, 1.0):
        assert draw_ref(probs, u) == INVERSE_CDF(probs, u)


def test_refused_rows_are_minus_one():
    rng = np.random.default_rng(3)
    row = rng.standard_normal(300).astype(np.float32)
    nan_row = row.copy()
    nan_row[17] = np.nan
    inf_row = row.copy()
    inf_row[5] = np.inf
    for T in (0.0, 1.0):
        assert one(nan_row, T=T) == -1
        with pytest.raises(ValueError):
            Sampler(params_for(T, 40, 1, 0, 1)).sample(nan_row, [])
    assert one(inf_row, T=1.0) == -1
    with pytest.raises(ValueError):
        Sampler(params_for(1, 40, 1, 0, 1)).sample(inf_row, [])
    assert one(inf_row, T=0.0) == 5  # greedy takes +inf, as np.argmax
    assert one(np.full(300, -np.inf), T=1.0) == -1
    # a penalised +inf is clipped to float32's max: finite, so it samples
    assert one(inf_row, T=1.0, k=1, pen=1.3, hist=[5]) == 5
    # history ids outside the vocab, with the penalty on (off: not looked at)
    for bad in (300, -2):
        assert one(row, pen=1.3, hist=[bad]) == -1
        with pytest.raises(ValueError):
            Sampler(params_for(0, 40, 1, 0, 1.3)).sample(row, [bad])
    assert one(row, pen=1.0, hist=[300]) == int(np.argmax(row))
    # parameters out of range
    for kw in (dict(T=-1.0), dict(T=np.nan), dict(T=np.inf), dict(pen=0.0), dict(pen=-1.0), dict(pen=np.nan),
               dict(T=1.0, k=0), dict(T=1.0, k=MAX_TOP_K + 1), dict(T=1.0, tp=0.0), dict(T=1.0, tp=1.5),
               dict(T=1.0, mp=-0.1), dict(T=1.0, mp=1.1), dict(T=1.0, u=-0.1), dict(T=1.0, u=1.5),
               dict(T=1.0, u=np.nan)):
        assert one(row, **kw) == -1, kw
    # greedy rows ignore the sampling parameters
    assert one(row, T=0.0, k=0, tp=0.0, mp=5.0, u=np.nan) == int(np.argmax(row))


def test_reference_checks_its_arguments():
    z = np.zeros(2, np.float32)
    k = np.ones(2, np.int32)
    h = np.full((2, 1), -1, np.int32)
    logits = np.zeros((2, 10), np.float32)
    sample_ref(logits, z, k, z + 1, z, z + 1, h, z)
    with pytest.raises(ValueError, match="logits"):
        sample_ref(logits.astype(np.float64), z, k, z + 1, z, z + 1, h, z)
    with pytest.raises(ValueError, match="top_k"):
        sample_ref(logits, z, k.astype(np.int64), z + 1, z, z + 1, h, z)
    with pytest.raises(ValueError, match="history"):
        sample_ref(logits, z, k, z + 1, z, z + 1, h[:1], z)
