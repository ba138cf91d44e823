"""Cut a real model down: its first layers and vocabulary, real tensors, real types, real scales.
How real weights reach a machine that only takes small transfers (the GPU box takes 64 MiB):

    minferd synth --from gemma-3-270m.gguf --layers 6 --vocab 32768 OUT.gguf
"""
from __future__ import annotations

import os

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from minferd.errors import InvalidRequest
from minferd.model.gguf_file import GGUFFile

_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")


def cut_model(src: str | os.PathLike, out: str | os.PathLike, layers: int, vocab: int | None = None) -> dict:
    gf = GGUFFile(src)
    arch = gf.architecture
    n_layers = int(gf.metadata[f"{arch}.block_count"])
    n_vocab = gf.array_len("tokenizer.ggml.tokens")
    if not 1 <= layers <= n_layers:
        raise InvalidRequest(f"--layers {layers}: the model has {n_layers}")
    vocab = vocab or n_vocab
    if not 1 <= vocab <= n_vocab:
        raise InvalidRequest(f"--vocab {vocab}: the model has {n_vocab}")
    special = [v for k, v in gf.metadata.items() if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")]
    if any(int(t) >= vocab for t in special):
        raise InvalidRequest(f"--vocab {vocab} would drop a special token (ids {sorted(special)})")

    w = GGUFWriter(os.fspath(out), arch=None)
    for key, f in gf.reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = f.contents()
        if key == f"{arch}.block_count":
            value = layers
        elif key in _VOCAB_ARRAYS:
            value = value[:vocab]
        elif key == "tokenizer.ggml.merges":  # keep merges whose pieces all survive
            kept = set(gf.field("tokenizer.ggml.tokens")[:vocab])
            value = [m for m in value if all(p in kept for p in m.split(" ", 1)) and m.replace(" ", "") in kept]
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=f.types[-1])
        else:
            w.add_key_value(key, value, f.types[0])
    kept = []
    for name, t in gf.tensors.items():
        if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
            continue
        raw = gf.raw(name)
        shape = list(t.shape)
        if name in ("token_embd.weight", "output.weight"):
            raw, shape[1] = raw[:vocab], vocab
        kept.append((name, np.ascontiguousarray(raw).reshape(-1), t.qtype.name, shape))
        w.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32), kept[-1][1].size,
                          raw_dtype=GGMLQuantizationType[t.qtype.name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, data, _, _ in kept:
        w.write_tensor_data(data)
    w.close()
    return {name: qt for name, _, qt, _ in kept}
