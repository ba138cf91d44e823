"""Prompt in, tokens out: prefill, then decode one token at a time against a KV cache.

`generate` streams (token id, text piece) events to a callback and returns the whole result;
`score` runs one teacher-forced pass and reports every position's top-k next tokens.
"""
from __future__ import annotations

import codecs
import math
import time
from dataclasses import dataclass, field

import numpy as np

from minferd.backend.base import KVCache
from minferd.backend.batch import Batch
from minferd.errors import InvalidRequest
from minferd.model.sampler import Sampler, SamplingParams, StopChecker

@dataclass(slots=True)
class GenerationResult:
    token_ids: list[int]
    text: str
    prompt_tokens: int
    finish_reason: str  # "stop" (end of generation token or stop string) | "length" | "ctx"
    timings: dict = field(default_factory=dict)


def check_prompt(ids, n_vocab: int, ctx: int, max_tokens: int = 0) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise InvalidRequest("the prompt is empty")
    bad = ids[(ids < 0) | (ids >= n_vocab)]
    if bad.size:
        raise InvalidRequest(f"token id {int(bad[0])} is outside the vocabulary [0, {n_vocab})")
    if ids.size + max_tokens > ctx:
        raise InvalidRequest(f"prompt ({ids.size} tokens) + max_tokens ({max_tokens}) exceeds the context of {ctx}")
    return ids


def prefill(model, ids: np.ndarray, cache: KVCache, all_logits: bool = False):
    """Feed ids in chunks of the model's batch; returns host f32 logits of the last position
    (or of every position)."""
    be, step = model.be, model.max_batch
    out = []
    for s in range(0, len(ids), step):
        logits = model.forward(ids[s:s + step], cache, all_logits=all_logits)
        out.append(be.to_host(logits))
    return np.concatenate(out) if all_logits else out[-1][-1]


def decode_one(model, token: int, cache: KVCache):
    """Logits (1, vocab) of one more token of a cache's one sequence."""
    logits = model.be.decode(model, Batch.solo([token], cache.n_tokens, cache), cache)
    cache.n_tokens += 1
    return logits


def generate(model, tokenizer, prompt_ids, params: SamplingParams, ctx: int, on_piece=None,
             should_stop=None, cache: KVCache | None = None) -> GenerationResult:
    """Sample up to params.max_tokens tokens after prompt_ids. on_piece(token_id, text) is called
    for each token as it is produced (text may be "" while a UTF-8 character or a possible stop
    string is incomplete); should_stop() returning True ends the generation ("cancelled")."""
    be = model.be
    ids = check_prompt(prompt_ids, model.spec.n_vocab, ctx)
    own = cache is None
    if own:
        cache = model.new_cache(be.untracked(), ctx)
    cache.n_tokens = 0
    sampler = Sampler(params)
    stops = StopChecker(params.stop)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    history = ids.tolist()
    out_ids, text = [], []
    finish = "length"
    try:
        t0 = time.perf_counter()
        logits = prefill(model, ids, cache)
        t1 = time.perf_counter()
        for _ in range(params.max_tokens):
            tok = sampler.sample(logits, history)
            if tok in tokenizer.eog_ids:
                finish = "stop"
                break
            out_ids.append(tok)
            history.append(tok)
            piece, stopped = stops.feed(utf8.decode(tokenizer.token_piece(tok)))
            text.append(piece)
            if on_piece:
                on_piece(tok, piece)
            if stopped:
                finish = "stop"
                break
            if should_stop and should_stop():
                finish = "cancelled"
                break
            if cache.n_tokens >= ctx:
                finish = "ctx"
                break
            logits = be.to_host(decode_one(model, tok, cache))[-1]
        t2 = time.perf_counter()
    finally:
        if own:
            be.free(cache)
    if finish != "stop" or not params.stop:
        tail = stops.flush() + utf8.decode(b"", final=True)
        text.append(tail)
        if on_piece and tail:
            on_piece(-1, tail)
    n_dec = max(len(out_ids) - 1, 0)  # the first token comes from the prefill's logits
    timings = {
        "prefill_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3,
        "prefill_tok_s": len(ids) / max(t1 - t0, 1e-9),
        "decode_tok_s": n_dec / (t2 - t1) if n_dec and t2 > t1 else 0.0,
    }
    return GenerationResult(out_ids, "".join(text), len(ids), finish, timings)


def score(model, ids, top_k: int = 5, ctx: int | None = None) -> dict:
    """Teacher-forced pass: for each position the top_k next tokens [id, logit, logprob], and the
    perplexity of the sequence (over positions 1..n-1, as llama-perplexity counts it)."""
    be = model.be
    ids = check_prompt(ids, model.spec.n_vocab, ctx or model.spec.ctx_train)
    cache = model.new_cache(be.untracked(), len(ids))
    try:
        logits = prefill(model, ids, cache, all_logits=True)
    finally:
        be.free(cache)
    positions, nll = [], []
    for i, row in enumerate(logits):
        row = row.astype(np.float64)
        lse = float(np.log(np.sum(np.exp(row - row.max()))) + row.max())
        top = np.argpartition(-row, top_k - 1)[:top_k] if top_k < row.size else np.arange(row.size)
        top = top[np.lexsort((top, -row[top]))]
        positions.append({"top": [[int(t), float(row[t]), float(row[t] - lse)] for t in top]})
        if i + 1 < len(ids):
            nll.append(lse - row[ids[i + 1]])
    mean_nll = float(np.mean(nll)) if nll else float("nan")
    # A random model can be surer of a wrong token than exp() reaches: infinite, not an error.
    ppl = math.exp(mean_nll) if mean_nll < 709.0 else float("inf")
    return {"positions": positions, "perplexity": ppl}
