"""backend/moe.py's expert-by-expert MLP (what the CUDA backend runs) against the CPU backend's
own MoE, on the CPU: the same routing and products through the backend's matmul and row ops, so
whole-model logits agree, qwen3moe and gpt-oss (router and expert biases, swiglu_oai) alike."""
from __future__ import annotations

import numpy as np
import pytest

from minferd.backend import moe
from minferd.backend.base import Backend
from minferd.backend.cpu import CpuBackend
from minferd.model.generate import prefill
from minferd.model.loader import load_local


@pytest.mark.parametrize("arch,quant", [("qwen3moe", "q4_k"), ("qwen3moe", "q8_0"), ("qwen2moe", "q8_0"),
                                       ("gpt-oss", "q8_0")])
def test_by_expert_equals_the_cpu_backends_moe(synth_model, arch, quant, monkeypatch):
    lm = load_local(synth_model(arch, quant), threads=1)
    ids = np.random.default_rng(3).integers(0, lm.spec.n_vocab, 40)
    calls = []
    real = moe.by_expert

    def counted(*a, **kw):
        calls.append(a[1].shape[0])
        return real(*a, **kw)

    want = prefill(lm.model, ids, lm.model.new_cache(lm.model.be.untracked(), 64), all_logits=True)
    monkeypatch.setattr(moe, "by_expert", counted)
    monkeypatch.setattr(CpuBackend, "moe", Backend.moe)
    got = prefill(lm.model, ids, lm.model.new_cache(lm.model.be.untracked(), 64), all_logits=True)
    assert calls and all(n == len(ids) for n in calls)  # the generic path ran, once a layer
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).all()


def test_route_and_groups():
    logits = np.array([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 4.0], [1.0, 1.5, 9.0, 0.0]], np.float32)
    top, p = moe.route(logits, 2)
    assert [sorted(t) for t in top.tolist()] == [[1, 3], [0, 3], [1, 2]]
    assert np.allclose(p.sum(1), 1)
    chosen = np.take_along_axis(logits, top, 1)
    assert np.allclose(p, np.exp(chosen) / np.exp(chosen).sum(1, keepdims=True))
    order, bounds = moe.groups(top, 4)
    picks = top.ravel()
    for e in range(4):
        mine = order[bounds[e]:bounds[e + 1]]
        assert (picks[mine] == e).all() and len(set(mine // 2)) == len(mine)
    assert bounds[-1] == top.size


def test_expert_view_is_its_rows(synth_model):
    lm = load_local(synth_model("qwen3moe", "q8_0"), threads=1)
    w = lm.model.w["blk.0.ffn_gate_exps.weight"]
    e = moe.expert(w, 3)
    r = w.shape[1]
    assert e.shape == (w.shape[0], r) and e.n_rows == r and e.row_elems == w.row_elems
    assert np.shares_memory(e.data, w.data) and np.array_equal(e.data, w.data[3 * r:4 * r])


@pytest.mark.parametrize("n,E,k,bm", [(1, 8, 2, 64), (37, 8, 2, 16), (300, 128, 8, 64), (5, 4, 4, 64)])
def test_align_lays_out_every_pick_once_in_its_experts_tiles(n, E, k, bm):
    """moe.align: a grouped GEMM's layout. Every pick has one row, in a tile of its expert, holding
    its token; tiles are whole and one expert each; padding rows hold a token of their tile."""
    from minferd.backend.moe import align
    rng = np.random.default_rng(n + E)
    top = np.stack([rng.choice(E, k, replace=False) for _ in range(n)])
    rows, tile_expert, pick_row = align(top, E, bm)
    assert rows.size == tile_expert.size * bm and rows.dtype == tile_expert.dtype == pick_row.dtype == np.int32
    assert sorted(pick_row.tolist()) == sorted(set(pick_row.tolist()))  # distinct rows
    for p, r in enumerate(pick_row):
        t, e = p // k, top.ravel()[p]
        assert rows[r] == t and tile_expert[r // bm] == e
    used = np.bincount(top.ravel(), minlength=E)
    assert np.array_equal(np.bincount(tile_expert, minlength=E), -(-used // bm))
    assert set(rows.tolist()) <= set(range(n))


@pytest.mark.parametrize("n,E,k,bm", [(1, 8, 2, 64), (65, 128, 8, 64), (2048, 128, 8, 64), (9, 32, 4, 16)])
def test_align_padded_to_the_bound_keeps_the_layout_and_skips_the_rest(n, E, k, bm):
    """The device's layout (kernels/moe.py align) is sized before the routing is known: to
    layout_rows, which no routing exceeds (here the worst, every pick a different expert's where
    it can be); past the layout, token 0 in tiles of expert -1."""
    from minferd.backend.moe import align
    from minferd.kernels.moe import layout_rows
    rng = np.random.default_rng(n * E)
    spread = (np.arange(n * k) % E).reshape(n, k)  # as many experts as picks allow, each with few picks
    for top in (spread, np.stack([rng.choice(E, k, replace=False) for _ in range(n)])):
        if len(set(top[0])) < k:
            continue
        R = layout_rows(n * k, E, bm)
        rows, tiles, picks = align(top, E, bm)
        assert rows.size <= R and R % bm == 0
        prow, ptiles, ppicks = align(top, E, bm, R)
        assert np.array_equal(prow[:rows.size], rows) and np.array_equal(ppicks, picks)
        assert np.array_equal(ptiles[:tiles.size], tiles) and (ptiles[tiles.size:] == -1).all()
        assert (prow[rows.size:] == 0).all() and prow.size == ptiles.size * bm == R
    for short in (0, R + 1):  # fewer rows than the layout's; not whole tiles
        with pytest.raises(ValueError, match="cannot hold"):
            align(spread, E, bm, short)
