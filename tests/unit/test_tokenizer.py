"""Tokenizer: round trips, special tokens, BOS, chat templates, streaming, synthetic vocabs.
Agreement with llama.cpp itself is test_tokenizer_oracle.py."""
from __future__ import annotations

import time

import gguf
import pytest

from minferd.errors import InvalidRequest
from minferd.model.synth_vocab import synth_vocab, write_vocab_gguf
from minferd.model.tokenizer import Tokenizer, read_tokenizer_metadata

TEXTS = [
    "Hello world, the model's answer: 42!",
    " leading space and trailing space ",
    "  two  spaces\n\nnewlines\ttab\r\n",
    "Grüße, naïve café; Привет мир; 日本語のテキスト; 한국어",
    "emoji 🦙🔥👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "byte fallback: \x00\x07\x1b ÿ \U0010fffd 𝕳𝖊𝖑𝖑𝖔",
    "def f(x):\n    return x ** 2  # square\n",
    " ",
    "\n",
    "x" * 300,
]
SYNTH = {  # name -> (kind, size, arch)
    "gpt2-qwen": ("gpt2", 1024, None),
    "gpt2-llama3": ("gpt2", 1024, "llama"),
    "spm-llama2": ("llama", 1024, None),
    "spm-gemma": ("llama", 1024, "gemma3"),
}
ARCH = {"gpt2-qwen": "qwen2", "gpt2-llama3": "llama", "spm-llama2": "llama", "spm-gemma": "gemma3"}


def synth_tokenizer(name: str, **extra) -> Tokenizer:
    kind, size, arch = SYNTH[name]
    md = synth_vocab(kind, size, arch) | {"general.architecture": ARCH[name]} | extra
    return Tokenizer.from_metadata(md)


@pytest.fixture(scope="session")
def gemma(gemma_path):
    from minferd.model.gguf_file import GGUFFile

    return Tokenizer.from_metadata(read_tokenizer_metadata(GGUFFile(gemma_path)))


@pytest.fixture(scope="session", params=[*SYNTH, "gemma-real"])
def tok(request):
    if request.param == "gemma-real":
        return request.getfixturevalue("gemma")
    return synth_tokenizer(request.param)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text, add_special=False)) == text
    assert tok.decode(tok.encode(text), skip_special=True) == text


def test_round_trip_through_specials(tok):
    text = "<start_of_turn>user\nhi<end_of_turn>\n<|im_start|>x<|im_end|> tail"
    assert tok.decode(tok.encode(text, add_special=False)) == text


def test_gemma_known_ids(gemma):
    assert gemma.encode("Hello world") == [2, 9259, 1902]
    assert gemma.encode("<start_of_turn>user\nHi<end_of_turn>\n") == [2, 105, 2364, 107, 10979, 106, 107]
    assert gemma.vocab_size == 262144 and gemma.bos_id == 2 and gemma.eos_id == 1
    # <end_of_turn> and, as in llama.cpp, the HTML "</s>" (212) end generation
    assert gemma.eog_ids == {1, 106, 212}


def test_special_parsing(gemma):
    assert 105 in gemma.encode("<start_of_turn>model\n")
    plain = gemma.encode("<start_of_turn>model\n", parse_special=False)
    assert 105 not in plain and gemma.decode(plain, skip_special=True) == "<start_of_turn>model\n"
    # user-defined tokens ("\n\n", space runs) are cut out either way, as in llama.cpp
    assert 108 in gemma.encode("a\n\nb", parse_special=False)
    assert gemma.decode(gemma.encode("<start_of_turn>user"), skip_special=True) == "user"


def test_bos_handling(gemma):
    assert gemma.encode("") == [2]
    assert gemma.encode("", add_special=False) == []
    assert gemma.encode("x", add_special=False)[0] != 2
    assert gemma.encode("<bos>x")[:2] == [2, 2]  # llama.cpp doubles it too (and warns)
    qwen, llama3 = synth_tokenizer("gpt2-qwen"), synth_tokenizer("gpt2-llama3")
    assert qwen.encode("hi")[0] != qwen.bos_id  # qwen adds no BOS
    assert llama3.encode("hi")[0] == llama3.bos_id
    eos = synth_tokenizer("gpt2-qwen", **{"tokenizer.ggml.add_eos_token": True})
    assert eos.encode("hi")[-1] == eos.eos_id and eos.encode("hi", add_special=False)[-1] != eos.eos_id


def test_space_prefix_llama2():
    t = synth_tokenizer("spm-llama2")
    ids = t.encode("the", add_special=False)
    assert t.token_text(ids[0]).startswith("▁")  # llama-2 prefixes a space, gemma does not
    assert t.decode(ids) == "the"
    g = synth_tokenizer("spm-gemma")
    assert not g.token_text(g.encode("the", add_special=False)[0]).startswith("▁")


def test_eog_ids():
    q = synth_tokenizer("gpt2-qwen")
    names = {q.token_text(i) for i in q.eog_ids}
    assert {"<|im_end|>", "<|endoftext|>", "<|eot_id|>"} <= names
    assert synth_tokenizer("spm-gemma").encode("<end_of_turn>", add_special=False)[0] in \
        synth_tokenizer("spm-gemma").eog_ids


def test_token_piece_bytes(gemma):
    ids = gemma.encode("🦙", add_special=False)  # not in the vocab: four <0xXX> tokens
    assert [gemma.token_piece(i) for i in ids] == [bytes([b]) for b in "🦙".encode()]
    assert gemma.token_piece(105) == b"<start_of_turn>" and gemma.token_piece(105, special=False) == b""
    assert gemma.token_piece(gemma.encode(" world", add_special=False)[0]) == b" world"


@pytest.mark.parametrize("name", [*SYNTH, "gemma-real"])
def test_streaming_reassembles_utf8(name, request):
    t = request.getfixturevalue("gemma") if name == "gemma-real" else synth_tokenizer(name)
    text = "naïve 🦙 日本 👨‍👩‍👧 end"
    ids = t.encode(text, add_special=False)
    stream = t.stream_decoder()
    parts = [stream.push(i) for i in ids] + [stream.flush()]
    assert all("\ufffd" not in p for p in parts)
    got = "".join(parts)
    # the space llama-2 puts before the first fragment is generated text when streaming
    assert got == (" " + text if t.add_space_prefix else text)


def test_chat_default_gemma(gemma):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi "},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    assert gemma.render_chat(msgs) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert gemma.render_chat(msgs[1:2], add_generation_prompt=False) == "<start_of_turn>user\nHi<end_of_turn>\n"
    ids = gemma.encode(gemma.render_chat(msgs[1:2]))
    assert ids[:2] == [2, 105] and ids.count(2) == 1  # one BOS: the template's own is stripped
    with pytest.raises(InvalidRequest):
        gemma.render_chat([{"role": "assistant", "content": "x"}])


def test_chat_default_chatml_and_llama3():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert synth_tokenizer("gpt2-qwen").render_chat(msgs) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    llama3 = synth_tokenizer("gpt2-llama3")
    text = llama3.render_chat(msgs)
    assert text == ("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert llama3.encode(text)[:2] == [llama3.bos_id, llama3._hf.token_to_id("<|start_header_id|>")]


def test_chat_template_from_metadata():
    template = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}"
                "{{ raise_exception('no tools') }}{% endif %}[{{ m.role }}]{{ m.content | tojson }}"
                "{% endfor %}{% if add_generation_prompt %}[bot]{{ strftime_now('%Y') | length }}{% endif %}"
                "{{ eos_token }}")
    t = synth_tokenizer("gpt2-llama3", **{"tokenizer.chat_template": template})
    out = t.render_chat([{"role": "user", "content": "é\""}])
    assert out == '[user]"é\\""[bot]4<|eot_id|>'  # leading <|begin_of_text|> stripped
    with pytest.raises(InvalidRequest, match="no tools"):
        t.render_chat([{"role": "tool", "content": "x"}])


@pytest.mark.parametrize("kind,arch", [("gpt2", None), ("gpt2", "llama"), ("llama", None), ("llama", "gemma3")])
@pytest.mark.parametrize("size", [512, 1024, 128256, 151936, 152064, 262144])
def test_synth_vocab_sizes(kind, arch, size):
    t0 = time.perf_counter()
    md = synth_vocab(kind, size, arch)
    assert time.perf_counter() - t0 < 2.0
    tokens = md["tokenizer.ggml.tokens"]
    assert len(tokens) == size == len(set(tokens)) == len(md["tokenizer.ggml.token_type"])
    if kind == "gpt2":
        have = set(tokens)
        for m in md["tokenizer.ggml.merges"][:: max(1, size // 2000)]:
            a, b = m.split(" ")
            assert a in have and b in have and a + b in have
    else:
        assert len(md["tokenizer.ggml.scores"]) == size
        assert {"<start_of_turn>", "<end_of_turn>", "<0x00>", "<0xFF>"} <= set(tokens)
    assert synth_vocab(kind, size, arch) == md  # deterministic


def test_synth_vocab_rejects():
    with pytest.raises(ValueError):
        synth_vocab("gpt2", 100)
    with pytest.raises(ValueError):
        synth_vocab("wordpiece", 1024)


def test_read_from_gguf_reader(tmp_path):
    md = synth_vocab("gpt2", 1024) | {"general.architecture": "qwen2"}
    write_vocab_gguf(tmp_path / "v.gguf", "qwen2", md)
    read = read_tokenizer_metadata(gguf.GGUFReader(tmp_path / "v.gguf"))
    assert read["tokenizer.ggml.tokens"] == md["tokenizer.ggml.tokens"]
    assert read["general.architecture"] == "qwen2"
    a, b = Tokenizer.from_metadata(read), Tokenizer.from_metadata(md)
    assert a.encode(TEXTS[3]) == b.encode(TEXTS[3]) and a.eog_ids == b.eog_ids


def test_unsupported_tokenizer():
    md = synth_vocab("gpt2", 1024)
    with pytest.raises(ValueError, match="pre"):
        Tokenizer.from_metadata(md | {"tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(ValueError, match="model"):
        Tokenizer.from_metadata(md | {"tokenizer.ggml.model": "bert"})


def test_a_lone_surrogate_is_an_invalid_request(gemma):
    """Only a Python str holds one (no UTF-8 encodes it): the Rust tokenizer would raise TypeError."""
    from minferd.errors import InvalidRequest
    with pytest.raises(InvalidRequest, match="lone surrogate .U\\+D800. at 3"):
        gemma.encode("abc\ud800def")
    assert gemma.encode("abc😀") == gemma.encode("abc😀")


def test_the_same_keys_reuse_their_tokenizer_and_other_keys_do_not():
    """from_metadata keeps the last BUILT_KEPT tokenizers by a digest of every key: a model loaded
    again reuses its tokenizer (a 262k SPM vocabulary took 1.6 s to build); any changed key, a
    token, a score or the template, builds another."""
    from minferd.model import tokenizer as tk
    md = synth_vocab("llama", 1024, None) | {"general.architecture": "llama"}
    a = Tokenizer.from_metadata(md)
    assert Tokenizer.from_metadata(dict(md)) is a
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[300] = tokens[300] + "x"
    variants = [md | {"tokenizer.ggml.tokens": tokens}, md | {"tokenizer.chat_template": "{{ messages }}"},
                md | {"tokenizer.ggml.add_bos_token": False}]
    built = [Tokenizer.from_metadata(v) for v in variants]
    assert all(b is not a for b in built) and len({id(b) for b in built}) == len(built)
    assert len(tk._built) <= tk.BUILT_KEPT
    assert Tokenizer.from_metadata(variants[-1]) is built[-1]  # the newest are kept
