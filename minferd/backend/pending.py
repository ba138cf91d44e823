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
# on the H200 (bench/NOTES.md) and took them out.
PATHS: dict[str, str] = {
    "glu_ids": "an MoE decode's gate, up and activation in one launch (mmvq.cu mmvq_ids_glu): "
               "test_moe_glu.py test_glu_is_paired_ids_then_act_gate, test_moe_decode_with_glu_matches_without",
    "norm_rope": "qwen3's q / k head norms inside rope_kv (ops.cu norm_rope_kv), one launch a layer fewer: "
                 "test_fused_ops.py test_norm_rope_kv_is_rmsnorm_pair_then_rope_kv",
    "merge_in_split": "decode attention's merge done by the last split CTA of each group (attn_decode_tail.cuh), "
                      "one launch a layer fewer: test_attn_merge.py test_the_last_split_merges_as_the_merge_kernel, "
                      "test_merging_in_the_split_survives_graph_replays",
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
