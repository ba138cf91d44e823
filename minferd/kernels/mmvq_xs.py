"""Shapes and names of mmvq_xs.cu, the x-stationary one-column mat-vec (mmvq.mmvq_group launches it
with `stationary=True`; the pending path mmvq_xs in the backend asks for it).

A launch's shape is (UPL, R, rpc): units of the row a thread owns, rows in flight a step, rows a
CTA. Its threads are the row's units over UPL, rounded up to whole warps (at most MAX_THREADS,
the kernel's launch bound, so a row has at most MAX_THREADS * UPL units: `fits`).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..config import valve
from . import kernel
from .mmvq_shapes import CLASSES, shape_class
from .quant import TYPES, QuantType

Config = tuple[int, int, int]
# By type and shape class (mmvq_shapes.shape_class); None: mmvq runs that class. From bench/mmvq_xs.py
# on an H100 (s29, one call): gate/up (tall) 29.1 -> 25.0 us on the 7B at (1, 2, 32), the 8B's Q6_K
# ffn_down 26.6 -> 23.1 at (1, 2, 16) (the 7B's 18944-long rows need UPL 2 there, which lost: 34.5
# against 31.8, so that shape does not fit (1, 2, 16) and stays mmvq's), the output 1-2% at (1, 2, 8).
# Lost or mixed: k/v alone, q/k/v and o (the 7B's won 5-7%, the 8B's lost 4%), Q4_K ffn_down;
# not measured: None.
CONFIGS: dict[str, dict[str, Config | None]] = {
    "Q4_K": {"few": None, "mid": None, "wide": None, "tall": (1, 2, 32), "huge": None},
    "Q6_K": {"few": None, "mid": None, "wide": (1, 2, 16), "tall": None, "huge": (1, 2, 8)},
}


def _overridden(path: str | None) -> None:
    """MINFERD_MMVQ_XS_CONFIGS: a JSON file of {type: {class: [UPL, R, rpc] or null}} over CONFIGS
    (bench/mmvq_xs.py --pick writes one from a sweep, for a device call's A/B before it is committed)."""
    if path is None:
        return
    for t, classes in json.loads(Path(path).read_text()).items():
        if t not in CONFIGS or not set(classes) <= set(CLASSES):
            raise ValueError(f"MINFERD_MMVQ_XS_CONFIGS={path}: {t} {sorted(classes)} is not a type of {list(CONFIGS)}"
                             f" with classes of {list(CLASSES)}")
        CONFIGS[t].update({c: None if v is None else tuple(v) for c, v in classes.items()})


TYPES_XS = tuple(CONFIGS)
VARIANTS = ((1, 2), (1, 4), (2, 2), (2, 4))  # (UPL, R) compiled for every type: the sweep's and the defaults'
_overridden(valve("MINFERD_MMVQ_XS_CONFIGS"))
MAX_THREADS = 512  # mmvq_xs.cu's launch bound
SMEM_BYTES = 48 * 1024  # rpc x threads partial sums, under the default dynamic shared memory limit


def kernel_name(qt: QuantType, upl: int, r: int) -> str:
    return f"mmvq_xs<{qt.ggml_id}, {upl}, {r}>"


def names() -> tuple[str, ...]:
    return tuple(kernel_name(TYPES[t], upl, r) for t in TYPES_XS for upl, r in VARIANTS)


def threads(K: int, upl: int) -> int:
    """A CTA's threads: the row's units (32 elements each in both types' units) over UPL, whole warps."""
    return (K // 32 + upl - 1) // upl + 31 & ~31


def fits(qt: QuantType, K: int, rows: int, config: Config | None = None) -> bool:
    """Whether mmvq_xs runs this type and shape (its threads and shared memory in bounds)."""
    config = config or CONFIGS.get(qt.name, {}).get(shape_class(rows, K))
    if config is None:
        return False
    upl, _, rpc = config
    return threads(K, upl) <= MAX_THREADS and rpc * threads(K, upl) * 4 <= SMEM_BYTES


def shape(qt: QuantType, K: int, rows: int, config: Config | None = None) -> tuple[str, int, int, int]:
    """(kernel name, threads, rows a CTA, shared bytes) of a launch over matrices of at most `rows` rows."""
    if not fits(qt, K, rows, config):
        raise ValueError(f"mmvq_xs: {qt.name} K = {K}, {rows} rows: no config, or {config} does not fit"
                         f" (at most {MAX_THREADS} threads and {SMEM_BYTES} shared bytes)")
    upl, r, rpc = config or CONFIGS[qt.name][shape_class(rows, K)]
    if (upl, r) not in VARIANTS:
        raise ValueError(f"mmvq_xs: (UPL, R) = {(upl, r)} is not compiled ({VARIANTS})")
    nt = threads(K, upl)
    return kernel_name(qt, upl, r), nt, rpc, rpc * nt * 4


def fn(name: str):
    return kernel("mmvq_xs", name, names())
