"""sample.cu against sample_ref (minferd/kernels/sample.py), id for id.

Batches mix every kind of row (greedy, top_k 1/40/256, top_p 0.5/0.95/1, min_p 0/0.05/0.5,
penalties 1/1.3/0.7 over histories with repeats and empty slots, tiny and huge temperatures)
at the vocab sizes that matter (1000, Qwen's 152064, Gemma's 262144). Then the rows that take
the kernel's other paths: ties at the top-k boundary (few, and more than fit in shared
memory), large values hidden in few threads (survivors overflow, T0 refined), -0.0 against
0.0, rows Sampler refuses (-1), unaligned and odd-length rows (the scalar loads); a CUDA
graph replayed over new contents; argmax(); the launchers' argument checks.
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import minferd.kernels.sample as sample_mod  # noqa: E402
from minferd.kernels.sample import MAX_TOP_K, argmax, sample, sample_ref  # noqa: E402

# TARGET_CTAS decides how many segments a row is cut into: 1 gives one segment per row (the
# whole row in one CTA), 10**6 the most segments (16) whatever the batch.
SPLITS = [sample_mod.TARGET_CTAS, 1, 10 ** 6]

FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")
MIXES = [  # temperature, top_k, top_p, min_p, penalty
    (0.0, 40, 1.0, 0.0, 1.0), (0.0, 40, 1.0, 0.0, 1.3), (0.0, 40, 1.0, 0.0, 0.7),
    (0.8, 40, 0.95, 0.05, 1.0), (0.8, 40, 0.95, 0.05, 1.3), (1.0, 1, 1.0, 0.0, 1.0),
    (1.0, 1, 0.5, 0.5, 0.7), (1.0, 256, 1.0, 0.0, 1.0), (0.7, 256, 0.95, 0.0, 1.3),
    (1.2, 256, 0.5, 0.05, 0.7), (1.0, 40, 1.0, 0.5, 1.0), (1.5, 256, 1.0, 0.05, 1.3),
    (1e-6, 40, 0.95, 0.05, 1.0), (1e-30, 256, 1.0, 0.0, 0.7), (50.0, 256, 1.0, 0.0, 1.0),
    (1e4, 256, 0.95, 0.0, 1.3), (3.0, 17, 0.95, 0.5, 1.0), (0.5, 100, 0.999, 0.0, 0.7),
]


def make_batch(rng, B, V, H=64, mixes=None):
    mixes = MIXES if mixes is None else mixes
    pick = [mixes[i] for i in rng.integers(0, len(mixes), B)]
    scale = rng.choice([0.5, 2.0, 4.0, 8.0], size=(B, 1)).astype(np.float32)
    logits = rng.standard_normal((B, V), dtype=np.float32) * scale
    for b in range(0, B, 3):  # a peaked row: a few clear favourites
        logits[b, rng.integers(0, V, 5)] += np.float32(4 * scale[b, 0])
    hist = np.full((B, H), -1, np.int32)
    for b in range(B):
        n = int(rng.integers(0, H + 1))
        pool = np.concatenate([np.argsort(logits[b])[-8:], rng.integers(0, V, 8)])  # the favourites too
        hist[b, :n] = rng.choice(pool, n)
        hist[b, rng.random(H) < 0.1] = -1
    batch = {f: np.array([m[i] for m in pick], np.int32 if f == "top_k" else np.float32) for i, f in enumerate(FIELDS)}
    batch.update(logits=logits, history=hist, u=rng.random(B, dtype=np.float32))
    return batch


def run(batch, logits_dev=None):
    d = {k: cp.asarray(v) for k, v in batch.items()}
    out = cp.full(batch["u"].shape, -7, cp.int32)
    sample(d["logits"] if logits_dev is None else logits_dev, d["temperature"], d["top_k"], d["top_p"],
           d["min_p"], d["repeat_penalty"], d["history"], d["u"], out)
    return cp.asnumpy(out)


def expect(batch):
    return sample_ref(batch["logits"], batch["temperature"], batch["top_k"], batch["top_p"], batch["min_p"],
                      batch["repeat_penalty"], batch["history"], batch["u"])


def assert_same(batch, logits_dev=None):
    got, want = run(batch, logits_dev), expect(batch)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, "rows " + "; ".join(
        f"{b}: got {got[b]} want {want[b]} ({', '.join(f'{f}={batch[f][b]}' for f in FIELDS)}, u={batch['u'][b]})"
        for b in bad[:8])
    return got


@pytest.mark.parametrize("V", [1000, 152064, 262144])
@pytest.mark.parametrize("B", [1, 7, 64])
def test_matches_reference(B, V):
    rng = np.random.default_rng(B * 1_000_003 + V)
    reps = {1: 18, 7: 5, 64: 2}[B]
    sampled = 0
    for _ in range(reps):
        batch = make_batch(rng, B, V)
        got = assert_same(batch)
        assert (got >= 0).all()
        sampled += int((batch["temperature"] > 0).sum())
    assert sampled > 0


@pytest.mark.parametrize("ctas", SPLITS)
def test_every_mix_at_every_vocab_size(ctas, monkeypatch):
    monkeypatch.setattr(sample_mod, "TARGET_CTAS", ctas)
    rng = np.random.default_rng(11)
    for V in (1000, 152064, 262144):
        batch = make_batch(rng, len(MIXES), V)
        for i, f in enumerate(FIELDS):  # each mix once, in order
            batch[f] = np.array([m[i] for m in MIXES], batch[f].dtype)
        for u in (0.0, 0.37, float(np.float32(1 - 2 ** -24))):
            batch["u"] = np.full(len(MIXES), u, np.float32)
            assert_same(batch)


def rows_batch(rows, mixes, u=None, H=4, hist=None):
    """A batch of the given rows, row i with mixes[i % len(mixes)]."""
    B = len(rows)
    logits = np.stack(rows).astype(np.float32)
    batch = {f: np.array([mixes[b % len(mixes)][i] for b in range(B)], np.int32 if f == "top_k" else np.float32)
             for i, f in enumerate(FIELDS)}
    batch.update(logits=logits, history=np.full((B, H), -1, np.int32) if hist is None else hist,
                 u=np.float32(np.linspace(0.03, 0.97, B)) if u is None else np.full(B, u, np.float32))
    return batch


TIE_MIXES = [(0.0, 40, 1.0, 0.0, 1.0), (1.0, 256, 1.0, 0.0, 1.0), (1.0, 40, 1.0, 0.0, 1.0),
             (1.0, 1, 1.0, 0.0, 1.0), (0.9, 200, 0.9, 0.0, 1.0), (2.0, 7, 1.0, 0.05, 1.0)]


@pytest.mark.parametrize("ctas", SPLITS)
def test_ties(ctas, monkeypatch):
    monkeypatch.setattr(sample_mod, "TARGET_CTAS", ctas)
    V = 152064
    rng = np.random.default_rng(5)
    rows = []
    rows += [np.full(V, 1.5, np.float32)] * 6  # all equal: more ties than fit, T0 is the maximum
    r = rng.standard_normal(V).astype(np.float32)
    r[rng.choice(V, 30, replace=False)] = 10 + rng.random(30, dtype=np.float32)
    r[rng.choice(V, 500, replace=False)] = 9.0  # ties at the boundary, few enough to fit
    rows += [r] * 6
    r = rng.standard_normal(V).astype(np.float32)
    r[rng.choice(V, 6000, replace=False)] = 7.0  # more ties than fit, a few ids above them
    r[rng.choice(V, 10, replace=False)] = 8.0
    rows += [r] * 6
    r = -np.abs(rng.standard_normal(V).astype(np.float32)) - 1
    zeros = rng.choice(V, 100, replace=False)
    r[zeros] = np.where(rng.random(100) < 0.5, np.float32(0.0), np.float32(-0.0))  # -0.0 ties 0.0
    rows += [r] * 6
    got = assert_same(rows_batch(rows, TIE_MIXES))
    assert got[0] == 0 and (got[:6] < 256).all()
    assert got[18] == zeros.min()


def test_large_values_hidden_in_few_threads(monkeypatch):
    # Ids of 30 threads' chunks (chunk c = id // 4 belongs to thread c % 1024) hold all the
    # large values: the thread maxima underestimate the k-th largest, more survive pass B than
    # fit in shared memory, and the kernel refines T0 over the whole row (one segment per
    # row: shorter segments give a thread too few ids to overflow).
    monkeypatch.setattr(sample_mod, "TARGET_CTAS", 1)
    V = 152064
    rng = np.random.default_rng(6)
    ids = np.arange(V)
    hidden = (ids // 4) % 1024 < 30
    rows = []
    for _ in range(6):
        r = rng.standard_normal(V).astype(np.float32)
        r[hidden] = 10 + 10 * rng.random(int(hidden.sum()), dtype=np.float32)
        rows.append(r)
    mixes = [(1.0, 256, 1.0, 0.0, 1.0), (0.8, 40, 0.95, 0.05, 1.0), (1.0, 1, 1.0, 0.0, 1.0)]
    assert_same(rows_batch(rows, mixes))


def test_refused_rows_are_minus_one():
    V = 5000
    rng = np.random.default_rng(7)
    base = rng.standard_normal(V).astype(np.float32)
    nan, inf, ninf = base.copy(), base.copy(), np.full(V, -np.inf, np.float32)
    nan[1234] = np.nan
    inf[77] = np.inf
    rows = [nan, nan, inf, inf, ninf, ninf, inf, base, base, base, base, base, base, base, base]
    mixes = [(0.0, 40, 1, 0, 1), (1.0, 40, 1, 0, 1), (1.0, 40, 1, 0, 1), (0.0, 40, 1, 0, 1), (1.0, 40, 1, 0, 1),
             (0.0, 40, 1, 0, 1), (1.0, 1, 1, 0, 1.3),  # penalised +inf: clipped, samples
             (-1.0, 40, 1, 0, 1), (np.nan, 40, 1, 0, 1), (1.0, 0, 1, 0, 1), (1.0, MAX_TOP_K + 1, 1, 0, 1),
             (1.0, 40, 0.0, 0, 1), (1.0, 40, 1, 1.5, 1), (1.0, 40, 1, 0, 0.0), (0.0, 40, 1, 0, 1.3)]
    hist = np.full((len(rows), 3), -1, np.int32)
    hist[6, 0] = 77
    hist[14] = [5, V, -1]  # an id outside the vocab with the penalty on
    want = np.array([-1, -1, -1, 77, -1, 0, 77] + [-1] * 8)
    batch = rows_batch(rows, mixes, hist=hist)
    assert (expect(batch) == want).all()
    assert (assert_same(batch) == want).all()
    batch = rows_batch([base] * 3, [(1.0, 40, 1, 0, 1)], u=np.nan)
    assert (assert_same(batch) == -1).all()


@pytest.mark.parametrize("V, offset", [(1000, 1), (1001, 0), (3, 0), (1, 0), (100, 0), (4099, 3)])
def test_scalar_loads_and_small_vocabs(V, offset):
    rng = np.random.default_rng(V + offset)
    batch = make_batch(rng, 24, V, H=8)
    flat = cp.zeros(24 * V + offset, cp.float32)
    dev = flat[offset:].reshape(24, V)  # offset 1: 4 bytes past an aligned start
    dev.set(batch["logits"])
    assert_same(batch, logits_dev=dev)


def test_long_and_empty_histories():
    rng = np.random.default_rng(8)
    V = 152064
    for H in (0, 3000):
        batch = make_batch(rng, 8, V, H=max(H, 1), mixes=[m for m in MIXES if m[4] != 1.0])
        if H == 0:
            batch["history"] = np.zeros((8, 0), np.int32)
        else:
            batch["history"] = rng.integers(-1, V, (8, H)).astype(np.int32)
        assert_same(batch)


def test_cuda_graph_replays_with_new_contents():
    rng = np.random.default_rng(9)
    B, V = 16, 152064
    first, second = make_batch(rng, B, V), make_batch(rng, B, V)
    d = {k: cp.asarray(v) for k, v in first.items()}
    out = cp.full(B, -7, cp.int32)
    args = lambda: (d["logits"], d["temperature"], d["top_k"], d["top_p"], d["min_p"],  # noqa: E731
                    d["repeat_penalty"], d["history"], d["u"], out)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        sample(*args())  # compiles outside the capture
        stream.synchronize()
        stream.begin_capture()
        sample(*args())
        graph = stream.end_capture()
        for batch in (first, second, first):
            for k, v in batch.items():
                d[k].set(v, stream=stream)
            out.fill(-7)
            graph.launch(stream)
            stream.synchronize()
            assert (cp.asnumpy(out) == expect(batch)).all()


def test_argmax():
    rng = np.random.default_rng(10)
    for V, offset in ((152064, 0), (262144, 0), (1001, 1)):
        x = rng.standard_normal((9, V)).astype(np.float32)
        x[1, [5, 9, 700]] = 100.0  # ties: lowest id
        x[2] = -np.inf
        x[3, 17] = np.nan
        x[4, [0, 1]] = [-0.0, 0.0]
        x[4, 2:] = -1
        flat = cp.zeros(x.size + offset, cp.float32)
        dev = flat[offset:].reshape(x.shape)
        dev.set(x)
        out = cp.full(9, -7, cp.int32)
        argmax(dev, out)
        want = np.argmax(x, axis=1)
        want[3] = -1
        assert (cp.asnumpy(out) == want).all()


def test_argument_checks():
    B, V = 4, 1000
    ok = dict(logits=cp.zeros((B, V), cp.float32), temperature=cp.zeros(B, cp.float32),
              top_k=cp.ones(B, cp.int32), top_p=cp.ones(B, cp.float32), min_p=cp.zeros(B, cp.float32),
              repeat_penalty=cp.ones(B, cp.float32), history=cp.full((B, 2), -1, cp.int32),
              u=cp.zeros(B, cp.float32), out=cp.zeros(B, cp.int32))
    sample(**ok)
    bad = [
        ("logits", cp.zeros((B, V), cp.float64)), ("logits", cp.zeros((B, V, 1), cp.float32)),
        ("logits", cp.zeros((B, 2 * V), cp.float32)[:, ::2]), ("logits", np.zeros((B, V), np.float32)),
        ("logits", cp.zeros((B, 262145), cp.float32)), ("logits", cp.zeros((B, 0), cp.float32)),
        ("temperature", cp.zeros(B, cp.float64)), ("temperature", cp.zeros(B + 1, cp.float32)),
        ("top_k", cp.ones(B, cp.int64)), ("top_p", cp.ones((B, 1), cp.float32)),
        ("min_p", cp.zeros(2 * B, cp.float32)[::2]), ("repeat_penalty", cp.ones(B, cp.float16)),
        ("history", cp.full((B, 2), -1, cp.int64)), ("history", cp.full((B + 1, 2), -1, cp.int32)),
        ("history", cp.full((B, 4), -1, cp.int32)[:, ::2]), ("history", cp.full(B, -1, cp.int32)),
        ("u", cp.zeros(B, cp.int32)), ("out", cp.zeros(B, cp.int64)), ("out", cp.zeros(B - 1, cp.int32)),
    ]
    for name, value in bad:
        with pytest.raises(ValueError, match=name):
            sample(**{**ok, name: value})
    many = {k: (cp.zeros((257,) + v.shape[1:], v.dtype) if k != "logits" else cp.zeros((257, 8), cp.float32))
            for k, v in ok.items()}
    with pytest.raises(ValueError, match="rows"):
        sample(**many)
    with pytest.raises(ValueError, match="out"):
        argmax(ok["logits"], cp.zeros(B, cp.int64))
    with pytest.raises(ValueError, match="logits"):
        argmax(ok["logits"].astype(cp.float16), ok["out"])
