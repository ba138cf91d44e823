"""One request as the engine runs it: its tokens, its KV blocks, its sampler and its output."""
from __future__ import annotations

import codecs
import enum
import itertools
import queue
import threading
import time

from minferd.model.sampler import Sampler, SamplingParams, StopChecker

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"  # not admitted, or preempted (its blocks given back; recomputed on resume)
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, prompt: list[int], params: SamplingParams, ctx: int, tokenizer):
        self.id = next(_ids)
        self.tokens = list(prompt)  # prompt, then the generated ids
        self.n_prompt = len(prompt)
        self.params, self.ctx, self.tokenizer = params, ctx, tokenizer
        self.sampler = Sampler(params)
        self.stops = StopChecker(params.stop)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.status = Status.WAITING
        self.admitted = False  # it ran at least once (what a request count counts)
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chain hashes of the leading full blocks
        self.n_computed = 0  # tokens whose K and V are in the cache
        self.ahead = 0  # 1 while its last sampled token is on the device only (engine.py: a step run ahead)
        self.n_cached = 0  # of the prompt, tokens a prefix-cache hit spared (the latest admission's)
        self.n_hashed = 0  # leading full blocks registered in the prefix cache
        self.finish_reason: str | None = None
        self.cancelled = threading.Event()  # set by the client's side; the engine ends it at its next step
        self.gone: threading.Event | None = None  # the client's connection closed (set by the server)
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # ("piece", id, text) ..., then ("end", ...)
        self.outbox: list = []  # events made this step, handed to `events` by the engine's flush
        self.text: list[str] = []
        self.t_arrived = time.perf_counter()
        self.t_first = self.t_last = None
        self.preemptions = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    @property
    def n_generated(self) -> int:  # per token: not a copy of every token so far
        return len(self.tokens) - self.n_prompt

    @property
    def n_uncomputed(self) -> int:
        """Tokens still to be run through the model: the prompt's rest, or the one sampled last."""
        return len(self.tokens) + self.ahead - self.n_computed

    def flush(self) -> None:
        """Hand this step's events to the client's side (each put may wake its thread)."""
        for ev in self.outbox:
            self.events.put(ev)
        self.outbox.clear()

    def stopped(self) -> bool:
        return self.cancelled.is_set() or (self.gone is not None and self.gone.is_set())

    def last_token_due(self) -> bool:
        """Whether the next token it samples ends it whatever its value (its length or context)."""
        return self.n_generated + 1 >= self.params.max_tokens or len(self.tokens) + 1 > self.ctx

    def add_token(self, tok: int) -> None:
        """Append a sampled token, stream its text, and end the sequence where that is due."""
        now = time.perf_counter()
        self.t_first = self.t_first or now
        self.t_last = now
        if tok in self.tokenizer.eog_ids:
            return self.finish("stop")
        self.tokens.append(tok)
        piece, stopped = self.stops.feed(self.utf8.decode(self.tokenizer.token_piece(tok)))
        self.text.append(piece)
        self.outbox.append(("piece", tok, piece))
        if stopped:
            self.finish("stop")
        elif self.n_generated >= self.params.max_tokens:
            self.finish("length")
        elif len(self.tokens) > self.ctx:  # the new token has no position left to be computed at
            self.finish("ctx")

    def finish(self, reason: str) -> None:
        if self.status is Status.FINISHED:
            return
        self.status, self.finish_reason = Status.FINISHED, reason
        if reason != "stop" or not self.params.stop:
            tail = self.stops.flush() + self.utf8.decode(b"", final=True)
            if tail:
                self.text.append(tail)
                self.outbox.append(("piece", -1, tail))

    def timings(self) -> dict:
        t0, t1, t2 = self.t_arrived, self.t_first or self.t_arrived, self.t_last or self.t_arrived
        n_dec = max(self.n_generated - 1, 0)
        return {"prefill_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3,
                "prefill_tok_s": self.n_prompt / max(t1 - t0, 1e-9),
                "decode_tok_s": n_dec / (t2 - t1) if n_dec and t2 > t1 else 0.0,
                "cached_tokens": self.n_cached, "preemptions": self.preemptions}
