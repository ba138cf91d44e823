"""Token sampling (llama.cpp's default chain) and stop-string detection over streamed text."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from minferd.errors import InvalidRequest

MAX_TOKENS_CAP = 1 << 20
MAX_STOP_STRINGS = 16


def _require(ok: bool, field: str, allowed: str, value) -> None:
    if not ok:
        raise InvalidRequest(f"{field} must be {allowed}, got {value!r}")


def _is_int(x) -> bool:
    # bool is an int subclass; True as a top_k is a client bug, not 1.
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Defaults are llama.cpp server's, so a request without options behaves as clients expect."""

    temperature: float = 0.8  # 0 = greedy
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1 = off
    min_p: float = 0.05  # 0 = off
    repeat_penalty: float = 1.0  # 1 = off
    repeat_last_n: int = 64  # -1 = whole history, 0 = off
    seed: int | None = None  # None = fresh OS entropy per Sampler
    max_tokens: int = 128
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A bare str would otherwise become one stop string per character.
        _require(not isinstance(self.stop, str), "stop", "a sequence of strings", self.stop)
        if not isinstance(self.stop, tuple):  # keep the params hashable when given a list
            _require(hasattr(self.stop, "__iter__"), "stop", "a sequence of strings", self.stop)
            object.__setattr__(self, "stop", tuple(self.stop))
        self.validate()

    def validate(self) -> None:
        t = self.temperature
        _require(_is_real(t) and math.isfinite(t) and t >= 0, "temperature", "finite and >= 0 (0 = greedy)", t)
        _require(_is_int(self.top_k) and self.top_k >= 0, "top_k", "an integer >= 0 (0 = off)", self.top_k)
        p = self.top_p
        _require(_is_real(p) and 0 < p <= 1, "top_p", "in (0, 1]", p)
        m = self.min_p
        _require(_is_real(m) and 0 <= m <= 1, "min_p", "in [0, 1]", m)
        r = self.repeat_penalty
        _require(_is_real(r) and math.isfinite(r) and r > 0, "repeat_penalty", "finite and > 0 (1 = off)", r)
        n = self.repeat_last_n
        _require(_is_int(n) and n >= -1, "repeat_last_n", "an integer >= -1 (-1 = all, 0 = off)", n)
        s = self.seed
        _require(s is None or (_is_int(s) and 0 <= s < 1 << 64), "seed", "None or an integer in [0, 2**64)", s)
        k = self.max_tokens
        _require(_is_int(k) and 1 <= k <= MAX_TOKENS_CAP, "max_tokens", f"an integer in [1, {MAX_TOKENS_CAP}]", k)
        _require(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"at most {MAX_STOP_STRINGS} strings", len(self.stop))
        for x in self.stop:
            _require(isinstance(x, str) and x != "", "stop", "non-empty strings", x)


def _bucket(cum: np.ndarray, x: float) -> int:
    # side="right" never lands on a zero-width bucket; past the end (x rounded up to the
    # total) we take the last bucket that has any width.
    i = int(np.searchsorted(cum, x, side="right"))
    return i if i < cum.size else int(np.searchsorted(cum, cum[-1], side="left"))


def _inverse_cdf(weights: np.ndarray, u: float, block: int = 1024) -> int:
    """Index drawn with probability proportional to weights, for u uniform in [0, 1).
    Two levels (block sums, then one block) because a float64 cumsum over a whole
    262k vocab costs milliseconds and a float32 one drifts."""
    if weights.size <= block:
        cum = np.cumsum(weights, dtype=np.float64)
        return _bucket(cum, u * cum[-1])
    sums = np.cumsum(np.add.reduceat(weights, np.arange(0, weights.size, block), dtype=np.float64))
    b = _bucket(sums, u * sums[-1])
    inner = np.cumsum(weights[b * block:(b + 1) * block], dtype=np.float64)
    return b * block + _bucket(inner, u * sums[-1] - (sums[b - 1] if b else 0.0))


class Sampler:
    """Picks the next token from one row of logits. Owns its RNG: one Sampler per sequence."""

    # top_p without top_k/min_p would need a full sort of the vocab; grow a partial one instead.
    _FIRST_PARTIAL = 256

    def __init__(self, params: SamplingParams):
        self.params = params
        self._rng = None  # made at the first draw: a greedy request never pays its ~20 us (OS entropy unseeded)

    def uniform(self) -> float:
        """The draw one sampled token takes (the CUDA backend samples with it on the device)."""
        if self._rng is None:
            self._rng = np.random.Generator(np.random.PCG64(self.params.seed))
        return self._rng.random()

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        logits = np.asarray(logits, dtype=np.float32)
        if logits.ndim != 1 or logits.size == 0:
            raise ValueError(f"logits must be a non-empty 1-D array, got shape {logits.shape}")
        logits = self._penalize(logits, history)
        if self.params.temperature == 0:
            best = int(np.argmax(logits))  # first maximum: ties go to the lowest id
            if np.isnan(logits[best]):
                raise ValueError("logits contain NaN")
            return best
        return self._draw(logits)

    def _penalize(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        p, n = self.params.repeat_penalty, self.params.repeat_last_n
        if p == 1.0 or n == 0 or len(history) == 0:
            return logits
        window = history if n == -1 else history[-n:]
        ids = np.unique(np.asarray(window, dtype=np.int64))  # a repeated token is penalised once
        if ids[0] < 0 or ids[-1] >= logits.size:
            raise ValueError(f"history holds token ids outside [0, {logits.size})")
        out = logits.copy()  # the caller's logits row may be reused (e.g. a view of a batch)
        vals = out[ids].astype(np.float64)
        # Dividing a negative logit would raise it; llama.cpp multiplies those instead.
        # The penalty is float32 as in llama.cpp (float64 arithmetic on float32 operands rounds
        # to the same float32 results); clipped to float32's range because a valid but extreme
        # penalty (1e-308 underflows to 0 as float32) made +-inf logits, which _draw refused as
        # an internal error.
        lim = float(np.finfo(np.float32).max)
        with np.errstate(over="ignore"):
            p32 = float(np.float32(p))
            p = p32 if 0 < p32 < math.inf else p
            out[ids] = np.clip(np.where(vals > 0, vals / p, vals * p), -lim, lim)
        return out

    def _draw(self, logits: np.ndarray) -> int:
        prm = self.params
        vocab = logits.size
        cand = None  # None = the whole vocab; saves gathering 262k logits when top_k is off
        if 0 < prm.top_k < vocab:
            cand = np.argpartition(logits, vocab - prm.top_k)[vocab - prm.top_k:]
        lg = logits if cand is None else logits[cand]
        top = lg.max()
        if not np.isfinite(top):
            raise ValueError(f"logits must have a finite maximum, got {top}")
        # w = p / p_max at temperature 1: top-p and min-p read the untempered distribution.
        # float32 exp is ~10x faster than float64 over a large vocab and precise enough here.
        w = np.exp(lg - top)
        keep = np.flatnonzero(w >= prm.min_p) if prm.min_p > 0 else None
        if prm.top_p < 1:
            # Both filters keep a prefix of the descending order, so their intersection is
            # the shorter prefix; running min-p first only shrinks what top-p has to sort.
            everything = np.arange(lg.size) if keep is None else keep
            keep = self._top_p(everything, w, float(w.sum(dtype=np.float64)))
        x = lg if keep is None else lg[keep]
        # Capped so a tiny temperature cannot overflow to inf and turn 0 * inf into NaN.
        inv_t = np.float32(min(1.0 / prm.temperature, 1e30))
        probs = np.exp((x - top) * inv_t)
        pick = _inverse_cdf(probs, self.uniform())
        if keep is not None:
            pick = int(keep[pick])
        return pick if cand is None else int(cand[pick])

    def _top_p(self, keep: np.ndarray, w: np.ndarray, total: float) -> np.ndarray:
        """The smallest descending prefix of `keep` whose mass reaches top_p (as llama.cpp,
        the token that crosses the threshold is kept). Sorts a growing head, not all of it."""
        k = self._FIRST_PARTIAL
        wk = w[keep]
        while True:
            if k < keep.size:
                part = np.argpartition(wk, keep.size - k)[keep.size - k:]
            else:
                part = np.arange(keep.size)
            part = part[np.argsort(-wk[part])]  # introsort: deterministic for equal input
            cum = np.cumsum(wk[part], dtype=np.float64) / total
            i = int(np.searchsorted(cum, self.params.top_p, side="left"))
            if i < part.size or part.size == keep.size:
                return keep[part[: min(i + 1, part.size)]]
            k *= 8


class StopChecker:
    """Cuts streamed text at the first occurrence of any stop string.

    Text that might still become (part of) a stop string is held back, so a stop string
    split across tokens never reaches the client. What feed() emits plus flush() equals
    the whole text truncated before its first stop occurrence, however it was split.
    """

    def __init__(self, stops: Sequence[str]):
        stops = tuple(stops)
        for s in stops:
            if not isinstance(s, str) or s == "":
                raise InvalidRequest(f"stop must be non-empty strings, got {s!r}")
        self._stops = stops
        self._pending = ""
        self.stopped = False

    def feed(self, piece: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, whether a stop string has been reached)."""
        if self.stopped:
            return "", True
        if not self._stops:  # most requests: nothing to hold back (a decode step feeds every sequence)
            return piece, False
        text = self._pending + piece
        hit = self._first_match(text)
        hold = self._first_partial(text)
        # A complete match wins unless a longer stop string starting earlier may still
        # complete: that one would truncate earlier, so wait for more text.
        if hit is not None and (hold is None or hold >= hit):
            self._pending = ""
            self.stopped = True
            return text[:hit], True
        cut = len(text) if hold is None else hold
        self._pending = text[cut:]
        return text[:cut], False

    def flush(self) -> str:
        """At end of generation: the held-back text, truncated at a stop string it holds."""
        if self.stopped:
            return ""
        text, self._pending = self._pending, ""
        hit = self._first_match(text)
        if hit is not None:
            self.stopped = True
            return text[:hit]
        return text

    def _first_match(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        return min(found) if found else None

    def _first_partial(self, text: str) -> int | None:
        """Earliest i where text[i:] is a proper prefix of some stop string (could still complete)."""
        longest = max((len(s) for s in self._stops), default=0)
        for i in range(max(0, len(text) - longest + 1), len(text)):
            tail = text[i:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self._stops):
                return i
        return None
