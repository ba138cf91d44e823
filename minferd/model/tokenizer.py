"""A GGUF file's own vocabulary as a `tokenizers.Tokenizer`, tokenizing as llama.cpp does.

The contract is llama.cpp's `llama_tokenize(text, add_special, parse_special)`: the same ids
for the same text, so prompts cached, compared or replayed against llama.cpp line up. Where
llama.cpp has quirks (a space prefix before every text fragment, "</s>" ending generation)
they are copied on purpose; the comments name them.
"""
from __future__ import annotations

import codecs
import functools
import hashlib
import re
import threading
from collections import OrderedDict

import numpy as np
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from minferd.errors import InvalidRequest
from minferd.model import chat_template
from minferd.model.vocab_rules import (BYTE, CONTROL, NORMAL, PRE, UNKNOWN, USER_DEFINED,
                                       llama_cpp_overrides)

_SPLIT_OUT = (UNKNOWN, CONTROL, USER_DEFINED)  # llama.cpp cuts these out of text before BPE
_LONG_TEXT = 1 << 14  # characters; longer texts are encoded without holding the GIL
_SURROGATE = re.compile("[\ud800-\udfff]")  # only a Python str can hold one: no UTF-8 encodes it


_KEYS = (
    "general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template")


def read_tokenizer_metadata(reader) -> dict:
    """The tokenizer keys as plain Python values (~0.2 s for 262k tokens), from an open
    gguf.GGUFReader or anything with a `field(key)` method (minferd.model.gguf_file.GGUFFile)."""
    if hasattr(reader, "fields"):
        fields = reader.fields
        get = lambda key: fields[key].contents() if key in fields else None  # noqa: E731
    else:
        get = reader.field
    md = {}
    for key in _KEYS:
        value = get(key)
        if value is not None:
            md[key] = value
    return md


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, the alphabet of byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _spm_merges(tokens: list[str], vocab: dict[str, int], scores) -> list[tuple[str, str]]:
    """llama.cpp's SPM tokenizer joins the adjacent pair whose concatenation is the best-scoring
    token. As BPE: every split of every token into two tokens is a merge, ranked by the score of
    the whole (the transformers SentencePieceExtractor does the same)."""
    cands = []
    live = [i for i, t in enumerate(tokens) if len(t) > 1]
    k = 1
    while live:  # one pass per split position keeps the loops in comprehensions (~2 M splits)
        hits = [i for i in live if tokens[i][:k] in vocab and tokens[i][k:] in vocab]
        cands.extend((-scores[i], i, k) for i in hits)
        k += 1
        live = [i for i in live if len(tokens[i]) > k]
    cands.sort()
    return [(tokens[i][:k], tokens[i][k:]) for _, i, k in cands]


def _build_hf(md: dict, tokens: list[str], vocab: dict[str, int], types: np.ndarray, spm: bool,
              add_space_prefix: bool) -> HFTokenizer:
    if spm:
        scores = np.asarray(md.get("tokenizer.ggml.scores", np.zeros(len(tokens))), dtype=np.float64)
        model = models.BPE(vocab=vocab, merges=_spm_merges(tokens, vocab, scores.tolist()),
                           unk_token="<unk>" if "<unk>" in vocab else None,
                           byte_fallback=True, fuse_unk=False)
        hf = HFTokenizer(model)
        # Added tokens are cut out first, then each remaining fragment is normalized on its own:
        # exactly llama.cpp's " " prefix on every raw fragment when add_space_prefix.
        steps = [normalizers.Prepend(" ")] if add_space_prefix else []
        hf.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    else:
        pre = md.get("tokenizer.ggml.pre") or "default"
        if pre not in PRE:
            raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r}; supported: {sorted(PRE)}")
        regexes, ignore_merges, _ = PRE[pre]
        merges = []
        for m in md.get("tokenizer.ggml.merges", ()):
            cut = m.find(" ", 1)  # llama.cpp splits at the first space after the first character
            a, b = m[:cut], m[cut + 1:]
            if cut > 0 and a in vocab and b in vocab and a + b in vocab:
                merges.append((a, b))
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.add_tokens([AddedToken(tokens[i], special=bool(types[i] != USER_DEFINED), normalized=False)
                   for i in np.flatnonzero(np.isin(types, _SPLIT_OUT))])
    return hf


def check_supported(md: dict) -> None:
    """ValueError for a tokenizer type this module cannot build. Cheap (two small keys): the loader
    calls it at open, so such a file is refused as a ModelFileError before anything is reserved."""
    model = md.get("tokenizer.ggml.model", "llama")
    if model not in ("llama", "gpt2"):
        raise ValueError(f"unsupported tokenizer.ggml.model {model!r}; supported: llama, gpt2")
    pre = md.get("tokenizer.ggml.pre") or "default"
    if model == "gpt2" and pre not in PRE:
        raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r}; supported: {sorted(PRE)}")


def metadata_digest(md: dict) -> str:
    """A digest of every tokenizer key and value (reprs are unambiguous; arrays by their bytes)."""
    h = hashlib.sha256()
    for k in sorted(md):
        v = md[k]
        h.update(repr(k).encode())
        if isinstance(v, np.ndarray):
            h.update(f"{v.dtype}{v.shape}".encode() + v.tobytes())
        else:
            h.update(repr(v).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


BUILT_KEPT = 2  # tokenizers kept for reuse past their models (a 262k vocabulary's holds ~130 MB)
_built: OrderedDict = OrderedDict()  # metadata digest -> Tokenizer, least recently used first
_built_lock = threading.Lock()


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template. Thread-safe."""

    def __init__(self, md: dict):
        check_supported(md)
        model = md.get("tokenizer.ggml.model", "llama")
        self.spm = model == "llama"
        self.architecture = md.get("general.architecture", "")
        # llama.cpp renames empty entries the same way, so that every text maps to one id
        self._tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(md["tokenizer.ggml.tokens"])]
        n = len(self._tokens)
        types = md.get("tokenizer.ggml.token_type")
        self._types = np.asarray(types if types is not None else np.full(n, NORMAL), dtype=np.int8)
        pre = md.get("tokenizer.ggml.pre") or "default"
        # Defaults as llama_vocab::load has them before the file's keys override them.
        self.bos_id = int(md.get("tokenizer.ggml.bos_token_id", 1 if self.spm else 11))
        self.eos_id = int(md.get("tokenizer.ggml.eos_token_id", 2 if self.spm else 11))
        self.add_bos = bool(md.get("tokenizer.ggml.add_bos_token",
                                   self.spm or PRE.get(pre, (0, 0, False))[2]))
        self.add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False))
        self.add_space_prefix = self.spm and bool(md.get("tokenizer.ggml.add_space_prefix", True))
        vocab = {t: i for i, t in enumerate(self._tokens)}
        eog = llama_cpp_overrides(vocab, self._types, {self.eos_id} | {int(md[k]) for k in (
            "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in md})
        self.eog_ids = frozenset(i for i in eog if 0 <= i < n)
        self._hf = _build_hf(md, self._tokens, vocab, self._types, self.spm, self.add_space_prefix)
        self._lock = threading.Lock()
        self._raw_specials = False
        self._pieces: dict[int, bytes] = {}
        self._template = md.get("tokenizer.chat_template")

    @classmethod
    def from_metadata(cls, md: dict) -> "Tokenizer":
        """The tokenizer these keys describe; one built for the same keys before (a model loaded
        again after an eviction, a second file of the same family) is reused: a 262k-token SPM
        vocabulary takes 1.6-3.3 s to build, its digest ~0.1 s. Safe to share: thread-safe."""
        key = metadata_digest(md)
        with _built_lock:
            tok = _built.get(key)
            if tok is not None:
                _built.move_to_end(key)
                return tok
        tok = cls(md)
        with _built_lock:
            _built[key] = tok
            while len(_built) > BUILT_KEPT:
                _built.popitem(last=False)
        return tok

    @classmethod
    def from_reader(cls, reader) -> "Tokenizer":
        return cls(read_tokenizer_metadata(reader))

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as stored in the file (byte-level or '▁' form)."""
        return self._tokens[token_id]

    def is_control(self, token_id: int) -> bool:
        """Control/unknown tokens: markup the model reads, not text a user should see."""
        return int(self._types[token_id]) in (CONTROL, UNKNOWN)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        if (bad := _SURROGATE.search(text)) is not None:  # the Rust tokenizer takes only valid UTF-8
            raise InvalidRequest(f"text holds a lone surrogate (U+{ord(bad.group()):04X}) at {bad.start()}: "
                                 f"not valid Unicode")
        with self._lock:
            # encode_special_tokens=True makes HF treat control tokens as plain text; user-defined
            # tokens stay cut out either way, as in llama.cpp.
            if self._raw_specials != (not parse_special):
                self._raw_specials = not parse_special
                self._hf.encode_special_tokens = self._raw_specials
            if len(text) > _LONG_TEXT:
                # encode() holds the GIL throughout (a 16 MiB prompt froze every thread of the
                # daemon, status included, for ~20 s); encode_batch releases it, same ids.
                ids = self._hf.encode_batch([text], add_special_tokens=False)[0].ids
            else:
                ids = self._hf.encode(text, add_special_tokens=False).ids if text else []
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    @functools.cached_property
    def max_piece_bytes(self) -> int:
        """The most bytes of text one token can stand for (its piece or its stored entry, whichever
        is longer), so a text of n bytes needs at least n / max_piece_bytes tokens: the server
        refuses a prompt that cannot fit the context without tokenizing it."""
        return max((max(len(self._piece(i)), len(t.encode())) for i, t in enumerate(self._tokens)), default=1)

    @functools.cached_property
    def _piece_bytes(self) -> np.ndarray:
        # _piece, not token_piece: this must not fill the piece cache with the whole vocabulary
        return np.fromiter((len(self._piece(i)) for i in range(self.vocab_size)), np.int64, self.vocab_size)

    def decoded_bytes(self, ids) -> int:
        """A bound on the bytes decode(ids) builds (it only ever takes spaces off), counted without
        building them: the server refuses an answer past its limit before decoding. Ids in range."""
        return int(self._piece_bytes[np.asarray(ids, dtype=np.int64)].sum()) if len(ids) else 0

    def token_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for; a byte-fallback token is one byte of a UTF-8 sequence.
        special=False renders control tokens as nothing, like llama_token_to_piece."""
        if not special and self.is_control(token_id):
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def _piece(self, token_id: int) -> bytes:
        text, kind = self._tokens[token_id], int(self._types[token_id])
        if kind in _SPLIT_OUT:
            return text.encode()
        if kind == BYTE:
            return bytes([int(text[3:5], 16)])
        if kind != NORMAL:
            return b""  # unused/undefined tokens print nothing, as in llama.cpp
        if self.spm:
            return text.replace("▁", " ").encode()
        return bytes(_UNICODE_TO_BYTE.get(c, 0x3F) for c in text)

    def decode(self, ids, skip_special: bool = False) -> str:
        """Inverse of encode: with add_space_prefix, the space that encode put before each text
        fragment (at the start, after each special token) is taken off again."""
        out = bytearray()
        strip = self.add_space_prefix
        for i in ids:
            i = int(i)
            if int(self._types[i]) in _SPLIT_OUT:
                out += self.token_piece(i, special=not skip_special)
                strip = self.add_space_prefix
                continue
            piece = self.token_piece(i)
            out += piece[1:] if strip and piece[:1] == b" " else piece
            strip = False
        return out.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    @functools.cached_property
    def _chat_source(self) -> str:
        """The file's chat template, or the architecture's default where it carries none."""
        return self._template or chat_template.default_template(
            self.architecture, lambda t: self._hf.token_to_id(t) is not None)

    @property
    def has_chat_template(self) -> bool:
        """Whether the file carries its own template (else Chat renders the architecture's default)."""
        return bool(self._template)

    def check_chat_template(self) -> str | None:
        """None when the model's chat template compiles, else its problem in one line, with the line
        number. Cheap (one compile, cached); host.load calls it so that a bad template shows when the
        model loads. The model still loads and generates: Chat on it answers FAILEDPRECONDITION."""
        return chat_template.check(self._chat_source)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The conversation as prompt text, to be encoded with add_special=True (which adds BOS)."""
        bos = self._tokens[self.bos_id] if 0 <= self.bos_id < self.vocab_size else ""
        eos = self._tokens[self.eos_id] if 0 <= self.eos_id < self.vocab_size else ""
        if not self._template:
            messages = chat_template.plain_messages(messages)
        text = chat_template.render(self._chat_source, messages, add_generation_prompt,
                                    bos_token=bos, eos_token=eos, **kwargs)
        # Templates that print bos_token themselves would double it once encode adds BOS;
        # llama.cpp's common_chat code strips it the same way.
        if self.add_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        return text


class StreamDecoder:
    """Turns generated ids into text as they come: UTF-8 split across byte tokens is held back
    until complete; the leading space of the first piece is kept (it is generated text)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._special = not skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.token_piece(int(token_id), special=self._special))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)

