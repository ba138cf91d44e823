"""What llama.cpp's vocabulary loader decides from a GGUF beyond its token list: the
pre-tokenizer regexes per tokenizer.ggml.pre, and the texts it forces to end generation or to a
token type whatever the file says (llama_vocab::load), and those overrides applied. No
tokenizer here: minferd/model/tokenizer.py builds it from these."""
from __future__ import annotations

import numpy as np

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # tokenizer.ggml.token_type

# Pre-tokenizer regexes, verbatim from llama.cpp's llm_tokenizer_bpe; applied in sequence,
# each one splitting the pieces of the one before and keeping unmatched text as pieces.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
# o200k (gpt-oss, llama4): llama.cpp's rewrite of tiktoken's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*
# [\p{Ll}\p{Lm}\p{Lo}\p{M}]+ as "letters but not a-z" then "letters but not A-Z": a non-ASCII
# letter counts as both cases, and combining marks (\p{M}) are not part of a word.
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
          rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (regexes, ignore_merges, add_bos default), as llama_vocab::load sets them
PRE = {"default": (_DEFAULT, False, False)}
PRE.update({n: ((_LLAMA3,), True, True) for n in (
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")})
PRE.update({n: ((_QWEN2,), False, False) for n in (
    "qwen2", "deepseek-r1-qwen", "kormo", "stablelm2", "hunyuan", "solar-open")})
PRE.update({n: ((_GPT2,), False, False) for n in (
    "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "mpt", "olmo", "trillion")})
PRE["qwen35"] = ((_QWEN35,), False, False)
PRE.update({n: ((_GPT4O,), False, False) for n in ("gpt-4o", "llama4", "kanana2", "talkie")})

# Texts llama.cpp treats as end of generation whatever the file says (llama_vocab::load),
# forcing them to control type. "</s>" is among them, so gemma3's HTML "</s>" ends a turn too.
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"))
# Fill-in-the-middle markup llama.cpp also forces to control type (they do not end generation).
FIM_TEXTS = frozenset((
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>"))
GPT_OSS_TEXT = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # always rendered


def llama_cpp_overrides(vocab: dict[str, int], types: np.ndarray, eog: set[int]) -> set[int]:
    """The end-of-generation set and token types as llama_vocab::load leaves them: it goes by
    token text where converters did not mark tokens, and these choices change tokenization."""
    for text in EOG_TEXTS | FIM_TEXTS:
        i = vocab.get(text)
        if i is not None:
            types[i] = CONTROL
            if text in EOG_TEXTS:
                eog.add(i)
    for text in GPT_OSS_TEXT:
        if text in vocab:
            types[vocab[text]] = USER_DEFINED
    # gpt-oss and solar-open end a message with <|end|> but keep generating after it
    if ("<|return|>" in vocab and "<|call|>" in vocab or "<|calls|>" in vocab and "<|flush|>" in vocab) \
            and "<|end|>" in vocab and vocab["<|end|>"] in eog:
        eog.discard(vocab["<|end|>"])
        types[vocab["<|end|>"]] = USER_DEFINED
    # gemma4 and plamo2 use "</s>" as plain text
    if ("<|tool_response>" in vocab or "<|plamo:eos|>" in vocab) and "</s>" in vocab:
        eog.discard(vocab["</s>"])
        types[vocab["</s>"]] = NORMAL
    return eog
