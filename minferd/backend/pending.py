"""Kernel paths written where no GPU was at hand (a session's device time spent): each stays off
until its tests in tests/cuda have passed on one, and the session that sees them pass deletes its
entry here and the `ready` checks of it (and says so in bench/NOTES.md). Until then the path it
would replace runs.
Tests switch one on with monkeypatch (tests/cuda), so the new path is what they check; a device
call's bench with MINFERD_PENDING=name,... (read once, at import)."""
from __future__ import annotations

import re

from minferd.config import valve

# Session 15 saw moe_align, paired_ids, ids_bias, oai_act_q, qk_norm_pair and combine_norm pass
# on the H200 (bench/NOTES.md) and took them out. Session 16 measured fused_router, merge_in_split,
# norm_rope and glu_ids (their tests passed): each lost decode speed, so three went and norm_rope
# stays for prefills only (cuda_ops.NORM_ROPE_MIN_ROWS), where it won (NOTES).
PATHS: dict[str, str] = {
    "router_split": "float mat-vecs of <= 256 rows (MoE routers) with 4 warps a row splitting K (mmvq.cu "
                    "mmv_float's KW): test_mmvq.py test_float_split_k_is_the_reference",
    "grouped_bias": "gpt-oss's expert biases in the grouped prefill GEMM's epilogue, not gathered and added "
                    "(gemm_f16.cu's bias): test_moe_device.py test_fused_b_grouped_adds_each_tiles_expert_bias, "
                    "test_a_grouped_gpt_oss_prefill_with_biases_in_the_gemm_is_the_same",
    "oai_f16": "gpt-oss's prefill activation writes the f16 its down projection reads (cuda_ops' "
               "_swiglu_oai16), no cast pass: test_fused_ops.py test_swiglu_oai_leaves_its_f16",
    "wide_norm": "a decode row's rmsnorm_q and combine_rmsnorm_q with one float4 a thread (up to 512 threads, "
                 "cuda_ops._norm_threads): test_fused_ops.py test_rmsnorm_leaves_quantize_x_format, "
                 "test_combine_norm_is_combine_then_rmsnorm",
    "warp_topk": "an MoE's top-k in one warp a token, no barriers (moe.cu moe_topk_warp, E <= 256): "
                 "test_moe_device.py test_topk_is_route, test_topk_picks_distinct_experts_past_the_finite_logits",
}


def _run_anyway() -> set[str]:
    names = {n.strip() for n in (valve("MINFERD_PENDING") or "").split(",") if n.strip()}
    unknown = names - set(PATHS)
    if unknown:
        raise ValueError(f"MINFERD_PENDING names {', '.join(sorted(unknown))}, not pending paths ({', '.join(PATHS)})")
    return names


WAITING: set[str] = set(PATHS) - _run_anyway()


def tests(names=None) -> tuple[list[str], list[str]]:
    """(test files, test functions) in tests/cuda that the paths `names` (default: all of them)
    name: what `bench/device.sh pending` runs."""
    text = " ".join(PATHS[n] for n in sorted(PATHS if names is None else names))
    files = sorted(set(re.findall(r"\b(test_\w+)\.py\b", text)))
    functions = sorted(set(re.findall(r"\b(test_\w+)\b(?!\.py)", text)) - set(files))
    return [f"tests/cuda/{f}.py" for f in files], functions


def ready(name: str) -> bool:
    if name not in PATHS:
        raise KeyError(f"{name} is not a pending path ({', '.join(PATHS)})")
    return name not in WAITING
