"""Chat templates a model file brings are code we run: they are checked when the model loads and
rendered within bounds (issue 13, item 7). Normal templates must render exactly as Jinja's plain
sandbox renders them; the daemon-level tests are tests/e2e/test_bounded_inputs.py."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from minferd import config
from minferd.errors import Conflict, InvalidRequest
from minferd.model import chat_template
from minferd.model.synth_vocab import synth_vocab
from minferd.model.tokenizer import Tokenizer

HERE = Path(__file__).parent / "chat_templates"
REAL = {"qwen2.5": (HERE / "qwen2.5.jinja").read_text(), "llama3.1": (HERE / "llama3.1.jinja").read_text(),
        "gemma": chat_template.GEMMA, "chatml": chat_template.CHATML, "llama3": chat_template.LLAMA3}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "description": "Grüße, café"}},
                                               "required": ["city"]}}}]
CALL = {"role": "assistant", "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}


def conversation(n: int) -> list[dict]:
    msgs = [{"role": "system", "content": "Be brief."}]
    for i in range(n - 1):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": f" turn {i}: naïve \"quotes\" {'x' * i} "})
    return msgs


CASES = {  # name -> (messages, extra variables)
    "one": ([{"role": "user", "content": "Hi"}], {}),
    "twenty": (conversation(20), {}),
    "tools": ([{"role": "user", "content": "Weather?"}, CALL,
               {"role": "tool", "content": json.dumps({"temp": 21})}, {"role": "tool", "content": "sunny"}],
              {"tools": TOOLS}),
    "tools-in-system": (conversation(3), {"tools": TOOLS, "tools_in_user_message": False}),
    "builtin": ([{"role": "user", "content": "2+2?"}], {"builtin_tools": ["code_interpreter", "brave_search"]}),
}


def plain(source: str, messages, **variables) -> str:
    """What the daemon rendered before templates were bounded: Jinja's sandbox as transformers sets it up."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = chat_template._raise_exception
    return env.from_string(source).render(messages=messages, add_generation_prompt=True, **variables)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", REAL)
def test_real_templates_render_as_before(name, case):
    messages, extra = CASES[case]
    if name == "gemma" and case == "tools":
        pytest.skip("gemma's template has no tool turns (it refuses them, as it should)")
    variables = dict(bos_token="<s>", eos_token="</s>", **extra)
    assert chat_template.render(REAL[name], messages, True, **variables) == plain(REAL[name], messages, **variables)


def test_tracer_cost_on_a_normal_render(capsys):
    """The bounds' cost on a 20-message Llama 3.1 render (printed, not asserted: machines differ)."""
    messages, source = conversation(20), REAL["llama3.1"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(source)

    def best(f, n=30):
        t = []
        for _ in range(n):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
        return min(t) * 1e3

    chat_template.render(source, messages, True, bos_token="<s>")  # compiled once, as in the daemon
    bounded = best(lambda: chat_template.render(source, messages, True, bos_token="<s>"))
    unbounded = best(lambda: template.render(messages=messages, add_generation_prompt=True, bos_token="<s>"))
    with capsys.disabled():
        print(f"\n20-message llama3.1 render: bounded {bounded:.2f} ms, plain sandbox {unbounded:.2f} ms, "
              f"cost {bounded - unbounded:+.2f} ms")


BAD = {  # name -> (template, words the refusal names)
    "divides by zero": ("{{ 1 / 0 }}", "ZeroDivisionError"),
    "type error": ("{{ messages[0]['content'] + 1 }}", "TypeError"),
    "undefined call": ("{{ nope() }}", "UndefinedError"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran past"),
    "huge string": ("{{ 'x' * 10 ** 10 }}", "10000000000"),
    "huge power": ("{{ 10 ** (10 ** 10) }}", "**"),  # (Jinja reads 10 ** 10 ** 10 as (10 ** 10) ** 10)
    "huge range": ("{{ range(10 ** 10) | list }}", "10000000000"),
    "range past MAX_RANGE": ("{{ range(10 ** 6) | list | length }}", "OverflowError"),
    "huge center": ("{{ 'x' | center(10 ** 10) }}", "10000000000"),
    "huge format": ("{{ '%10000000000d' % 1 }}", "10000000000"),
    "huge str.format": ("{{ '{:>10000000000}'.format(1) }}", "10000000000"),
    "huge join": ("{{ (['x' * 1000000] * 10000) | join }}", "join"),
    "huge replace": ("{{ ('x' * 100000) | replace('', 'y' * 100000) }}", "replace"),
    "doubling concat": (("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                         "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"), "~"),
    "doubling nests": (("{% set ns = namespace(x=[0]) %}{% for i in range(40) %}"
                        "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}"), "output"),
    "long output": ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "rendered"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    "hoard": (("{% set ns = namespace(x=[]) %}{% for i in range(24) %}{% set ns.x = ns.x + ['y' * 8000000] %}"
               "{% endfor %}{{ ns.x|length }}"), "this render has built"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_templates_are_invalid_requests_in_bounded_time(name):
    source, words = BAD[name]
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest) as e:
        chat_template.render(source, [{"role": "user", "content": "hi"}])
    took = time.monotonic() - t0
    msg = str(e.value)
    assert msg.startswith("chat template") and words in msg, msg
    assert len(msg) < 400, msg
    assert took < config.TEMPLATE_SECONDS + 1, (name, took)


def test_the_tracer_leaves_the_callers_alone():
    def mine(frame, event, arg):
        return None

    sys.settrace(mine)
    try:
        chat_template.render(chat_template.CHATML, [{"role": "user", "content": "hi"}])
        with pytest.raises(InvalidRequest):
            chat_template.render(BAD["nested loops"][0], [])
        assert sys.gettrace() is mine
    finally:
        sys.settrace(None)


def tokenizer_with(template: str | None) -> Tokenizer:
    md = synth_vocab("gpt2", 1024, None) | {"general.architecture": "qwen2"}
    if template is not None:
        md["tokenizer.chat_template"] = template
    return Tokenizer.from_metadata(md)


def test_a_template_that_does_not_compile_is_found_at_load():
    tok = tokenizer_with("<|im_start|>{{ messages[0]['content'] }}\n{% for m in messages %}{{ m.role }\n")
    problem = tok.check_chat_template()
    assert problem and "line 2" in problem, problem
    with pytest.raises(Conflict) as e:  # FAILED_PRECONDITION: the model's file, not the request
        tok.render_chat([{"role": "user", "content": "hi"}])
    assert "does not compile" in str(e.value) and "line 2" in str(e.value)
    assert tokenizer_with(None).check_chat_template() is None  # the architecture's default
    assert tokenizer_with(REAL["qwen2.5"]).check_chat_template() is None


def test_an_oversized_template_is_found_at_load():
    problem = tokenizer_with("x" * (config.MAX_TEMPLATE_BYTES + 1)).check_chat_template()
    assert problem and str(config.MAX_TEMPLATE_BYTES) in problem


def test_a_long_conversation_built_up_piece_by_piece_is_not_a_hoard():
    """Values under a MB never count toward the hoard bound: 2000 messages of 400 characters, the
    output (800 KB) grown by ~ one message at a time, render as the plain sandbox renders them."""
    source = ("{% set ns = namespace(out='') %}{% for m in messages %}"
              "{% set ns.out = ns.out ~ m['role'] ~ ': ' ~ m['content'] ~ '\\n' %}{% endfor %}{{ ns.out }}")
    msgs = [{"role": "user", "content": "x" * 400} for _ in range(2000)]
    want = ImmutableSandboxedEnvironment().from_string(source).render(messages=msgs)
    assert chat_template.render(source, msgs) == want and len(want) > 800_000
