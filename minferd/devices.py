"""What the planner needs to know about a device kind, importable without CuPy or a GPU: the
matmul paths, which tensor types each path covers, KV element size, and scratch per batch.
(`minferd plan --device cuda --budget 80GiB` runs on a laptop.)"""
from __future__ import annotations

import enum
from dataclasses import dataclass

ALL_TYPES = frozenset(("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                       "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
QUANT_TYPES = ALL_TYPES - {"F32", "F16", "BF16"}


class MatmulPath(str, enum.Enum):
    """How a model's prefill matmuls read quantized weights (DESIGN.md, "The problem it solves")."""

    W16 = "w16"  # resident f16 copy, dense GEMM
    MMQ = "mmq"  # int8-quantized activations x quantized weights
    FUSED_B = "fused_b"  # dequantize weight tiles inside the GEMM


@dataclass(frozen=True, slots=True)
class DeviceTraits:
    kind: str  # "cpu" | "cuda"
    kv_elem_bytes: int
    path_types: dict  # MatmulPath -> frozenset of type names the path's kernels cover
    scratch_fixed: int = 0  # bytes of scratch whatever the model
    default_headroom: int = 0


def cpu_traits(threads: int) -> DeviceTraits:
    from minferd.backend.cpu import scratch_bytes  # NumPy only
    every = {p: ALL_TYPES for p in MatmulPath}
    return DeviceTraits("cpu", 4, every, scratch_fixed=scratch_bytes(threads))


def cuda_traits() -> DeviceTraits:
    # Int8 MMQ kernels exist for the quantized types only: float weights go through FUSED_B.
    paths = {MatmulPath.W16: ALL_TYPES, MatmulPath.MMQ: QUANT_TYPES, MatmulPath.FUSED_B: ALL_TYPES}
    return DeviceTraits("cuda", 2, paths, default_headroom=1 << 30)
