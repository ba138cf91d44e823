"""minferd's tokenizer against llama.cpp's (through llama-cpp-python, vocab only): the same ids
for the same text, the same piece bytes per token, the same end-of-generation set."""
from __future__ import annotations

import ctypes
import random

import pytest

from minferd.model.synth_vocab import _bytes_to_unicode, synth_vocab, write_vocab_gguf
from minferd.model.tokenizer import Tokenizer, read_tokenizer_metadata

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.oracle

PROMPTS = [
    "Hello world",
    " Hello",
    "  Hello  world  ",
    "\n\n\nfoo\n",
    "\t\tdef f(x):\n\t\treturn x**2  # square",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "The year 2024 had 366 days; π≈3.14159, e=2.71828.",
    "1234567890 12345 1,000,000.00 0x1F -7",
    "it's don't I'll we've THEY'RE",
    "日本語のテキストです。中文文本。",
    "Привет, мир! Grüße aus Köln, naïve café",
    "🦙🔥👍🏽 emoji ZWJ 👨‍👩‍👧 flag 🇫🇷",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<bos>x</s>y<s>z <table><tr><td>1</td></tr></table>",
    " " * 40 + "x" + "\n" * 40 + "\t" * 5,
    "  \n  \n\r\n\r\nwindows",
    "a\u00a0b\u2003c\u200bd",
    "<<start_of_turn>> <start_of_turn",
    "ÿþ\x00\x01 control \x1b[0m",
    "𝕳𝖊𝖑𝖑𝖔 Ω≈ç√∫˜µ≤≥÷",
    "x" * 300,
    "",
    " ",
]
_ALPHABET = (list("abcXYZ019  \n\t\r.,;:!?'\"()<>/\\|_-+=*&$#@~`") + list("éüßñ日本語Ωπ√–…“’€")
             + ["🦙", "👍🏽", "\u00a0", "\u0301", "'s", "'LL", "<start_of_turn>", "<end_of_turn>",
                "<|im_start|>", "<|im_end|>", "<|eot_id|>", "</s>", "<s>", "<bos>", "  ", "\n\n",
                "<0x41>", "▁", "Ġ"])
FUZZ = ["".join(random.Random(i).choices(_ALPHABET, k=random.Random(-i).randint(1, 50)))
        for i in range(300)]
# What gpt-4o's pre-tokenizer does apart from qwen2's: words split at a lower-to-upper change
# ("HelloWorld"), contractions kept on the word whatever its case ("DON'T"), digits in threes,
# non-ASCII letters of either case; and its "[\r\n/]*" after punctuation ("a/b//c", ".\n"), though
# "/" is punctuation already, so that changes no split.
_CASE_ALPHABET = ["Hello", "World", "HelloWorld", "ABCdef", "ABC", "abcDEF", "XMLHttp", "DON'T", "don't",
                  "Don'T", "'S", "'ll", "'VE", "I'M", "'", "1", "12", "123", "4567", "1234567890", "/",
                  "//", "a/b//c", ".", "?/", ",", "\n", "\r\n", "\n\n", " ", "  ", "\t", "É", "é", "Ω",
                  "ω", "ǅ", "ʰ", "\u0301", "x", "Q", "_", "-", "日本", "½", "\u00a0", "<|im_end|>"]
CASE_FUZZ = ["HelloWorld ABCdef camelCaseName XMLHttpRequest getHTTPResponse iPhone",
             "DON'T Don't don'T I'M YOU'LL We'VE it'S ABC's",
             "12345678 1234567890 1,234,567 3.14159 v2.0.10 2024-01-01",
             "a/b//c ./x/ ?/ http://example.com/path//to/ ,/\n\n.\n\r\n!!\n",
             "ÉCOLE École éCOLE ΩMEGA Ωmega naïve NAÏVE e\u0301E\u0301"]
CASE_FUZZ += ["".join(random.Random(i).choices(_CASE_ALPHABET, k=random.Random(-i).randint(1, 30)))
              for i in range(1000, 1150)]

# name -> (vocab kind, size, arch for synth_vocab, general.architecture, tokenizer.ggml.pre override)
SYNTH = {
    "qwen2": ("gpt2", 151936, None, "qwen2", None),
    "llama3": ("gpt2", 128256, "llama", "llama", None),
    "gpt2-default-pre": ("gpt2", 4096, None, "qwen2", "default"),
    "gpt2-gpt-2-pre": ("gpt2", 4096, None, "qwen2", "gpt-2"),
    # the gpt-oss tiny preset's vocab (pre "gpt-4o"); general.architecture qwen2, since llama.cpp
    # wants gpt-oss's MoE hyperparameters before it reads a vocab. BOUNDARY_TOKENS, not its size,
    # is what tells pre-tokenizers apart (201088 tokens find the same mismatches, 3 s slower).
    "gpt-4o": ("gpt2", 1024, "gpt-oss", "qwen2", None),
    "llama2-spm": ("llama", 32000, None, "llama", None),
    "gemma3-spm": ("llama", 262144, "gemma3", "gemma3", None),
}

# Tokens across the places where a pre-tokenizer splits or not, their merges ranked first: the
# synthetic vocab alone tokenizes "HelloWorld" the same whether or not it is split at the "W".
# These tell gpt-4o apart from qwen2 (lower-to-upper, "DON'T", digits in threes), from \p{N}+ and
# gpt-2 (" 1"), and llama.cpp's rewrite from tiktoken's own regex (a non-ASCII letter after a
# lowercase one stays in the word, a combining mark does not).
BOUNDARY_TOKENS = {"gpt-4o": ("oW", "iP", "tH", "eC", "N'", "n'", "12", "23", "34", " 1", "aÉ", "ωΩ",
                             "e\u0301")}


def _with_boundary_tokens(md: dict, texts) -> dict:
    b2u = _bytes_to_unicode()
    tokens, merges = list(md["tokenizer.ggml.tokens"]), []
    known = set(tokens)
    for text in texts:
        word = "".join(b2u[b] for b in text.encode())
        for i in range(2, len(word) + 1):
            if word[:i] not in known:
                known.add(word[:i])
                tokens.append(word[:i])
                merges.append(f"{word[:i - 1]} {word[i - 1]}")
    types = list(md["tokenizer.ggml.token_type"]) + [1] * (len(tokens) - len(md["tokenizer.ggml.tokens"]))
    return md | {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                 "tokenizer.ggml.merges": merges + list(md["tokenizer.ggml.merges"])}


def _load(path) -> "llama_cpp.Llama":
    return llama_cpp.Llama(str(path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def gemma_pair(gemma_path):
    from minferd.model.gguf_file import GGUFFile

    return _load(gemma_path), Tokenizer.from_metadata(read_tokenizer_metadata(GGUFFile(gemma_path)))


@pytest.fixture(scope="module", params=list(SYNTH))
def synth_pair(request, tmp_path_factory):
    kind, size, arch, general_arch, pre = SYNTH[request.param]
    md = synth_vocab(kind, size, arch) | {"general.architecture": general_arch}
    if pre:
        md["tokenizer.ggml.pre"] = pre
    if request.param in BOUNDARY_TOKENS:
        md = _with_boundary_tokens(md, BOUNDARY_TOKENS[request.param])
    path = tmp_path_factory.mktemp("vocab") / f"{request.param}.gguf"
    write_vocab_gguf(path, general_arch, md)
    return _load(path), Tokenizer.from_metadata(md)


def _mismatches(llm, tok, texts):
    bad = []
    for text in texts:
        for special in (True, False):
            want = llm.tokenize(text.encode(), add_bos=True, special=special)
            got = tok.encode(text, add_special=True, parse_special=special)
            if got != want:
                bad.append((text, special, want, got))
    return bad


def _pieces_differ(llm, tok):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    buf = ctypes.create_string_buffer(1024)  # llama-cpp-python's own detokenize cuts at 32 bytes
    bad = []
    for i in range(tok.vocab_size):
        for special in (True, False):
            n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
            if buf.raw[:n] != tok.token_piece(i, special=special):
                bad.append((i, special))
    return bad


def _eog(llm, tok):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return {i for i in range(tok.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)}


def test_gemma_prompts(gemma_pair):
    assert _mismatches(*gemma_pair, PROMPTS) == []


def test_gemma_fuzz(gemma_pair):
    assert _mismatches(*gemma_pair, FUZZ) == []


def test_gemma_chat(gemma_pair):
    llm, tok = gemma_pair
    text = tok.render_chat([{"role": "user", "content": "Tell me a joke."},
                            {"role": "assistant", "content": "No."}, {"role": "user", "content": "Please"}])
    assert _mismatches(llm, tok, [text]) == []


def test_gemma_pieces_and_eog(gemma_pair):
    llm, tok = gemma_pair
    assert _pieces_differ(llm, tok) == []
    assert _eog(llm, tok) == set(tok.eog_ids)


def test_synth_prompts(synth_pair):
    assert _mismatches(*synth_pair, PROMPTS) == []


def test_synth_fuzz(synth_pair):
    assert _mismatches(*synth_pair, FUZZ[:100]) == []


def test_synth_case_digits_slashes(synth_pair):
    assert _mismatches(*synth_pair, CASE_FUZZ) == []


def test_gpt_oss_vocab_declares_gpt_4o():
    assert synth_vocab("gpt2", 1024, "gpt-oss")["tokenizer.ggml.pre"] == "gpt-4o"


def test_synth_pieces_and_eog(synth_pair):
    llm, tok = synth_pair
    if tok.vocab_size <= 32000:
        assert _pieces_differ(llm, tok) == []
    assert _eog(llm, tok) == set(tok.eog_ids)
    assert llama_cpp.llama_vocab_bos(llama_cpp.llama_model_get_vocab(llm.model)) == tok.bos_id
