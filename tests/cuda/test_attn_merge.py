"""attn_decode's merge done by the last split CTA of each group (counters; attn_decode_tail.cuh)
against the reference, the merge kernel and quantize_x, eagerly and replayed in a CUDA graph
(test_attn_decode.py's cases)."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import attn_decode as ad  # noqa: E402
from minferd.kernels.attn_decode import splits_for  # noqa: E402
from minferd.kernels.mmvq import quantize_x, scratch_bytes  # noqa: E402
from tests.cuda.conftest import poisoned  # noqa: E402
from tests.cuda.test_attn_decode import Case, _Bump, _xq_regions, check, kind, lens_for, only_where  # noqa: E402, F401


@pytest.mark.parametrize("B,hq,hkv,d,sunk", [(1, 28, 4, 128, False), (5, 16, 1, 128, False), (8, 8, 2, 64, True),
                                             (3, 8, 2, 256, False), (17, 14, 2, 64, True)])
def test_the_last_split_merges_as_the_merge_kernel(B, hq, hkv, d, sunk, kind):
    """With counters the last split CTA of each (sequence, head chunk) merges (attn_decode_tail.cuh):
    the reference's output (sinks included), the merge kernel's to float rounding, the same int8
    form as quantize_x makes of it, padding rows zeros, every counter back at 0 after each call:
    what lets backend/pending.py's merge_in_split be switched on."""
    only_where(kind, d)
    rng = np.random.default_rng(B * 31 + d + hq)
    c = Case(rng, lens_for(B, 16, rng), hq, hkv, d)
    sinks = (rng.standard_normal(hq) * 2).astype(np.float32) if sunk else None
    splits = max(2, splits_for(B, hkv, int(c.lens.max()), d=d))
    counters = cp.zeros(ad.counter_words(B, hq, hkv), cp.uint32)
    K = hq * d
    for window in (0, 37):
        xq = cp.zeros(scratch_bytes(B, K), cp.uint8) if B <= 8 else None
        want = c.run(window=window, splits=splits, sinks=sinks)
        got = c.run(window=window, splits=splits, sinks=sinks, xq=xq, counters=counters)
        assert int(counters.sum()) == 0
        check(got, c.ref(window, sinks=sinks), c.lens, f"merged in the split, w={window}")
        np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(want), rtol=1e-5, atol=1e-6)
        if xq is not None:
            theirs = cp.zeros(scratch_bytes(B, K), cp.uint8)
            quantize_x(got, theirs)
            for a, b in zip(_xq_regions(xq, B, K), _xq_regions(theirs, B, K)):
                assert np.array_equal(a, b), "the merging split's int8 copy differs from quantize_x"


def test_merging_in_the_split_survives_graph_replays(kind):
    """Three layers' attention merging in the split, captured once and replayed with new lengths:
    each replay equals the reference (the counters the last CTAs reset serve the next launch)."""
    rng = np.random.default_rng(12)
    B, hq, hkv, d, bs = 3, 16, 2, 128, 16
    # Built at lengths each replay's stay within: table entries past a built length are garbage.
    cases = [Case(rng, [700, 200, 40], hq, hkv, d, bs=bs, spare_cols=10) for _ in range(3)]
    splits = max(2, splits_for(B, hkv, cases[0].max_blocks * bs))
    counters = cp.zeros(ad.counter_words(B, hq, hkv), cp.uint32)
    outs = [poisoned((B, hq * d), cp.float32) for _ in cases]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for c, out in zip(cases, outs):  # compile and load outside the capture
            c.run(splits=splits, out=out, counters=counters)
        stream.synchronize()
        with cp.cuda.using_allocator(_Bump(64 << 20)):
            stream.begin_capture()
            for c, out in zip(cases, outs):
                c.run(splits=splits, out=out, counters=counters)
            graph = stream.end_capture()
        for lens in ([16, 33, 0], [1, 160, 17]):
            lens = np.asarray(lens, np.int32)
            for c, out in zip(cases, outs):
                c.dev["lens"].set(lens)
                out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            for i, (c, out) in enumerate(zip(cases, outs)):
                check(out, c.ref(lens=lens), lens, f"layer {i}, lens {lens.tolist()}")
    assert int(counters.sum()) == 0
