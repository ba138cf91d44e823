"""argparse types for numeric flags: a value outside its range is a one-line usage error, not a
traceback from deep inside (a negative --max-tokens reached protobuf's uint32 field and raised
ValueError there). The ranges are the wire types' and the obvious signs; what a value means
(max_tokens within the model's context, ...) the daemon checks and answers in one line."""
from __future__ import annotations

import argparse
import math
import sys

UINT32 = (1 << 32) - 1
INT32 = (1 << 31) - 1
UINT64 = (1 << 64) - 1


def int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n} is outside [{lo}, {hi}]")
        return n
    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def real_in(lo: float, hi: float = math.inf, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = x > lo if lo_open else x >= lo
        if not (math.isfinite(x) and low_ok and x <= hi):
            left = "(" if lo_open else "["
            right = "]" if math.isfinite(hi) else ")"
            raise argparse.ArgumentTypeError(f"{text} is outside {left}{lo:g}, {hi:g}{right}")
        return x
    parse.__name__ = "number"
    return parse


positive_int = int_in(1, UINT32)
nonneg_int = int_in(0, UINT32)


class TokenFlagGone(argparse.Action):
    """`--token T` put the token where every local user reads it (/proc/PID/cmdline). Refused in
    one line that never repeats the value; defined so that argparse does not take `--token` as an
    abbreviation of --token-file and echo the token as a file name."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: --token is gone (argv is readable by every local user): "
              f"use --token-file FILE or MINFERD_TOKEN", file=sys.stderr)
        parser.exit(2)
