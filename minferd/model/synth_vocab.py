"""Vocabularies for synthetic models: tokenizer.* GGUF metadata of an exact size that both
minferd and llama.cpp load, built deterministically in well under a second at 262144 tokens.

Real vocabularies are learned from data; these are built from a short word list and then
systematic letter strings, which is enough for what synthetic models need: every text
round-trips, common words are single tokens, and the markup of each chat template exists.
"""
from __future__ import annotations

import os
from itertools import product
from string import ascii_lowercase, ascii_uppercase

NORMAL, CONTROL, BYTE = 1, 3, 6

# ChatML, llama-3 and gemma markup all exist in every vocab, so any architecture's default
# chat template tokenizes into its control tokens whatever vocab kind it is paired with.
GPT2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                 "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
SPM_SPECIALS = ("<start_of_turn>", "<end_of_turn>")

_WORDS = """the of and to in is that for it as was with be by on not he this are or his from at
which but have an they you were her she there one all we their has been would will if can
more when what so no who out up said about other into than its some time only new could these
two may first then do any like my now over such our man me even most made after also did many
before must through back years where much your way well down should because each just those
people how too little state good very make world still own see men work long get here between
both life being under never day same another know while last might us great old year off come
since against go came right used take three model token text language data code function return
import class def self print value string number list true false none hello world question answer
""".split()


def _bytes_to_unicode() -> list[str]:
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)}
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _grow(tokens: list[str], known: set[str], word: str, on_new) -> None:
    """Add every left-to-right prefix of `word` not yet known (each one a merge of the prefix
    before it and one more character), so the word becomes reachable as one token."""
    prefix = word[0]
    for ch in word[1:]:
        whole = prefix + ch
        if whole not in known:
            known.add(whole)
            tokens.append(whole)
            on_new(prefix, ch)
        prefix = whole


def _fill(n: int, starts: str, alphabet: str, tokens: list[str], known: set[str], on_new) -> None:
    """Systematic strings: start char + letters, level by level, until n tokens exist."""
    level = list(starts)
    while len(tokens) < n:
        nxt = []
        for prefix, ch in product(level, alphabet):
            whole = prefix + ch
            nxt.append(whole)
            if whole not in known:
                known.add(whole)
                tokens.append(whole)
                on_new(prefix, ch)
                if len(tokens) == n:
                    return
        level = nxt


def _gpt2(size: int, arch: str | None) -> dict:
    n_normal = size - len(GPT2_SPECIALS)
    if n_normal < 256:
        raise ValueError(f"a gpt2 vocab needs at least {256 + len(GPT2_SPECIALS)} tokens, not {size}")
    tokens = _bytes_to_unicode()
    known, merges = set(tokens), []
    on_new = lambda a, b: merges.append(f"{a} {b}")  # noqa: E731
    sp, nl = "Ġ", "Ċ"  # byte-level forms of " " and "\n"
    for form in (sp * 2, sp * 4, sp * 8, nl * 2, "ĉĉ",
                 *(f for w in _WORDS for f in (sp + w, w, sp + w.capitalize()))):
        if len(tokens) < n_normal:
            _grow(tokens, known, form, on_new)
    del tokens[n_normal:], merges[n_normal - 256:]
    _fill(n_normal, sp + ascii_lowercase + ascii_uppercase, ascii_lowercase, tokens, known, on_new)
    ids = {t: n_normal + i for i, t in enumerate(GPT2_SPECIALS)}
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens + list(GPT2_SPECIALS),
        "tokenizer.ggml.token_type": [NORMAL] * n_normal + [CONTROL] * len(GPT2_SPECIALS),
        "tokenizer.ggml.merges": merges,
    }
    if arch == "llama":  # llama-3: BOS always, instruct models stop at <|eot_id|>
        md.update({"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": True,
                   "tokenizer.ggml.bos_token_id": ids["<|begin_of_text|>"],
                   "tokenizer.ggml.eos_token_id": ids["<|eot_id|>"]})
    else:  # qwen2/qwen3: no BOS in prompts, <|im_end|> ends a turn
        md.update({"tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.add_bos_token": False,
                   "tokenizer.ggml.bos_token_id": ids["<|endoftext|>"],
                   "tokenizer.ggml.eos_token_id": ids["<|im_end|>"],
                   "tokenizer.ggml.padding_token_id": ids["<|endoftext|>"]})
    if arch == "gpt-oss":  # real gpt-oss files (o200k_harmony) declare this pre-tokenizer
        md["tokenizer.ggml.pre"] = "gpt-4o"
    md["tokenizer.ggml.add_eos_token"] = False
    return md


def _spm(size: int, arch: str | None) -> dict:
    gemma = arch == "gemma3"
    head = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    n_normal = size - len(head) - 256 - len(SPM_SPECIALS)
    singles = ["▁"] + [chr(c) for c in range(0x21, 0x7F)] + list("éèàüöäçñßøåíóúâêô")
    if n_normal < len(singles):
        raise ValueError(f"an SPM vocab needs at least {size - n_normal + len(singles)} tokens, not {size}")
    pieces, known = list(singles), set(singles)
    on_new = lambda a, b: None  # noqa: E731 - SPM needs no merge list, only reachable pieces
    for form in ("▁▁", "▁▁▁▁", *(f for w in _WORDS for f in ("▁" + w, w, "▁" + w.capitalize()))):
        if len(pieces) < n_normal:
            _grow(pieces, known, form, on_new)
    del pieces[n_normal:]
    _fill(n_normal, "▁" + ascii_lowercase + ascii_uppercase, ascii_lowercase, pieces, known, on_new)
    tokens = head + byte_tokens + pieces + list(SPM_SPECIALS)
    # SentencePiece BPE scores: earlier pieces are more frequent, so they merge first.
    scores = [0.0] * (len(head) + 256) + [-float(i) for i in range(n_normal)] + [0.0] * len(SPM_SPECIALS)
    types = [CONTROL] * len(head) + [BYTE] * 256 + [NORMAL] * n_normal + [CONTROL] * len(SPM_SPECIALS)
    ids = {t: i for i, t in enumerate(head)}
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": ids["<bos>" if gemma else "<s>"],
        "tokenizer.ggml.eos_token_id": ids["<eos>" if gemma else "</s>"],
        "tokenizer.ggml.unknown_token_id": ids["<unk>"],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        # gemma's converter turns the SentencePiece space prefix off; llama-2 keeps it
        "tokenizer.ggml.add_space_prefix": not gemma,
    } | ({"tokenizer.ggml.padding_token_id": 0} if gemma else {})


def synth_vocab(kind: str, size: int, arch: str | None = None) -> dict:
    """tokenizer.* metadata for a vocab of exactly `size` tokens.

    kind "gpt2": byte-level BPE with merges (qwen2 style; arch="llama" gives llama-3 style ids
    and pre-tokenizer, arch="gpt-oss" the gpt-4o pre-tokenizer). kind "llama": SentencePiece-style
    pieces with scores and <0xXX> byte fallback (llama-2 style; arch="gemma3" gives gemma's
    special ids and no space prefix).
    """
    if kind == "gpt2":
        return _gpt2(size, arch)
    if kind == "llama":
        return _spm(size, arch)
    raise ValueError(f"unknown vocab kind {kind!r}; one of gpt2, llama")


def write_vocab_gguf(path: str | os.PathLike, arch: str, md: dict) -> None:
    """A GGUF holding only a vocabulary and the few hyperparameters llama.cpp's loader insists
    on: enough for `llama_cpp.Llama(path, vocab_only=True)` and for minferd's tokenizer."""
    from gguf import GGUFWriter

    w = GGUFWriter(os.fspath(path), arch)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    add_metadata(w, {k: v for k, v in md.items() if k != "general.architecture"})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def add_metadata(w, md: dict) -> None:
    """Plain Python values as GGUF metadata: bool, str, float (f32), int (u32), lists as arrays."""
    for k, v in md.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, (list, tuple)):
            w.add_array(k, list(v))
        else:
            raise TypeError(f"metadata {k}: {type(v).__name__}")
