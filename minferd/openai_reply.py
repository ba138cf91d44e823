"""One request's answer in OpenAI's shapes (a whole completion, or its server-sent chunks), from
the host's stream of events; the HTTP front (minferd/http_api.py) sends them."""
from __future__ import annotations

import itertools
import time

FINISH = {"stop": "stop", "length": "length", "ctx": "length"}  # minferd's finish reasons -> OpenAI's
_ids = itertools.count(1)


class Reply:
    """One request's answer in OpenAI's shapes, from the host's stream of events."""

    def __init__(self, model: str, chat: bool, n_prompt: int, usage_in_stream: bool):
        self.model, self.chat, self.n_prompt, self.usage_in_stream = model, chat, n_prompt, usage_in_stream
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{next(_ids)}"
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.result, self.pieces = None, 0  # the GenerationResult once done; tokens seen so far

    def usage(self, res) -> dict:
        return {"prompt_tokens": res.prompt_tokens, "completion_tokens": len(res.token_ids),
                "total_tokens": res.prompt_tokens + len(res.token_ids)}

    def whole(self, events) -> dict:
        res = self.result = next(a for kind, a, _ in events if kind == "done")
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": res.text}}
        else:
            choice = {"index": 0, "text": res.text, "logprobs": None}
        choice["finish_reason"] = FINISH.get(res.finish_reason, res.finish_reason)
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage(res)}

    def _chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict:
        if self.chat:
            delta = ({"role": "assistant", "content": ""} if first else {}) | ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def chunks(self, first, events):
        if self.chat:
            yield self._chunk(None, None, first=True)
        for kind, a, b in itertools.chain([first] if first else [], events):
            if kind == "piece":
                self.pieces += a >= 0
                if b:
                    yield self._chunk(b, None)
            elif kind == "done":
                self.result = a
                last = self._chunk(None, FINISH.get(a.finish_reason, a.finish_reason))
                if self.usage_in_stream:
                    last["usage"] = self.usage(a)
                yield last
