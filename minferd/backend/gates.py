"""Which prefill kernel runs a matmul: the fastest one the model's plan allows, from a table of
kernel times measured on the H200 (prefill_gates_h200.json, made by bench/crossover.py).

A kernel +40% at one shape can be -63% at another (the seeds' field notes), so nothing here is
a rule of thumb: a matmul of type T, shape N x K and n tokens takes the table's row of the same
type (Q4_K's where T was not measured, or only at shapes farther than Q4_K's nearest), the nearest
measured shape and the nearest n, and the lowest time among the kernels allowed, or the first
allowed within TIE of it (the timing noise of small matmuls must not flip a model between
kernels). Nothing measured: the first allowed.

Another GPU: measure it (`python bench/crossover.py --table my_gpu.json`) and point
MINFERD_GATE_TABLE at the file; until then the H200's table is used and the daemon says so.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
from pathlib import Path

from minferd.config import valve
from minferd.errors import InvalidRequest

TABLE = Path(__file__).with_name("prefill_gates_h200.json")
log = logging.getLogger("minferd")
TIE = 1.10
PROXY_TYPE = "Q4_K"  # the most measured type: its shape/batch behaviour stands in for the others


@functools.lru_cache(maxsize=None)
def _table(path: Path) -> dict:
    try:
        table = json.loads(path.read_text())
        rows = table["rows"]
        for r in rows:
            if not (isinstance(r["type"], str) and min(r["N"], r["K"], r["n"]) > 0 and isinstance(r["us"], dict)):
                raise ValueError(f"bad row {r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidRequest(f"prefill gate table {path}: not a table bench/crossover.py wrote ({e})") from None
    return table


@functools.lru_cache(maxsize=None)
def _rows(path: Path = TABLE) -> dict:
    by_type: dict[str, list] = {}
    for r in _table(path)["rows"]:
        by_type.setdefault(r["type"], []).append(r)
    return by_type


def table_path(env=os.environ) -> Path:
    return Path(valve("MINFERD_GATE_TABLE", env) or TABLE)


@functools.lru_cache(maxsize=None)
def check_device(device_name: str, path: Path) -> bool:
    """Whether the table was measured on this GPU; warns once per (GPU, table) when not."""
    measured = _table(path).get("device", "?")
    if measured != device_name:
        log.warning("prefill kernel gates: %s was measured on %s, this is %s; measure this GPU with "
                    "`python bench/crossover.py --table FILE` and set MINFERD_GATE_TABLE=FILE",
                    path.name, measured, device_name)
    return measured == device_name


def _log_gap(a: int, b: int) -> float:
    return abs(math.log(a) - math.log(b))


@functools.lru_cache(maxsize=4096)
def choose(allowed: tuple[str, ...], qtype: str, N: int, K: int, n: int, path: Path = TABLE) -> str:
    """The kernel (one of `allowed`, in order of preference where unmeasured) for x (n, K) @ W (N, K).T."""
    by_type = _rows(path)
    if len(allowed) == 1:
        return allowed[0]

    def gap(s):
        return _log_gap(s[0], N) + _log_gap(s[1], K)
    # The type's own nearest shape, unless the proxy measured one strictly nearer (Q8_0 timed only
    # at the 0.5B's widths says little of a 7B-wide Q8_0 matrix that Q4_K's 7B rows do not).
    nearest = {t: min({(r["N"], r["K"]) for r in by_type[t]}, key=gap) for t in (qtype, PROXY_TYPE) if t in by_type}
    if not nearest:
        return allowed[0]
    own = nearest.get(qtype)
    t = qtype if own and (PROXY_TYPE not in nearest or gap(own) <= gap(nearest[PROXY_TYPE])) else PROXY_TYPE
    same = [r for r in by_type[t] if (r["N"], r["K"]) == nearest[t]]
    row = min(same, key=lambda r: _log_gap(r["n"], n))
    timed = [k for k in allowed if k in row["us"]]
    if not timed:
        return allowed[0]
    best = min(row["us"][k] for k in timed)
    return next(k for k in timed if row["us"][k] <= best * TIE)
