"""Bounds on running a chat template. A GGUF file's tokenizer.chat_template is code the daemon runs
on every Chat; Jinja's sandbox keeps it from reaching Python's internals but not from looping 10^10
times (nested `range(100000)` loops pass its MAX_RANGE) or building a 10 GB string in one step.

Three bounds, together:
- work: a tracer, set only for the render's thread and only while it renders, counts every Python
  line run (the template's compiled code, and the filters and runtime it calls into) and stops the
  render past TEMPLATE_STEPS lines or TEMPLATE_SECONDS;
- size: no single operation may build a value past MAX_RENDERED_BYTES characters (or items), checked
  before it runs, since one C-level `'x' * 10**10` takes no lines and all the memory;
- hoard: the values of a MB or more one render builds add up to at most MAX_BIG_TOTAL, so keeping
  many values each within bounds (24 x 8 MB in a namespace's list held 192 MB) is refused too.
  Values under a MB do not count: a conversation built up message by message stays free.
A normal render stays exactly as Jinja renders it: the checks only refuse.
"""
from __future__ import annotations

import functools
import re
import sys
import threading
import time

from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import Namespace

from minferd import config

MAX_VALUE = config.MAX_RENDERED_BYTES  # characters or items one value may hold: no render needs a bigger one
MAX_INT_BITS = 1 << 16  # far past any number a template prints (str() refuses 4300 digits anyway)
# Items weight() visits before it calls a value too big to print (a traversal costs ~1 us an item),
# and the tools and content lists a template prints hold hundreds.
MAX_PRINTED_ITEMS = 1 << 16
_SEQUENCES = (str, list, tuple)
BIG_VALUE = 1 << 20  # values at least this long count toward a render's MAX_BIG_TOTAL
MAX_BIG_TOTAL = 4 * MAX_VALUE
_rendering = threading.local()  # .budget: the Budget of the render running on this thread


class OverBudget(BaseException):
    """The render ran past its steps or seconds. A BaseException: raised from the tracer, it must
    pass every `except Exception` in Jinja and in the filters between it and render()."""


class Budget:
    """sys.settrace for the calling thread while in the `with` block: every Python line is a step.
    Time is read every 4096 steps (a clock read per line would double the tracer's cost)."""

    def __init__(self, steps: int | None = None, seconds: float | None = None):
        self.limit = config.TEMPLATE_STEPS if steps is None else steps
        self.seconds = config.TEMPLATE_SECONDS if seconds is None else seconds
        self.steps = 0
        self.big = 0  # characters (or items) in the values of BIG_VALUE or more built so far

    def __enter__(self):
        self._deadline = time.monotonic() + self.seconds
        self._next = min(4096, self.limit)
        self._previous = sys.gettrace()  # a debugger's or coverage's tracer comes back afterwards
        _rendering.budget = self
        sys.settrace(self._frame)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._previous)
        _rendering.budget = None

    def _frame(self, frame, event, arg):  # a new frame: trace its lines
        if frame.f_code.co_filename == __file__:
            return None  # the size checks below: bounded by construction, and untraced they cost less
        return self._line(frame, event, arg)

    def _line(self, frame, event, arg):  # every event counts (lines, and calls and returns)
        self.steps += 1
        if self.steps >= self._next:
            if self.steps > self.limit:
                raise OverBudget(f"ran past {self.limit} steps (TEMPLATE_STEPS)")
            if time.monotonic() > self._deadline:
                raise OverBudget(f"ran past {self.seconds:g} s (TEMPLATE_SECONDS)")
            self._next = min(self._next + 4096, self.limit + 1)
        return self._line


def refuse(what: str):
    raise SecurityError(what)


def weight(value, limit: int = MAX_VALUE) -> int:
    """About how many characters str(value) writes, counted until past limit (or past
    MAX_PRINTED_ITEMS items): a list that holds itself twice, forty levels deep, is a few bytes of
    memory and 2**40 items of text."""
    n, seen, stack = 0, 0, [value]
    while stack and n <= limit:
        v = stack.pop()
        seen += 1
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, (list, tuple, set, frozenset, dict)):
            n += 2 + 3 * len(v)  # brackets, separators and at least a character an item
            if n <= limit:
                stack.extend(v.items() if isinstance(v, dict) else v)
        elif isinstance(v, Namespace):
            n += 12
            stack.append(v._Namespace__attrs)
        else:
            n += 1
        if seen > MAX_PRINTED_ITEMS:
            return limit + 1
    return n


def check_weight(value, what: str):
    if not isinstance(value, str) and weight(value) > MAX_VALUE:
        refuse(f"{what} of a value of more than {MAX_VALUE} characters or {MAX_PRINTED_ITEMS} items")


def check_binop(op: str, a, b) -> None:
    if op == "*":
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, _SEQUENCES) and isinstance(n, int) and len(seq) * n > MAX_VALUE:
                refuse(f"{type(seq).__name__} of {len(seq)} * {n} would hold {len(seq) * n}, over {MAX_VALUE}")
        if _both_int(a, b) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
            refuse(f"an integer product of {a.bit_length() + b.bit_length()} bits (limit {MAX_INT_BITS} bits)")
    elif op == "**":
        if _both_int(a, b) and b > 0 and abs(a) > 1 and a.bit_length() * b > MAX_INT_BITS:
            refuse(f"** would make an integer of about {a.bit_length() * b} bits (limit {MAX_INT_BITS} bits)")
    elif op == "+":
        if isinstance(a, _SEQUENCES) and isinstance(b, _SEQUENCES) and len(a) + len(b) > MAX_VALUE:
            refuse(f"+ would make a {type(a).__name__} of {len(a) + len(b)}, over {MAX_VALUE}")
    elif op == "%" and isinstance(a, str):
        check_format(a, b if isinstance(b, tuple) else (b,), "%")


def _both_int(a, b) -> bool:
    return isinstance(a, int) and isinstance(b, int)


# Field widths and precisions: '%10000000000d', '{:>10000000000}' each ask for a 10 GB string.
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*)(?:\.(\d*))?")
_BRACE = re.compile(r"\{[^{}]*\}")


def check_format(fmt: str, args, what: str) -> None:
    widths = [int(w) for m in _PERCENT.finditer(fmt) for w in m.groups() if w]
    widths += [int(w) for m in _BRACE.finditer(fmt) for w in re.findall(r"\d+", m.group().partition(":")[2])]
    if widths and max(widths) > MAX_VALUE:
        refuse(f"{what} with a field width of {max(widths)}, over {MAX_VALUE}")
    check_args(args, {}, what)
    check_weight(list(args), what)


def check_args(args, kwargs, what: str) -> None:
    """An integer argument past the limit asks for that many characters (center, indent, ljust,
    tojson's indent, lipsum, ...); no template needs one."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and abs(v) > MAX_VALUE:
            refuse(f"{what} with an argument of {v}, over {MAX_VALUE}")


def check_result(value, what: str):
    if isinstance(value, (str, list, tuple, dict)):
        if len(value) > MAX_VALUE:
            refuse(f"{what} made a value of {len(value)}, over {MAX_VALUE}")
        charge(len(value), what)
    return value


def charge(size: int, what: str) -> None:
    """Count a value of BIG_VALUE or more toward the running render's MAX_BIG_TOTAL."""
    budget = getattr(_rendering, "budget", None) if size >= BIG_VALUE else None
    if budget is not None:
        budget.big += size
        if budget.big > MAX_BIG_TOTAL:
            refuse(f"{what}: this render has built {budget.big} characters in values of {BIG_VALUE} or more, "
                   f"over {MAX_BIG_TOTAL}")


def _replaced_size(s, old, new, count=None) -> int:
    if not all(isinstance(x, str) for x in (s, old, new)):
        return 0
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * (len(new) - len(old))


def _check_join(items, sep) -> None:
    sep = sep if isinstance(sep, str) else ""
    if weight(items) + len(sep) * len(items) > MAX_VALUE:
        refuse(f"join of {len(items)} items would make more than {MAX_VALUE} characters")


def _join_filter(value, rest, kwargs):
    items = value if isinstance(value, str) else list(value)  # a generator, once looked at, is used up
    _check_join(items, rest[0] if rest else kwargs.get("d", ""))
    return items


def _replace_filter(value, rest, kwargs):
    if _replaced_size(value, *rest[:3], **kwargs) > MAX_VALUE:
        refuse(f"replace would make {_replaced_size(value, *rest[:3], **kwargs)} characters, over {MAX_VALUE}")
    return value


def _indent_filter(value, rest, kwargs):
    width = rest[0] if rest else kwargs.get("width", 4)
    if isinstance(value, str) and isinstance(width, str) and \
            len(value) + (value.count("\n") + 1) * len(width) > MAX_VALUE:
        refuse(f"indent by {len(width)} characters would make more than {MAX_VALUE} characters")
    return value


def _format_filter(value, rest, kwargs):
    if isinstance(value, str):
        check_format(value, (*rest, *kwargs.values()), "format")
    return value


def _sum_filter(value, rest, kwargs):
    start = rest[1] if len(rest) > 1 else kwargs.get("start", 0)
    if not isinstance(start, (int, float)):  # summing lists copies them over and over: quadratic, in C
        refuse(f"sum with a start of type {type(start).__name__}: sum adds numbers")
    return value


def _stringify_filter(value, rest, kwargs):
    check_weight(value, "string")
    return value


_FILTER_CHECKS = {"join": _join_filter, "replace": _replace_filter, "indent": _indent_filter,
                  "format": _format_filter, "string": _stringify_filter, "tojson": _stringify_filter,
                  "pprint": _stringify_filter, "sum": _sum_filter}


def bounded_filter(name: str, f):
    skip = 2 if getattr(f, "jinja_pass_arg", None) is not None else 1  # context or environment first
    check = _FILTER_CHECKS.get(name)

    @functools.wraps(f)  # keeps jinja_pass_arg, which the compiler reads
    def bounded(*args, **kwargs):
        if len(args) < skip:
            return f(*args, **kwargs)
        head, value, rest = args[:skip - 1], args[skip - 1], args[skip:]
        check_args(rest, kwargs, f"filter {name}")
        if check is not None:
            value = check(value, rest, kwargs)
        return check_result(f(*head, value, *rest, **kwargs), f"filter {name}")

    return bounded


class _CodeGenerator(CodeGenerator):
    @optimizeconst
    def visit_Concat(self, node, frame) -> None:
        # Jinja's own, with the parts checked before `~` turns them into one string.
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"{func_name}(environment.concat_parts((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose operators, calls, filters, `~` and `{{ }}` output refuse
    to build a value past MAX_VALUE. Call bound_filters() after adding filters."""

    code_generator_class = _CodeGenerator
    # Intercepted operators also stay out of compile-time constant folding, which would otherwise
    # compute `10 ** (10 ** 10)` while the model loads.
    intercepted_binops = frozenset(("+", "*", "**", "%"))

    def __init__(self, **options):
        super().__init__(finalize=self._output, **options)

    def bound_filters(self) -> None:
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}

    def call_binop(self, context, operator, left, right):
        check_binop(operator, left, right)
        return check_result(super().call_binop(context, operator, left, right), operator)

    def call(self, context, obj, /, *args, **kwargs):  # positional-only: kwargs may have any name
        name = getattr(obj, "__name__", type(obj).__name__)
        given = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}  # Jinja's own
        check_args(args, given, name)
        owner = getattr(getattr(obj, "__wrapped__", obj), "__self__", None)  # the sandbox wraps str.format
        if isinstance(owner, str):
            if name in ("format", "format_map"):
                check_format(owner, (*args, *given.values()), f"str.{name}")
            elif name == "join" and args:
                args = (list(args[0]), *args[1:])
                _check_join(args[0], owner)
            elif name == "replace" and _replaced_size(owner, *args[:3]) > MAX_VALUE:
                refuse(f"str.replace would make {_replaced_size(owner, *args[:3])} characters, over {MAX_VALUE}")
        return check_result(super().call(context, obj, *args, **kwargs), name)

    @staticmethod
    def concat_parts(parts: tuple) -> tuple:
        total = 0
        for p in parts:
            total += len(p) if isinstance(p, str) else weight(p)
            if total > MAX_VALUE:
                refuse(f"~ would make more than {MAX_VALUE} characters")
        charge(total, "~")
        return parts

    @staticmethod
    def _output(value):
        check_weight(value, "{{ }} output")
        return value
