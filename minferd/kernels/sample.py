"""Launchers of sample.cu (next-token sampling for a batch of logits rows on the GPU) and
sample_ref, its NumPy reference: the spec the kernel matches id for id.

The semantics are minferd/model/sampler.py's Sampler.sample, row by row:
  - repeat penalty first: each distinct id of the row's history (-1 = empty slot) has its
    logit divided by the penalty if positive, multiplied if not, clipped to float32's range;
    a penalty of exactly 1 is off (nothing clipped);
  - temperature 0: argmax, ties to the lowest id;
  - otherwise the top_k candidates, ordered by descending logit and, among equal logits,
    ascending id (so ties at the top-k boundary keep the lowest ids; Sampler's argpartition
    keeps an arbitrary subset of them); w = exp(l - max); min-p keeps the leading run with
    w >= min_p; top-p the smallest prefix whose mass (w over the sum of the top_k weights)
    reaches top_p, the crossing token kept; probabilities exp((l - max) / T) over what is
    kept (1/T capped at 1e30); the token drawn by inverse CDF with u over the kept candidates
    in that order (Sampler's _bucket rule).
Where Sampler's arithmetic is open, this fixes it so that a GPU can repeat it bit for bit:
exp is float64 then rounded to float32 (float32 exps differ between libraries in the last
bit), the weight total is the sequential float64 sum in candidate order (Sampler sums
pairwise in argpartition order). Both differ from Sampler by float rounding only:
tests/unit/test_sample_ref.py checks the kept sets, probabilities and draws against it.

Rows Sampler would refuse get -1 instead (the kernel cannot raise): NaN logits (greedy or
not), a non-finite maximum when sampling, history ids outside [0, V) other than -1 when
the penalty is on, and parameters out of range (temperature < 0 or not finite, penalty
<= 0 or not finite; when sampling, top_k outside 1..MAX_TOP_K, top_p outside (0, 1], min_p
outside [0, 1], u outside [0, 1]). Greedy rows ignore top_k, top_p, min_p and u.

The launchers check arguments on the host and then only enqueue two kernels on the current
stream and take one scratch buffer from CuPy's current allocator (B x segments x 2 KiB): no
synchronisation, no device reads, so they are safe inside CUDA graph capture.
"""
from __future__ import annotations

import functools

import numpy as np

from . import kernel

MAX_TOP_K = 256  # rows whose top_k is 0 or larger than this are not handled here (the caller samples them on the host)
MAX_ROWS = 256
MAX_VOCAB = 262144
_THREADS = 1024
_CAP = 4096  # sample.cu's CAP: survivors held in shared memory, >= _MAX_SEGMENTS * MAX_TOP_K
_SLOT = 2 + MAX_TOP_K  # u64s of scratch per (row, segment)
_MAX_SEGMENTS = 16
_MIN_SEGMENT = 4096
TARGET_CTAS = 128  # rows x segments the first kernel aims at: about one per SM of an H100/H200
_F32_MAX = float(np.finfo(np.float32).max)
MERGE_SMEM = MAX_TOP_K * (8 + 8 + 8 + 8 + 4 + 4) + _CAP * 8


def names() -> tuple[str, ...]:
    return tuple(f"sample_part<{int(v)}, {int(g)}>" for v in (True, False) for g in (False, True)) + \
        ("sample_merge<0>", "sample_merge<1>")


def part_smem(L: int) -> int:
    """Dynamic shared memory of sample_part for segments of L ids: the winners, the
    survivors of pass B and the segment's history bitmap."""
    return MAX_TOP_K * 8 + _CAP * 8 + 4 * ((L + 31) // 32)


def segments(B: int, V: int) -> tuple[int, int]:
    """(S, L): each row is cut into S segments of L ids (a multiple of 4, so that vector
    loads stay aligned), enough that B * S CTAs fill the GPU; one CTA streams only ~25 GB/s."""
    S = max(1, min(_MAX_SEGMENTS, TARGET_CTAS // max(B, 1), -(-V // _MIN_SEGMENT)))
    L = (-(-V // S) + 3) // 4 * 4
    return -(-V // L), L


@functools.lru_cache(maxsize=None)
def _fn(name: str):
    return kernel("sample", name, names(), part_smem(MAX_VOCAB) if name.startswith("sample_part") else 0)


def _check_logits(logits, what: str) -> tuple[int, int]:
    import cupy
    if not isinstance(logits, cupy.ndarray):
        raise ValueError(f"{what}: logits must be a cupy array, got {type(logits).__name__}")
    if logits.dtype != np.float32 or logits.ndim != 2 or not logits.flags.c_contiguous:
        raise ValueError(f"{what}: logits must be C-contiguous float32 (B, V), got {logits.dtype} "
                         f"{tuple(logits.shape)}{'' if logits.flags.c_contiguous else ' (not contiguous)'}")
    B, V = logits.shape
    if not 0 <= B <= MAX_ROWS:
        raise ValueError(f"{what}: logits has {B} rows, at most {MAX_ROWS}")
    if not 1 <= V <= MAX_VOCAB:
        raise ValueError(f"{what}: logits has a vocab of {V}, outside 1..{MAX_VOCAB}")
    _check_device(logits, "logits", what)
    return B, V


def _check_device(a, name: str, what: str) -> None:
    import cupy
    dev = cupy.cuda.runtime.getDevice()
    if a.device.id != dev:
        raise ValueError(f"{what}: {name} is on device {a.device.id}, the current device is {dev}")


def _check_vec(a, name: str, dtype, B: int, what: str) -> None:
    import cupy
    if not isinstance(a, cupy.ndarray):
        raise ValueError(f"{what}: {name} must be a cupy array, got {type(a).__name__}")
    if a.dtype != dtype or a.shape != (B,) or not a.flags.c_contiguous:
        raise ValueError(f"{what}: {name} must be contiguous {np.dtype(dtype).name} ({B},), "
                         f"got {a.dtype} {tuple(a.shape)}{'' if a.flags.c_contiguous else ' (not contiguous)'}")
    _check_device(a, name, what)


def sample(logits, temperature, top_k, top_p, min_p, repeat_penalty, history, u, out) -> None:
    """out[b] = the token sampled from logits[b] (module docstring: the semantics).

    logits: cupy float32 (B, V) C-contiguous, B <= 256, V <= 262144; temperature, top_p, min_p,
    repeat_penalty, u: cupy float32 (B,); top_k: cupy int32 (B,) in 1..MAX_TOP_K (ignored
    when greedy); history: cupy int32 (B, H) C-contiguous, the penalty window's ids, -1 =
    empty slot (H may be 0); u: uniform in [0, 1) from each sequence's own RNG; out: cupy
    int32 (B,), -1 for a row Sampler would refuse."""
    import cupy
    what = "sample"
    B, V = _check_logits(logits, what)
    for name, a, dt in (("temperature", temperature, np.float32), ("top_k", top_k, np.int32),
                        ("top_p", top_p, np.float32), ("min_p", min_p, np.float32),
                        ("repeat_penalty", repeat_penalty, np.float32), ("u", u, np.float32),
                        ("out", out, np.int32)):
        _check_vec(a, name, dt, B, what)
    if not isinstance(history, cupy.ndarray):
        raise ValueError(f"{what}: history must be a cupy array, got {type(history).__name__}")
    if history.dtype != np.int32 or history.ndim != 2 or history.shape[0] != B or not history.flags.c_contiguous:
        raise ValueError(f"{what}: history must be C-contiguous int32 ({B}, H), got {history.dtype} "
                         f"{tuple(history.shape)}{'' if history.flags.c_contiguous else ' (not contiguous)'}")
    _check_device(history, "history", what)
    H = history.shape[1]
    if B * H >= 1 << 31:
        raise ValueError(f"{what}: history of {B} x {H} ids is too large")
    if B == 0:
        return
    _launch(logits, B, V, False, (temperature, top_k, top_p, min_p, repeat_penalty),
            history if H else np.uint64(0), H, u, out)


def _launch(logits, B, V, greedy, params, history, H, u, out) -> None:
    import cupy
    S, L = segments(B, V)
    vec = V % 4 == 0 and logits.data.ptr % 16 == 0
    # From CuPy's current allocator, like every other temporary of a captured step.
    scratch = cupy.empty((B, S, _SLOT), cupy.uint64)
    temperature, top_k, top_p, min_p, penalty = params
    _fn(f"sample_part<{int(vec)}, {int(greedy)}>")(
        (S, B), (_THREADS,),
        (logits, np.int32(V), np.int32(L), np.int32(S), temperature, top_k, top_p, min_p, penalty,
         history, np.int32(H), u, scratch),
        shared_mem=0 if greedy else part_smem(L))
    _fn(f"sample_merge<{int(greedy)}>")(
        (B,), (_THREADS,),
        (np.int32(V), np.int32(S), temperature, top_k, top_p, min_p, penalty, u, scratch, out),
        shared_mem=0 if greedy else MERGE_SMEM)


def argmax(logits, out) -> None:
    """out[b] = argmax(logits[b]), ties to the lowest id, -1 for a row holding NaN: the
    greedy rows of sample() without their parameters (no penalty)."""
    what = "argmax"
    B, V = _check_logits(logits, what)
    _check_vec(out, "out", np.int32, B, what)
    if B == 0:
        return
    null = np.uint64(0)
    _launch(logits, B, V, True, (null,) * 5, null, 0, null, out)


# ---------------------------------------------------------------------------------------
# NumPy reference


def _ref_arrays(logits, temperature, top_k, top_p, min_p, repeat_penalty, history, u):
    logits = np.asarray(logits)
    if logits.dtype != np.float32 or logits.ndim != 2:
        raise ValueError(f"sample_ref: logits must be float32 (B, V), got {logits.dtype} {logits.shape}")
    B, V = logits.shape
    if not 1 <= V <= MAX_VOCAB:
        raise ValueError(f"sample_ref: logits has a vocab of {V}, outside 1..{MAX_VOCAB}")
    vecs = []
    for name, a, dt in (("temperature", temperature, np.float32), ("top_k", top_k, np.int32),
                        ("top_p", top_p, np.float32), ("min_p", min_p, np.float32),
                        ("repeat_penalty", repeat_penalty, np.float32), ("u", u, np.float32)):
        a = np.asarray(a)
        if a.dtype != dt or a.shape != (B,):
            raise ValueError(f"sample_ref: {name} must be {np.dtype(dt).name} ({B},), got {a.dtype} {a.shape}")
        vecs.append(a)
    history = np.asarray(history)
    if history.dtype != np.int32 or history.ndim != 2 or history.shape[0] != B:
        raise ValueError(f"sample_ref: history must be int32 ({B}, H), got {history.dtype} {history.shape}")
    return logits, vecs, history


def penalize_ref(row: np.ndarray, penalty: np.float32, history: np.ndarray) -> np.ndarray | None:
    """row with the repeat penalty applied (Sampler._penalize's arithmetic), None when the
    history holds an id outside [0, V) other than -1 (Sampler raises)."""
    if penalty == np.float32(1):
        return row
    ids = history[history != -1].astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= row.size):
        return None
    if ids.size == 0:
        return row
    ids = np.unique(ids)
    out = row.copy()
    vals = out[ids].astype(np.float64)
    p = float(penalty)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out[ids] = np.clip(np.where(vals > 0, vals / p, vals * p), -_F32_MAX, _F32_MAX)
    return out


def candidates_ref(row: np.ndarray, temperature, top_k, top_p, min_p):
    """The kept candidates of a penalised row when sampling: (ids, probs), ids in draw order
    (descending logit, then ascending id), probs float32 (unnormalised). None where Sampler
    would refuse the row (NaN, non-finite maximum)."""
    V = row.size
    if np.isnan(row).any():
        return None
    top = row.max()
    if not np.isfinite(top):
        return None
    k = min(int(top_k), V)
    if k < V:
        kth = np.partition(row, V - k)[V - k]  # the k-th largest value
        above = np.flatnonzero(row > kth)
        cand = np.concatenate([above, np.flatnonzero(row == kth)[: k - above.size]])
    else:
        cand = np.arange(V)
    cand = cand[np.lexsort((cand, -row[cand]))]  # descending logit, then ascending id (-0.0 == 0.0)
    z = row[cand] - top  # float32, as Sampler's lg - top
    w = np.exp(z.astype(np.float64)).astype(np.float32)
    bad = np.flatnonzero(~(w >= np.float32(min_p)))
    n = int(bad[0]) if bad.size else k
    cw = np.cumsum(w, dtype=np.float64)
    if top_p < np.float32(1):
        cross = np.flatnonzero(cw[:n] / cw[-1] >= float(top_p))
        if cross.size:
            n = int(cross[0]) + 1
    inv_t = np.float32(min(1.0 / float(temperature), 1e30))
    probs = np.exp((z[:n] * inv_t).astype(np.float64)).astype(np.float32)
    return cand[:n], probs


def draw_ref(probs: np.ndarray, u) -> int:
    """Index drawn from float32 probs by inverse CDF with u (Sampler's _bucket rule)."""
    cum = np.cumsum(probs, dtype=np.float64)
    x = float(u) * cum[-1]
    i = int(np.searchsorted(cum, x, side="right"))
    return i if i < cum.size else int(np.searchsorted(cum, cum[-1], side="left"))


def _valid(T, k, tp, mp, pen, u) -> bool:
    if not (0 <= T <= _F32_MAX) or not (0 < pen <= _F32_MAX):
        return False
    return T == 0 or (1 <= k <= MAX_TOP_K and 0 < tp <= 1 and 0 <= mp <= 1 and 0 <= u <= 1)


def sample_ref(logits, temperature, top_k, top_p, min_p, repeat_penalty, history, u) -> np.ndarray:
    """What sample() writes to out, from NumPy arrays of the same shapes and dtypes."""
    logits, (T, K, TP, MP, PEN, U), history = _ref_arrays(logits, temperature, top_k, top_p, min_p,
                                                          repeat_penalty, history, u)
    out = np.full(logits.shape[0], -1, np.int32)
    for b in range(logits.shape[0]):
        if not _valid(T[b], K[b], TP[b], MP[b], PEN[b], U[b]):
            continue
        row = penalize_ref(logits[b], PEN[b], history[b])
        if row is None:
            continue
        if T[b] == 0:
            best = int(np.argmax(row))  # the first maximum, or the first NaN
            out[b] = -1 if np.isnan(row[best]) else best
            continue
        kept = candidates_ref(row, T[b], K[b], TP[b], MP[b])
        if kept is not None:
            ids, probs = kept
            out[b] = ids[draw_ref(probs, U[b])]
    return out
