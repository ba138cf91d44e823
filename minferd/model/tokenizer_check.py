"""The tokenizer's metadata checked when a file is opened, without building the tokenizer: a
malformed vocabulary must be a ModelFileError naming the key before any memory is reserved."""
from __future__ import annotations

import re

import numpy as np
from gguf import GGUFValueType

from minferd.errors import ModelFileError
from minferd.model.gguf_file import GGUFFile


_INTS = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
         GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}
_NUMBERS = _INTS | {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}
_BYTE_TOKEN = re.compile(rb"<0x[0-9A-Fa-f]{2}>")


def check_tokenizer(gf: GGUFFile, n_vocab: int) -> None:
    """The tokenizer keys checked at open, without building the tokenizer. The daemon builds it only
    after reserving memory, and a file that failed there (unknown tokenizer.ggml.model, a short
    token_type array, ids past the vocabulary, ...) surfaced as a ValueError or IndexError, that is
    INTERNAL, instead of a ModelFileError naming the file and the key."""
    from minferd.model.tokenizer import check_supported
    from minferd.model.vocab_rules import BYTE

    fields = gf.reader.fields

    def refuse(problem: str):
        raise ModelFileError(gf.path, problem)

    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        if key in fields and fields[key].types != [GGUFValueType.STRING]:
            refuse(f"metadata key {key} has a value of the wrong type: {fields[key].types[0].name}, not a string")
    try:
        check_supported(gf.metadata)
    except ValueError as e:
        refuse(str(e))
    arrays = {"tokenizer.ggml.tokens": ({GGUFValueType.STRING}, "strings"),
              "tokenizer.ggml.merges": ({GGUFValueType.STRING}, "strings"),
              "tokenizer.ggml.token_type": (_INTS, "integers"), "tokenizer.ggml.scores": (_NUMBERS, "numbers")}
    for key, (types, what) in arrays.items():
        f = fields.get(key)
        if f is None:
            if key == "tokenizer.ggml.tokens":
                refuse("metadata has no tokenizer.ggml.tokens (the vocabulary)")
            continue
        if f.types[0] != GGUFValueType.ARRAY or (gf.array_len(key) and f.types[-1] not in types):
            refuse(f"metadata key {key} is {' '.join(t.name for t in f.types)}, not an array of {what}")
        n = gf.array_len(key)
        if key != "tokenizer.ggml.merges" and n != n_vocab:
            refuse(f"metadata key {key} has {n} entries; the vocabulary has {n_vocab} "
                   f"(every id the model can produce needs one)")
    f = fields.get("tokenizer.ggml.token_type")
    if f is not None and n_vocab:
        kinds = np.asarray(f.parts[f.data[0]]) if len(f.data) == 1 else np.asarray(f.contents())
        if kinds.min() < 0 or kinds.max() > BYTE:
            i = int(np.flatnonzero((kinds < 0) | (kinds > BYTE))[0])
            refuse(f"metadata key tokenizer.ggml.token_type: token {i} has type {int(kinds[i])}; types are 0..{BYTE}")
        tokens = fields["tokenizer.ggml.tokens"]
        for i in np.flatnonzero(kinds == BYTE):
            text = bytes(tokens.parts[tokens.data[i]])
            if not _BYTE_TOKEN.fullmatch(text):  # decoding it would fail mid-generation
                refuse(f"metadata key tokenizer.ggml.tokens: byte token {i} is {text[:32]!r}, not <0xHH>")
    for key in ("bos", "eos", "eot", "eom", "unknown", "padding"):
        key = f"tokenizer.ggml.{key}_token_id"
        f = fields.get(key)
        if f is None:
            continue
        if f.types[0] not in _INTS:
            refuse(f"metadata key {key} has a value of the wrong type: {f.types[0].name}")
        if key.endswith(("bos_token_id", "eos_token_id")) and not 0 <= gf.metadata[key] < n_vocab:
            refuse(f"metadata key {key} = {gf.metadata[key]} is outside the vocabulary ({n_vocab} tokens)")
