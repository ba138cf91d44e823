"""What a request must be before any work on it, for both fronts (gRPC, HTTP): every bound a
client's input meets (config.py holds the numbers), checked before the input is tokenized,
rendered or queued. Each failure is an InvalidRequest naming the field and the limit."""
from __future__ import annotations

import math

from minferd import config
from minferd.errors import InvalidRequest, excerpt

# Roles the proto names, plus "tool" (templates render tool results). Anything else went into
# the template verbatim (ChatML printed an empty or made-up role as markup): refused instead.
CHAT_ROLES = frozenset(("system", "user", "assistant", "tool"))


def keep_alive_seconds(seconds: float) -> float:
    # NaN passed every comparison in the reaper and meant "forever" while status showed NaN.
    if math.isnan(seconds):
        raise InvalidRequest("keep_alive_seconds is NaN: give seconds, 0 (unload when idle) or negative (forever)")
    return seconds


def check_text_fits(tok, text: str, ctx: int) -> None:
    """A text that must tokenize to more than ctx tokens is refused before tokenizing it: no token
    stands for more than tok.max_piece_bytes bytes. Tokenizing a 16 MiB prompt only to refuse it
    took tens of seconds and held the model's tokenizer meanwhile."""
    n = utf8_len(text)
    if n > ctx * tok.max_piece_bytes:
        raise InvalidRequest(f"prompt of {n} bytes cannot fit the model's context of {ctx} tokens "
                             f"(no token covers more than {tok.max_piece_bytes} bytes)")


def bound(field: str, size: int, limit: int, unit: str, verb: str = "given") -> None:
    """A client's input past its bound (config.py) is refused before any work on it: a 3.5 M-id
    Detokenize built a 168 MB answer, a Tokenize of 16 MiB held the tokenizer for seconds."""
    if size > limit:
        raise InvalidRequest(f"{field}: {size} {unit} {verb}, at most {limit}")


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_chat(messages) -> None:
    """What a chat must be before its template runs; messages: (role, content) pairs."""
    bound("messages", len(messages), config.MAX_CHAT_MESSAGES, "messages")
    if not messages:
        raise InvalidRequest("chat has no messages")
    bad = next((role for role, _ in messages if role not in CHAT_ROLES), None)
    if bad is not None:
        raise InvalidRequest(f"chat message role {excerpt(bad)} is not one of {', '.join(sorted(CHAT_ROLES))}")
    # The rendered prompt is tokenized next: its text is bounded as Tokenize's is.
    bound("messages' content", sum(utf8_len(c) for _, c in messages), config.MAX_TOKENIZE_BYTES, "bytes")


def check_room(n_prompt: int, max_tokens: int, ctx: int) -> None:
    """An explicit max_tokens that cannot fit after the prompt is an error, not a silent cut."""
    if n_prompt + max_tokens > ctx:
        raise InvalidRequest(f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) exceeds the "
                             f"model's context of {ctx}; load it with a larger ctx or ask for fewer tokens")
