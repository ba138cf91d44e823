"""Shapes and names of mmvq_xs.cu, the x-stationary one-column mat-vec (mmvq.mmvq_group launches it
with `stationary=True`; the pending path mmvq_xs in the backend asks for it).

A launch's shape is (UPL, R, rpc): units of the row a thread owns, rows in flight a step, rows a
CTA. Its threads are the row's units over UPL, rounded up to whole warps (at most MAX_THREADS,
the kernel's launch bound, so a row has at most MAX_THREADS * UPL units: `fits`).
"""
from __future__ import annotations

from . import kernel
from .mmvq_shapes import shape_class
from .quant import TYPES, QuantType

Config = tuple[int, int, int]
# Guesses until bench/mmvq_xs.py has swept them on the H200: one unit a thread where a row is
# short (x's slice of a Q4_K unit is 20 registers), two on ffn_down's 18944-long rows (592 Q4_K
# units: 320 threads, not 608), more rows a CTA where rows are many.
CONFIGS: dict[str, dict[str, Config]] = {
    "Q4_K": {"few": (1, 2, 4), "mid": (1, 4, 8), "wide": (2, 2, 8), "tall": (1, 4, 16), "huge": (1, 4, 32)},
    "Q6_K": {"few": (1, 2, 4), "mid": (1, 4, 8), "wide": (2, 2, 8), "tall": (1, 4, 16), "huge": (1, 4, 32)},
}
TYPES_XS = tuple(CONFIGS)
VARIANTS = ((1, 2), (1, 4), (2, 2), (2, 4))  # (UPL, R) compiled for every type: the sweep's and the defaults'
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
    if qt.name not in CONFIGS:
        return False
    upl, _, rpc = config or CONFIGS[qt.name][shape_class(rows, K)]
    return threads(K, upl) <= MAX_THREADS and rpc * threads(K, upl) * 4 <= SMEM_BYTES


def shape(qt: QuantType, K: int, rows: int, config: Config | None = None) -> tuple[str, int, int, int]:
    """(kernel name, threads, rows a CTA, shared bytes) of a launch over matrices of at most `rows` rows."""
    upl, r, rpc = config or CONFIGS[qt.name][shape_class(rows, K)]
    if (upl, r) not in VARIANTS:
        raise ValueError(f"mmvq_xs: (UPL, R) = {(upl, r)} is not compiled ({VARIANTS})")
    nt = threads(K, upl)
    if not fits(qt, K, rows, (upl, r, rpc)):
        raise ValueError(f"mmvq_xs: {qt.name} K = {K} with {rpc} rows a CTA needs {nt} threads and"
                         f" {rpc * nt * 4} shared bytes (at most {MAX_THREADS} and {SMEM_BYTES})")
    return kernel_name(qt, upl, r), nt, rpc, rpc * nt * 4


def fn(name: str):
    return kernel("mmvq_xs", name, names())
