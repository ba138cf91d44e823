"""attn_decode.cu against attn_decode_ref (float64 NumPy): paged decode attention over shuffled
block tables, mixed context lengths (1, block_size - 1, block_size, block_size + 1, ~1000, a
padding row of 0), head dims 64 / 128 / 256 (and the odd multiples of 32), GQA groups 1, 4, 7
(and the head-chunked 12, 16), window 0 and a window shorter than the context; the int8 output
against the mat-vec quantizer; a CUDA-graph capture replayed with new lengths and tables; the
launcher's argument checks. Outputs are poisoned with NaN first, so a row never written fails;
every row is checked on its own (a wrong short row would hide in the norm of the long ones)."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.kernels import attn_decode as ad  # noqa: E402
from minferd.kernels.attn_decode import MAX_SPLITS, attn_decode, attn_decode_ref, splits_for  # noqa: E402
from minferd.kernels.mmvq import quantize_x, scratch_bytes, xq_layout  # noqa: E402
from tests.cuda.conftest import poisoned  # noqa: E402

TOL = 1e-4  # per-row relative error; f32 math on f16 data lands near 1e-6


@pytest.fixture(params=["tc", "simt"])
def kind(request, monkeypatch):
    """Both partials kernels: tensor cores (d <= 128) and SIMT f32 (every d)."""
    monkeypatch.setattr(ad, "KERNEL_BY_D", {d: request.param for d in ad.HEAD_DIMS})
    return request.param


def only_where(kind: str, d: int):
    if kind == "tc" and d not in ad.TC_HEAD_DIMS:
        pytest.skip(f"no tensor-core kernel for d = {d}")


def lens_for(B: int, bs: int, rng) -> list[int]:
    base = [1000, 1, bs - 1, 0, bs, bs + 1, 999, 2 * bs + 3]
    if B <= len(base):
        return base[:B]
    return base + [int(x) for x in rng.integers(1, 1200, B - len(base))]


class Case:
    """Random q, K, V and a paged cache: each sequence's blocks are a random, non-contiguous
    pick of the physical blocks; table entries past a sequence's length (and the whole row of a
    padding sequence) hold random int32 garbage that must never be followed."""

    def __init__(self, rng, lens, hq, hkv, d, bs=16, q_scale=2.0, spare_cols=1, kv_scale=1.0):
        self.lens = np.asarray(lens, np.int32)
        self.B, self.hq, self.hkv, self.d, self.bs = len(lens), hq, hkv, d, bs
        need = [-(-int(n) // bs) for n in self.lens]
        self.max_blocks = max(max(need), 1) + spare_cols
        n_blocks = sum(need) + 5
        perm = rng.permutation(n_blocks).astype(np.int32)
        bt = rng.integers(-2 ** 31, 2 ** 31 - 1, (self.B, self.max_blocks), dtype=np.int64).astype(np.int32)
        at = 0
        for b, k in enumerate(need):
            bt[b, :k] = perm[at:at + k]
            at += k
        self.bt = bt
        self.K = (rng.standard_normal((n_blocks * bs, hkv, d)) * kv_scale).astype(np.float16)
        self.V = (rng.standard_normal((n_blocks * bs, hkv, d)) * kv_scale).astype(np.float16)
        self.q = (rng.standard_normal((self.B, hq, d)) * q_scale).astype(np.float32)
        self.dev = {k: cp.asarray(getattr(self, k)) for k in ("q", "K", "V", "bt", "lens")}

    def run(self, *, window=0, splits=None, xq=None, out=None, sinks=None):
        if splits is None:
            splits = splits_for(self.B, self.hkv, int(self.lens.max()), d=self.d)
        out = poisoned((self.B, self.hq * self.d), cp.float32) if out is None else out
        dv = self.dev
        attn_decode(dv["q"], dv["K"], dv["V"], dv["bt"], dv["lens"], out, block_size=self.bs, window=window,
                    scale=self.d ** -0.5, splits=splits, xq=xq,
                    sinks=None if sinks is None else cp.asarray(sinks))
        return out

    def ref(self, window=0, lens=None, bt=None, q=None, sinks=None):
        return attn_decode_ref(self.q if q is None else q, self.K, self.V, self.bt if bt is None else bt,
                               self.lens if lens is None else lens, block_size=self.bs, window=window,
                               scale=self.d ** -0.5, sinks=sinks)


def check(out, ref: np.ndarray, lens, what=""):
    got = cp.asnumpy(out).astype(np.float64)
    for b, n in enumerate(np.asarray(lens)):
        if n == 0:
            assert (got[b] == 0).all(), f"{what} padding row {b} not zeros"
            continue
        assert np.isfinite(got[b]).all(), f"{what} row {b} (ctx {n}): non-finite (not written?)"
        err = np.linalg.norm(got[b] - ref[b]) / np.linalg.norm(ref[b])
        assert err < TOL, f"{what} row {b} (ctx {n}): rel err {err:.2e}"


@pytest.mark.parametrize("window", [0, 200], ids=["nowin", "win200"])
@pytest.mark.parametrize("group", [1, 4, 7], ids=lambda g: f"g{g}")
@pytest.mark.parametrize("d", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("B", [1, 3, 8, 17, 64], ids=lambda b: f"B{b}")
def test_matches_reference(B, d, group, window, kind):
    only_where(kind, d)
    rng = np.random.default_rng(B * 1000 + d * 10 + group + window)
    hkv = 2
    c = Case(rng, lens_for(B, 16, rng), group * hkv, hkv, d)
    check(c.run(window=window), c.ref(window), c.lens, f"B={B} d={d} g={group} w={window}")


@pytest.mark.parametrize("d", [32, 96, 160], ids=lambda d: f"d{d}")
def test_other_head_dims(d, kind):
    """Head dims whose 16-byte chunks do not divide the CTA (idle P V threads), and d = 32,
    whose final key-phase buffer is larger than the tile stages."""
    only_where(kind, d)
    rng = np.random.default_rng(d)
    c = Case(rng, lens_for(8, 16, rng), 6, 2, d)
    for window in (0, 37):
        check(c.run(window=window), c.ref(window), c.lens, f"d={d} w={window}")


@pytest.mark.parametrize("hq,hkv", [(16, 1), (24, 2), (20, 4)], ids=["g16", "g12", "g5"])
def test_head_chunks(hq, hkv, kind):
    """Groups past 8 query heads take several CTAs per kv head (8 + 8, 8 + 4); a group of 5 runs
    the 8-head kernel with 3 idle heads."""
    rng = np.random.default_rng(hq + hkv)
    c = Case(rng, lens_for(8, 16, rng), hq, hkv, 128)
    check(c.run(), c.ref(), c.lens, f"hq={hq} hkv={hkv}")


@pytest.mark.parametrize("splits", [1, 5, 33, MAX_SPLITS])
def test_split_counts(splits, kind):
    """One split (no merge work), odd counts, and 128 splits where most shares are empty."""
    rng = np.random.default_rng(splits)
    c = Case(rng, [1000, 1, 0, 17, 300, 64], 28, 4, 128)
    for window in (0, 100):
        check(c.run(window=window, splits=splits), c.ref(window), c.lens, f"splits={splits} w={window}")


@pytest.mark.parametrize("bs", [32, 64, 256])
def test_block_sizes(bs, kind):
    rng = np.random.default_rng(bs)
    c = Case(rng, lens_for(8, bs, rng), 8, 2, 128, bs=bs)
    for window in (0, bs + 3):
        check(c.run(window=window), c.ref(window), c.lens, f"bs={bs} w={window}")


def test_qwen7b_shape_long_context(kind):
    """Qwen2.5-7B's attention (hq 28, hkv 4, d 128) at a few thousand keys, the split count of
    a 16k context, windows inside one split and across several."""
    rng = np.random.default_rng(7)
    c = Case(rng, [5000, 4097, 0, 333], 28, 4, 128)
    splits = splits_for(4, 4, 16384)
    for window in (0, 50, 3000, 6000):
        check(c.run(window=window, splits=splits), c.ref(window), c.lens, f"w={window}")


def test_big_batch_one_split(kind):
    """Qwen2.5-7B's shape at 64 sequences: splits_for gives one split, where the partials kernel
    finishes the output and no merge runs."""
    rng = np.random.default_rng(64)
    lens = [int(x) for x in rng.integers(1, 900, 64)]
    lens[5] = lens[40] = 0
    c = Case(rng, lens, 28, 4, 128)
    assert splits_for(64, 4, 900, d=128) == 1
    check(c.run(splits=1), c.ref(), c.lens, "B=64 one split")


def test_peaked_scores(kind):
    """Scores spread over +-100: a tile's max moves a lot, so the online-softmax corrections
    and the merge's weights must carry it without overflow."""
    rng = np.random.default_rng(11)
    c = Case(rng, [1000, 130, 77], 14, 2, 64, q_scale=40.0)
    check(c.run(splits=7), c.ref(), c.lens, "peaked")


@pytest.mark.parametrize("q_scale,kv_scale", [(1e-4, 1.0), (2.0, 300.0), (1e3, 1e-3)], ids=["tiny-q", "big-kv", "big-q"])
def test_extreme_magnitudes(q_scale, kv_scale, kind):
    """The tensor-core kernel's f16 operands: q is scaled per head by a power of two and split
    hi + lo, so tiny or large queries and large cache values keep f32-like accuracy."""
    rng = np.random.default_rng(int(q_scale * 10) + int(kv_scale))
    c = Case(rng, [700, 33, 1], 28, 4, 128, q_scale=q_scale, kv_scale=kv_scale)
    check(c.run(), c.ref(), c.lens, f"q x{q_scale} kv x{kv_scale}")


def _xq_regions(scratch, B: int, K: int):
    off, kbp, _ = xq_layout(B, K)
    h = cp.asnumpy(scratch)
    planes = h[:2 * B * K]
    ds = h[off:off + B * kbp * 8].view(np.uint32).reshape(B, kbp, 2)[:, :K // 32]
    return planes, ds


@pytest.mark.parametrize("splits", [None, 1], ids=["merged", "one-split"])
@pytest.mark.parametrize("B,hq,hkv,d", [(1, 28, 4, 128), (3, 14, 2, 64), (8, 8, 1, 256)])
@pytest.mark.parametrize("form", ["scratch", "args"])
def test_xq_matches_quantize_x(B, hq, hkv, d, form, splits, kind):
    """The merge's int8 copy of out is bit-for-bit what quantize_x makes of the same out."""
    only_where(kind, d)
    rng = np.random.default_rng(B * 7 + d)
    lens = [1000, 0, 17, 16, 15, 1, 200, 64][:B]
    c = Case(rng, lens, hq, hkv, d)
    K = hq * d
    mine = cp.zeros(scratch_bytes(B, K), cp.uint8)
    off, kbp, _ = xq_layout(B, K)
    xq = mine if form == "scratch" else (np.uint64(mine.data.ptr), np.uint64(mine.data.ptr + off), np.int32(kbp))
    out = c.run(xq=xq, splits=splits)  # one split: the partials kernel writes out and xq itself
    check(out, c.ref(), c.lens, "xq")
    theirs = cp.zeros(scratch_bytes(B, K), cp.uint8)
    quantize_x(out, theirs)
    for a, b, what in zip(_xq_regions(mine, B, K), _xq_regions(theirs, B, K), ("hi/lo planes", "(d, sum)")):
        assert np.array_equal(a, b), f"xq {what} differ from quantize_x"


class _Bump:
    """An allocator that never reuses memory: what the graph recorded stays its own."""

    def __init__(self, nbytes: int):
        self.base, self.off, self.n = cp.cuda.alloc(nbytes), 0, nbytes

    def __call__(self, size: int):
        size = (size + 255) // 256 * 256
        if self.off + size > self.n:
            raise MemoryError("bump allocator exhausted")
        p = self.base + self.off
        self.off += size
        return p


@pytest.mark.parametrize("one_split", [False, True], ids=["merged", "one-split"])
def test_graph_replay_with_new_lengths_and_tables(one_split, kind):
    """Capture one call, then change ctx_lens, the block tables and q in place and replay: the
    kernels read them from the device at run time and the grid never depended on them."""
    rng = np.random.default_rng(5)
    B, hq, hkv, d, bs = 4, 28, 4, 128, 16
    c = Case(rng, [700, 1, 0, 300], hq, hkv, d, bs=bs, spare_cols=10)
    splits = 1 if one_split else splits_for(B, hkv, c.max_blocks * bs)
    out = poisoned((B, hq * d), cp.float32)
    n_phys = c.K.shape[0] // bs
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        c.run(splits=splits, window=0, out=out)  # compile and load outside the capture
        stream.synchronize()
        with cp.cuda.using_allocator(_Bump(64 << 20)):
            stream.begin_capture()
            c.run(splits=splits, window=0, out=out)
            graph = stream.end_capture()
        for lens in ([16, 800, 33, 0], [0, 0, 1, 17], [c.max_blocks * bs, 15, 500, 64]):
            lens = np.asarray(lens, np.int32)
            bt = rng.integers(0, n_phys, (B, c.max_blocks)).astype(np.int32)  # blocks may repeat: fine to read
            for b, n in enumerate(lens):
                if n == 0:
                    bt[b] = -12345  # a padding row's table is never read
            q = (rng.standard_normal((B, hq, d)) * 2).astype(np.float32)
            c.dev["lens"].set(lens)
            c.dev["bt"].set(bt)
            c.dev["q"].set(q)
            out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            check(out, c.ref(0, lens=lens, bt=bt, q=q), lens, f"replay lens={lens.tolist()}")


def test_splits_for():
    assert splits_for(1, 4, 16384) * 4 >= 132  # B = 1 at 16k fills the GPU
    assert splits_for(1, 1, 16384, d=256) >= 64
    for B in (1, 2, 8, 64, 256):
        for ctx in (0, 1, 640, 16384, 131072):
            assert 1 <= splits_for(B, 4, ctx) <= MAX_SPLITS
    with pytest.raises(ValueError):
        splits_for(0, 4, 100)


def test_rejects_bad_arguments():
    rng = np.random.default_rng(3)
    c = Case(rng, [40, 3], 8, 2, 64)
    dv = dict(c.dev)
    good = dict(q=dv["q"], k_cache=dv["K"], v_cache=dv["V"], block_tables=dv["bt"], ctx_lens=dv["lens"],
                out=cp.empty((2, 8 * 64), cp.float32))
    kw = dict(block_size=16, window=0, scale=0.125, splits=4)

    def bad(match, xq=None, **over):
        a = {**good, **{k: v for k, v in over.items() if k in good}}
        k = {**kw, **{x: v for x, v in over.items() if x in kw}}
        with pytest.raises(ValueError, match=match):
            attn_decode(a["q"], a["k_cache"], a["v_cache"], a["block_tables"], a["ctx_lens"], a["out"], xq=xq, **k)

    attn_decode(*good.values(), **kw)  # the good call works
    bad("q must be float32", q=dv["q"].astype(cp.float16))
    bad("q must be C-contiguous", q=cp.empty((2, 8, 128), cp.float32)[:, :, ::2])
    bad("q must be a cupy array", q=c.q)
    bad("batch of 0", q=cp.empty((0, 8, 64), cp.float32))
    bad("batch of 257", q=cp.empty((257, 8, 64), cp.float32))
    bad("head dim 48", q=cp.empty((2, 8, 48), cp.float32))
    bad("head dim 288", q=cp.empty((2, 8, 288), cp.float32))
    bad("k_cache must be float16", k_cache=dv["K"].astype(cp.float32))
    bad("differ", v_cache=dv["V"][:-16])
    bad("query heads over", k_cache=cp.empty((16, 3, 64), cp.float16), v_cache=cp.empty((16, 3, 64), cp.float16))
    bad("cache head dim", k_cache=cp.empty((16, 2, 128), cp.float16), v_cache=cp.empty((16, 2, 128), cp.float16))
    bad("block_tables must be int32", block_tables=dv["bt"].astype(cp.int64))
    bad("block_tables", block_tables=dv["bt"][:1].copy())
    bad("ctx_lens must be int32", ctx_lens=dv["lens"].astype(cp.int64))
    bad("ctx_lens", ctx_lens=cp.zeros(3, cp.int32))
    bad("out", out=cp.empty((2, 8 * 64 + 1), cp.float32))
    bad("out must be float32", out=cp.empty((2, 8 * 64), cp.float16))
    bad("block_size 24", block_size=24)
    bad("block_size 8", block_size=8)
    bad("window -1", window=-1)
    bad("scale", scale=float("nan"))
    bad("splits 0", splits=0)
    bad("splits 129", splits=129)
    bad("xq scratch of 16 bytes", xq=cp.empty(16, cp.uint8))
    bad("xq must be", xq=cp.empty(scratch_bytes(2, 512), cp.float32))
    bad("xq arguments", xq=(np.uint64(0), np.uint64(0), np.int32(16)))
    bad("xq as arguments", xq=(1, 2))
    nine = Case(rng, [5] * 9, 8, 2, 64)
    with pytest.raises(ValueError, match="batches up to 8"):
        attn_decode(nine.dev["q"], nine.dev["K"], nine.dev["V"], nine.dev["bt"], nine.dev["lens"],
                    cp.empty((9, 512), cp.float32), xq=cp.empty(scratch_bytes(9, 512), cp.uint8), **kw)
