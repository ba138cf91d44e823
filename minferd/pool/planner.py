"""Plan: which matmul path a model runs, and why (DESIGN.md, "Plan per model", in that order)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from minferd.config import W16_MIN_BYTES, valve
from minferd.devices import DeviceTraits, MatmulPath
from minferd.pool.estimator import Estimate
from minferd.units import fmt_bytes


@dataclass(frozen=True, slots=True)
class Plan:
    matmul_path: MatmulPath
    reason: str
    ctx: int
    kv_dtype: str
    bytes: dict  # kind -> bytes under this plan
    w16_bytes: int = 0  # what the f16 copy costs (the plan holds it only under W16)
    wants_w16: bool = False  # quantized only because the copy did not fit: promote it when it does

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def quantized_path(types, traits: DeviceTraits) -> tuple[MatmulPath, str]:
    """The path without the f16 copy for a model of these matmul types. MMQ's matmuls each take the
    gate table's kernel among those covering their type, so a type the mmq kernel lacks (an F32
    router, a Q2_K tensor) runs fused_b or dequantized tiles there and the rest keep mmq; only a
    model with no type mmq covers goes FUSED_B (the same kernels, never mmq)."""
    with_mmq = sorted(types & traits.path_types[MatmulPath.MMQ])
    others = sorted(types - traits.path_types[MatmulPath.MMQ])
    if not others:
        return MatmulPath.MMQ, "mmq covers every matmul type"
    if with_mmq:
        return MatmulPath.MMQ, f"mmq covers {', '.join(with_mmq)}; {', '.join(others)} through fused_b or tiles"
    return MatmulPath.FUSED_B, f"mmq has no kernel for {', '.join(others)}"


def plan(est: Estimate, traits: DeviceTraits, free: int, requested: MatmulPath | None = None,
         w16_min_bytes: int = W16_MIN_BYTES, env=os.environ) -> Plan:
    """Choose the path for a model whose costs are `est`, with `free` bytes in the pool now.
    Valves: MINFERD_FUSED_B=1 forces FUSED_B; MINFERD_NO_W16CACHE=1 forbids W16."""
    kv_dtype = "f16" if traits.kv_elem_bytes == 2 else "f32"

    def make(path: MatmulPath, reason: str, wants_w16: bool = False) -> Plan:
        if path == MatmulPath.W16 and est.expert_bytes:
            # Each token reads a few experts: their copy would cost most of the model's memory for
            # a fraction of its reads, so a mixture's copy covers the dense weights only.
            reason += (f"; the copy covers the dense weights (attention, output) only, not the experts and "
                       f"routers ({fmt_bytes(est.expert_bytes)}, run quantized)")
        return Plan(path, reason, est.ctx, kv_dtype, est.by_kind(path == MatmulPath.W16), est.w16, wants_w16)

    q_path, q_why = quantized_path(est.matmul_types, traits)
    no_w16 = valve("MINFERD_NO_W16CACHE", env) == "1"
    fits = est.total(True) <= free
    does_not_fit = f"the f16 copy needs {fmt_bytes(est.total(True))} in all, {fmt_bytes(free)} free"
    if valve("MINFERD_FUSED_B", env) == "1":
        return make(MatmulPath.FUSED_B, "MINFERD_FUSED_B=1")
    if requested == MatmulPath.W16:
        if no_w16:
            return make(q_path, f"w16 requested but MINFERD_NO_W16CACHE=1; {q_why}")
        return make(MatmulPath.W16, "requested") if fits else \
            make(q_path, f"w16 requested but {does_not_fit}; {q_why}", wants_w16=True)
    if requested == MatmulPath.MMQ:
        return make(q_path, "requested" if q_path == MatmulPath.MMQ else f"mmq requested but {q_why[4:]}")
    if requested == MatmulPath.FUSED_B:
        return make(MatmulPath.FUSED_B, "requested")
    if no_w16:
        return make(q_path, f"MINFERD_NO_W16CACHE=1; {q_why}")
    # The gate keeps small models (test fixtures) from the copy's footprint: it reads the model's
    # size, so a mixture's experts count, though its copy covers the dense weights only (the
    # 30b-a3b's 736 MiB of dense weights alone kept a 17 GiB model from the copy).
    size = est.matmul_bytes + est.expert_bytes
    sized = f"quantized matmul weights {fmt_bytes(size)}" + (" (the experts' included)" if est.expert_bytes else "")
    if size < w16_min_bytes:
        return make(q_path, f"{sized} are under the w16 gate of {fmt_bytes(w16_min_bytes)}; {q_why}")
    if not fits:
        return make(q_path, f"{does_not_fit}; {q_why}", wants_w16=True)
    return make(MatmulPath.W16, f"{sized} reach the w16 gate and the f16 copy (+{fmt_bytes(est.w16)}) fits")
