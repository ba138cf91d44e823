"""Chat templates: tokenizer.chat_template rendered as transformers and llama.cpp render it,
and a fitting default for files that carry none (the packaged gemma3 file is one)."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext

from minferd import config
from minferd.errors import Conflict, InvalidRequest, excerpt
from minferd.model.template_bounds import BoundedEnvironment, Budget, OverBudget

GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}"""

CHATML = """{%- for message in messages -%}
    {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|im_start|>assistant\n' }}
{%- endif -%}"""

LLAMA3 = """{{ bos_token }}
{%- for message in messages -%}
    {{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
    {{- message['content'] | trim }}
    {{- '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif -%}"""

# (template, a token it needs in the vocabulary)
_DEFAULTS = {"gemma": (GEMMA, "<start_of_turn>"), "chatml": (CHATML, "<|im_start|>"),
             "llama3": (LLAMA3, "<|start_header_id|>")}
_BY_ARCH = {"gemma3": "gemma", "qwen2": "chatml", "qwen3": "chatml", "qwen3moe": "chatml", "qwen2moe": "chatml", "llama": "llama3"}


def default_template(architecture: str, has_token) -> str:
    """The architecture's usual template when its markup is in the vocabulary, else the first
    template whose markup is (a synthetic vocab may pair any architecture with any markup)."""
    first = _BY_ARCH.get(architecture, "chatml")
    for name in (first, *_DEFAULTS):
        source, marker = _DEFAULTS[name]
        if has_token(marker):
            return source
    return _DEFAULTS[first][0]


def plain_messages(messages: list[dict]) -> list[dict]:
    """OpenAI-style content lists flattened to text, which the default templates expect."""
    out = []
    for m in messages:
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append({**m, "content": content})
    return out


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template | str:
    """The compiled template, or what keeps it from compiling: cached either way, so a bad
    template costs one compile per model, not one per Chat."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > config.MAX_TEMPLATE_BYTES:
        return f"chat template is {size} bytes, over the limit of {config.MAX_TEMPLATE_BYTES} (MAX_TEMPLATE_BYTES)"
    # The environment transformers uses (bounded: template_bounds.py), so that templates written
    # for it render the same.
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.bound_filters()
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return f"chat template does not compile: line {e.lineno}: {excerpt(e.message)}"
    except Exception as e:  # RecursionError (deep nesting), MemoryError, Python's own SyntaxError
        return f"chat template does not compile: {type(e).__name__}: {excerpt(str(e))}"


def check(source: str) -> str | None:
    """None when the template compiles, else its problem in one line (with the line number)."""
    compiled = _compile(source)
    return compiled if isinstance(compiled, str) else None


def render(source: str, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
    """The template rendered within bounds (template_bounds.py). A template that does not compile is
    the model's problem, Conflict (FAILED_PRECONDITION); anything that goes wrong while it renders is
    InvalidRequest naming the exception (it may be the messages', as when roles must alternate)."""
    template = _compile(source)
    if isinstance(template, str):
        raise Conflict(f"this model's {template} (Generate with a prompt still serves it)")
    parts, size = [], 0
    chunks = template.generate(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    try:
        with Budget():
            for chunk in chunks:
                size += len(chunk.encode("utf-8", "surrogatepass"))
                if size > config.MAX_RENDERED_BYTES:
                    raise InvalidRequest(f"chat template: rendered more than {config.MAX_RENDERED_BYTES} "
                                         f"bytes (MAX_RENDERED_BYTES)")
                parts.append(chunk)
    except InvalidRequest:
        raise
    except OverBudget as e:
        raise InvalidRequest(f"chat template: {e}") from None
    except Exception as e:  # ZeroDivisionError, TypeError, UndefinedError, RecursionError, MemoryError, ...
        raise InvalidRequest(f"chat template{_where(e)}: {type(e).__name__}: {excerpt(str(e))}") from None
    finally:
        chunks.close()
    return "".join(parts)


def _where(e: BaseException) -> str:
    """ line N: the template line the exception came from (Jinja rewrites tracebacks to them)."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" line {line}" if line else ""
