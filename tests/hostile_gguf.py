"""A corpus of hostile GGUF files derived from a valid one, each with the words its refusal must say.

`make_corpus(good, out_dir)` parses the good file into a raw, byte-exact form (tests/gguf_raw.py),
edits that form (or the bytes themselves) and writes each bad variant to out_dir.

Each entry is (path, expected_words): the ModelFileError for that file must contain every word.
"""
from __future__ import annotations

import math
import struct
from dataclasses import replace
from pathlib import Path

from tests.gguf_raw import (ARR, F32, I32, KV, STR, SUPPORTED_TYPE_IDS, TB, U32, U64, RawGGUF, enc, enc_array,
                            enc_str, ggml_type_bytes, parse)


# ---- the corpus --------------------------------------------------------------------------------
def make_corpus(good_path, out_dir) -> list[tuple[Path, tuple[str, ...]]]:
    """Write the hostile variants of `good_path` into out_dir; [(path, words the refusal must contain)]."""
    good = Path(good_path).read_bytes()
    raw, lay = parse(good)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arch = raw.kv_value("general.architecture")
    a = arch + "."
    names = [t.name.decode() for t in raw.infos]
    # a matmul tensor and a vector tensor every architecture has
    mat, vec = "blk.0.attn_q.weight", "blk.0.attn_norm.weight"
    entries: list[tuple[Path, tuple[str, ...]]] = []

    def add(label: str, blob: bytes | RawGGUF, *words: str) -> None:
        p = out / f"{len(entries):03d}-{label}.gguf"
        p.write_bytes(blob.to_bytes() if isinstance(blob, RawGGUF) else blob)
        entries.append((p, words))

    def patch(at: int, fmt: str, *values) -> bytes:
        b = bytearray(good)
        struct.pack_into(fmt, b, at, *values)
        return bytes(b)

    # -- truncated anywhere: the header, the metadata, the tensor infos, the data -------------
    for n in (0, 3, 10, 23):
        add(f"trunc-header-{n}", good[:n], "truncated header")
    for n in (24, 200):  # the counts alone claim more than the bytes left
        add(f"trunc-counts-{n}", good[:n], "header claims", "truncated")
    tokens_at = lay.kv_value_at["tokenizer.ggml.tokens"]
    for label, n in (("in-a-key", lay.kv_starts[-3] + 10), ("in-tokens", tokens_at + 5000),
                     ("in-last-kv", lay.kv_starts[-1] + 12)):
        words = ("claims", "more than the file can hold") if label == "in-tokens" else ("past the end",)
        add(f"trunc-metadata-{label}", good[:n], *words)
    for label, n in (("info-name", lay.info_starts[len(names) // 2] + 12),
                     ("info-dims", lay.info_starts[-1] + 8 + len(raw.infos[-1].name) + 6)):
        add(f"trunc-tensor-infos-{label}", good[:n], "past the end")

    def first_cut(size: int) -> str:  # the first tensor (in info order) the cut file cannot hold
        for t in raw.infos:
            if lay.data_offset + t.offset + ggml_type_bytes(t.ttype, t.dims) > size:
                return t.name.decode()
        raise AssertionError("the cut leaves every tensor whole")

    for label, n in (("at-data-start", lay.data_offset), ("mid-data", (lay.data_offset + len(good)) // 2),
                     ("last-byte", len(good) - 1)):
        add(f"trunc-data-{label}", good[:n], "truncated tensor data", first_cut(n))

    # -- bad magic, bad or unsupported versions ----------------------------------------------
    for magic in (b"GGML", b"\0\0\0\0", b"FUGG"):
        add(f"magic-{magic.hex()}", magic + good[4:], "bad magic", "not a GGUF file")
    for v in (0, 1, 4, 99, 0x03000000):  # the last one: version 3 written big-endian
        add(f"version-{v}", patch(4, "<I", v), f"version {v}", "not supported")

    # -- absurd counts --------------------------------------------------------------------------
    add("tensor-count-2^60", replace(raw, n_tensors=1 << 60), "header claims", "tensors")
    add("kv-count-2^63", replace(raw, n_kv=(1 << 64) - 1), "header claims", "metadata keys")
    # one more tensor than the infos hold: the "info" read is the data section's float bytes
    add("tensor-count-plus-one", replace(raw, n_tensors=len(raw.infos) + 1), "malformed GGUF")

    # -- tensor infos: dimensions, offsets, overlaps, alignment, names, types -----------------
    add("n-dims-0", raw.with_tensor(mat, dims=[]), mat, "absurd shape []")
    add("n-dims-5", raw.with_tensor(mat, dims=raw.infos[raw.tensor_index(mat)].dims + [1, 1, 1]), mat, "absurd shape")
    add("n-dims-2^31", raw.with_tensor(mat, n_dims=1 << 31), "malformed GGUF", "past the end")
    add("dim-zero", raw.with_tensor(mat, dims=[256, 0]), mat, "absurd shape")
    add("dim-2^64-1", raw.with_tensor(mat, dims=[256, (1 << 64) - 1]), mat, "absurd shape")
    # 256 x 2^36 Q4_0 elements: 9 TiB of data promised by a 1 MB file
    add("dims-terabytes", raw.with_tensor(mat, dims=[256, 1 << 36]), mat, "runs past the end", "bytes")
    add("dims-many-terabytes", raw.with_tensor(mat, dims=[1 << 40, 1 << 40]), mat, "runs past the end")
    add("row-not-whole-blocks", raw.with_tensor(mat, dims=[250, 256]), mat, "not a multiple")
    add("offset-past-end", raw.with_tensor(mat, offset=1 << 62), mat, "runs past the end")
    add("offset-just-past-end", raw.with_tensor(names[-1], offset=len(raw.data)), names[-1], "runs past the end")
    t0, t1 = raw.infos[raw.tensor_index(mat)], raw.infos[raw.tensor_index(mat) + 1]
    add("overlap-same-offset", raw.with_tensor(t1.name.decode(), offset=t0.offset), "overlap",
        mat, t1.name.decode())
    add("overlap-partial", raw.with_tensor(t1.name.decode(), offset=t1.offset - raw.alignment), "overlap")
    add("misaligned-offset", raw.with_tensor(mat, offset=t0.offset + 1), mat, "not aligned")
    add("duplicate-tensor-name", raw.with_tensor(t1.name.decode(), name=mat.encode()), mat, "duplicate tensor name")
    add("tensor-name-invalid-utf8", raw.with_tensor(mat, name=b"blk.0.\xff\xfe"), "malformed GGUF", "utf-8")
    name_len_at = lay.info_starts[0]
    add("tensor-name-length-huge", patch(name_len_at, "<Q", 1 << 62), "malformed GGUF", "past the end")
    add("tensor-name-length-past-end", patch(name_len_at, "<Q", len(good) - name_len_at - 4),
        "malformed GGUF", "past the end")
    for tid in [*range(15, 51), 9999, (1 << 32) - 1]:
        if tid not in SUPPORTED_TYPE_IDS:
            add(f"tensor-type-{tid}", raw.with_tensor(mat, ttype=tid), mat, "unsupported tensor type", str(tid))
    # a supported type where it does not belong: a norm vector quantized
    add("vector-quantized", raw.with_tensor(vec, ttype=8, dims=[256]), vec, "Q8_0", "may be one of")
    # the wrong shapes for what the metadata says
    add("shape-swapped", raw.with_tensor("blk.0.attn_k.weight", dims=[128, 256]), "blk.0.attn_k.weight",
        "shape [128, 256]", "expected [256, 128]")
    add("shape-embd-rows", raw.with_tensor("token_embd.weight", dims=[256, 512]), "token_embd.weight",
        "shape [256, 512]")
    add("shape-norm", raw.with_tensor("output_norm.weight", dims=[128]), "output_norm.weight", "expected [256]")
    add("missing-tensor", replace(raw, infos=[t for t in raw.infos if t.name != b"blk.1.ffn_down.weight"]),
        "blk.1.ffn_down.weight", "missing")

    # -- metadata: string lengths, duplicates, unknown types, huge arrays ----------------------
    arch_at = lay.kv_value_at["general.architecture"]
    add("string-length-huge", patch(arch_at, "<Q", 1 << 62), "malformed GGUF", "past the end")
    add("string-length-past-end", patch(arch_at, "<Q", len(good) - arch_at - 8 + 1), "malformed GGUF", "past the end")
    add("key-length-huge", patch(lay.kv_starts[0], "<Q", 1 << 50), "malformed GGUF", "past the end")
    add("key-invalid-utf8", replace(raw, kvs=[KV(b"general.\xc3\x28", STR, enc_str("x")), *raw.kvs]),
        "malformed GGUF", "utf-8")
    # a token string whose length runs past the end of the file, inside the vocabulary array
    add("token-length-past-end", patch(tokens_at + 12 + 8 * 3 + 3, "<Q", len(good)),
        "malformed GGUF", "string", "past the end")
    add("duplicate-key", replace(raw, kvs=[*raw.kvs, raw.kvs[raw.kv_index(a + "block_count")]]),
        "malformed GGUF", "Duplicate", a + "block_count")
    add("duplicate-key-arch", replace(raw, kvs=[*raw.kvs, KV(b"general.architecture", STR, enc_str("llama"))]),
        "Duplicate", "general.architecture")
    for vt in (13, 99, (1 << 32) - 1):
        add(f"value-type-{vt}", raw.with_kv("general.name", vt, b"\0" * 8), "malformed GGUF", str(vt))
    add("array-of-type-99", raw.with_kv("general.tags", ARR, struct.pack("<IQ", 99, 1) + b"\0" * 8),
        "malformed GGUF", "99")
    add("array-of-arrays", raw.with_kv("general.tags", ARR, struct.pack("<IQ", ARR, 1) + enc_array(U32, [1])),
        "malformed GGUF", "ARRAY")
    add("tokens-2^40", patch(tokens_at + 4, "<Q", TB), "malformed GGUF", "claims 1099511627776 items")
    add("token-type-2^62", raw.with_kv("tokenizer.ggml.token_type", ARR, struct.pack("<IQ", I32, 1 << 62)),
        "malformed GGUF", "claims")
    add("merges-2^40", patch(lay.kv_value_at["tokenizer.ggml.merges"] + 4, "<Q", TB), "malformed GGUF", "claims")
    add("alignment-zero", raw.with_kv("general.alignment", U32, enc(U32, 0)), "malformed GGUF", "alignment")
    add("alignment-string", raw.with_kv("general.alignment", STR, enc_str("32")), "malformed GGUF", "alignment")

    # -- metadata of the wrong type -------------------------------------------------------------
    add("block-count-string", raw.with_kv(a + "block_count", STR, enc_str("2")), a + "block_count", "wrong type")
    add("head-count-float", raw.with_kv(a + "attention.head_count", F32, enc(F32, 4.5)),
        a + "attention.head_count", "wrong type")
    add("head-count-array", raw.with_kv(a + "attention.head_count", ARR, enc_array(U32, [4, 4])),
        a + "attention.head_count", "wrong type")
    # (an array past 64 items is not read at open, so to the loader the number is missing)
    add("head-count-big-array", raw.with_kv(a + "attention.head_count", ARR, enc_array(U32, [4] * 100)),
        a + "attention.head_count")
    # 2 M distinct numbers under a key nobody reads: as a Python list that was ~70 MB at open
    junk = struct.pack("<IQ", I32, 1 << 21) + bytes(range(256)) * (4 * (1 << 21) // 256)
    add("huge-unread-array", raw.with_kv("general.junk", ARR, junk).with_kv(a + "block_count", STR, enc_str("x")),
        a + "block_count", "wrong type")
    add("embedding-length-nan", raw.with_kv(a + "embedding_length", F32, enc(F32, math.nan)),
        a + "embedding_length", "wrong type")
    add("context-length-string", raw.with_kv(a + "context_length", STR, enc_str("2048")),
        a + "context_length", "wrong type")
    add("architecture-number", raw.with_kv("general.architecture", U32, enc(U32, 7)), "unknown architecture 7")
    add("architecture-unknown", raw.with_kv("general.architecture", STR, enc_str("mamba")),
        "unknown architecture 'mamba'", "supported")
    add("vocab-size-string", raw.with_kv(a + "vocab_size", STR, enc_str("lots")), a + "vocab_size", "wrong type")
    add("eps-string", raw.with_kv(a + "attention.layer_norm_rms_epsilon", STR, enc_str("1e-6")),
        "layer_norm_rms_epsilon", "wrong type")
    add("tokens-of-numbers", raw.with_kv("tokenizer.ggml.tokens", ARR, enc_array(U32, list(range(1024)))),
        "tokenizer.ggml.tokens", "array of strings")
    add("tokenizer-model-number", raw.with_kv("tokenizer.ggml.model", U32, enc(U32, 1)),
        "tokenizer.ggml.model", "wrong type")
    add("bos-id-string", raw.with_kv("tokenizer.ggml.bos_token_id", STR, enc_str("1")),
        "tokenizer.ggml.bos_token_id", "wrong type")

    # -- missing or absurd hyperparameters --------------------------------------------------------
    for key in ("general.architecture", a + "embedding_length", a + "block_count", a + "attention.head_count",
                a + "feed_forward_length"):
        add(f"missing-{key}", raw.without_kv(key), key if key != "general.architecture" else "architecture")
    add("missing-vocab", raw.without_kv("tokenizer.ggml.tokens"), "vocabulary size unknown")
    add("zero-heads", raw.with_kv(a + "attention.head_count", U32, enc(U32, 0)),
        a + "attention.head_count", "outside")
    add("zero-kv-heads", raw.with_kv(a + "attention.head_count_kv", U32, enc(U32, 0)),
        a + "attention.head_count_kv", "outside")
    add("heads-not-multiple-of-kv", raw.with_kv(a + "attention.head_count_kv", U32, enc(U32, 3)),
        "head_count 4", "not a multiple of head_count_kv 3")
    add("block-count-2^30", raw.with_kv(a + "block_count", U32, enc(U32, 1 << 30)), a + "block_count", "outside")
    add("block-count-zero", raw.with_kv(a + "block_count", U32, enc(U32, 0)), a + "block_count", "outside")
    add("embedding-length-2^31", raw.with_kv(a + "embedding_length", U32, enc(U32, 1 << 31)),
        a + "embedding_length", "outside")
    add("context-length-2^40", raw.with_kv(a + "context_length", U64, enc(U64, TB)), a + "context_length", "outside")
    add("ffn-negative", raw.with_kv(a + "feed_forward_length", I32, enc(I32, -1)), a + "feed_forward_length",
        "outside")
    add("head-dim-odd", raw.with_kv(a + "attention.key_length", U32, enc(U32, 63)), "head dimension 63 is odd")
    add("rope-base-negative", raw.with_kv(a + "rope.freq_base", F32, enc(F32, -1.0)), "rope.freq_base")
    add("rope-base-inf", raw.with_kv(a + "rope.freq_base", F32, enc(F32, math.inf)), "rope.freq_base")
    add("rope-scaling-factor-zero", raw.with_kv(a + "rope.scaling.type", STR, enc_str("linear"))
        .with_kv(a + "rope.scaling.factor", F32, enc(F32, 0.0)), "rope.scaling.factor")
    add("rope-scaling-unknown", raw.with_kv(a + "rope.scaling.type", STR, enc_str("yarn")),
        "rope scaling 'yarn'", "not supported")
    add("eps-nan", raw.with_kv(a + "attention.layer_norm_rms_epsilon", F32, enc(F32, math.nan)),
        "layer_norm_rms_epsilon")
    add("vocab-size-mismatch", raw.with_kv(a + "vocab_size", U32, enc(U32, 512)), "512", "1024")
    # gemma3's sliding window pattern, reached by relabelling this model's hyperparameters
    g = replace(raw, kvs=[KV(kv.key.replace(a.encode(), b"gemma3.", 1), kv.vtype, kv.value) for kv in raw.kvs])
    g = g.with_kv("general.architecture", STR, enc_str("gemma3")) \
         .with_kv("gemma3.attention.sliding_window", U32, enc(U32, 16))
    add("swa-pattern-zero", g.with_kv("gemma3.attention.sliding_window_pattern", U32, enc(U32, 0)),
        "sliding_window_pattern")
    add("swa-window-negative", g.with_kv("gemma3.attention.sliding_window", I32, enc(I32, -5)),
        "sliding_window", "outside")

    # -- the tokenizer ------------------------------------------------------------------------------
    add("tokenizer-model-unknown", raw.with_kv("tokenizer.ggml.model", STR, enc_str("bert")),
        "tokenizer.ggml.model 'bert'", "supported")
    add("tokenizer-pre-unknown", raw.with_kv("tokenizer.ggml.model", STR, enc_str("gpt2"))
        .with_kv("tokenizer.ggml.pre", STR, enc_str("no-such-pre")), "tokenizer.ggml.pre 'no-such-pre'")
    add("token-type-short", raw.with_kv("tokenizer.ggml.token_type", ARR, enc_array(I32, [1] * 10)),
        "tokenizer.ggml.token_type", "10", "1024")
    add("scores-short", raw.with_kv("tokenizer.ggml.scores", ARR, enc_array(F32, [0.0] * 3)),
        "tokenizer.ggml.scores", "3", "1024")
    add("bos-id-out-of-range", raw.with_kv("tokenizer.ggml.bos_token_id", U32, enc(U32, 1 << 20)),
        "tokenizer.ggml.bos_token_id", str(1 << 20))
    add("eos-id-out-of-range", raw.with_kv("tokenizer.ggml.eos_token_id", U32, enc(U32, 1024)),
        "tokenizer.ggml.eos_token_id", "1024")
    add("merges-of-numbers", raw.with_kv("tokenizer.ggml.merges", ARR, enc_array(U32, [1, 2, 3])),
        "tokenizer.ggml.merges", "array of strings")
    # a token that is not UTF-8: only reading the vocabulary (the tokenizer) finds it
    tok_bytes = bytearray(raw.kvs[raw.kv_index("tokenizer.ggml.tokens")].value)
    first_len = struct.unpack_from("<Q", tok_bytes, 12)[0]
    assert first_len >= 1
    tok_bytes[20] = 0xFF
    add("token-invalid-utf8", raw.with_kv("tokenizer.ggml.tokens", ARR, bytes(tok_bytes)),
        "tokenizer.ggml.tokens", "utf-8")
    return entries
