"""Kernel paths written where no GPU was at hand (a session's device time spent): each stays off
until its tests in tests/cuda have passed on one, and the session that sees them pass deletes its
entry here and the `ready` checks of it (and says so in bench/NOTES.md). Until then the path it
would replace runs.
Tests switch one on with monkeypatch (tests/cuda), so the new path is what they check; a device
call's bench with MINFERD_PENDING=name,... (read once, at import)."""
from __future__ import annotations

import re

from minferd.config import valve

PATHS = {
    "moe_align": "an MoE prefill's layout made on the device (kernels/moe.py align), and so its prefill graphs: "
                 "test_moe_device.py test_align_is_the_hosts_align, test_the_devices_layout_changes_no_bit; "
                 "test_prefill_graph.py test_an_moe_prefill_through_its_graph_equals_the_eager_pass",
    "paired_ids": "an MoE decode's gate and up in one mmvq_ids launch: test_moe_device.py test_mmvq_ids_pairs_gate_and_up",
    "ids_bias": "gpt-oss's expert biases added in mmvq_ids' epilogue (six launches a decode layer fewer): "
                "test_moe_device.py test_mmvq_ids_adds_each_picks_expert_bias",
    "oai_act_q": "gpt-oss's clamped SwiGLU leaving down's mat-vec format itself (act_gate_q act 2): "
                 "test_fused_ops.py test_act_gate_oai_is_swiglu_oai",
    "combine_norm": "an MoE decode's weighted sum and the next layer's input norm in one launch (ops.cu "
                    "combine_rmsnorm_q): test_fused_ops.py test_combine_norm_is_combine_then_rmsnorm; test_moe_device.py "
                    "test_the_norm_made_ahead_changes_no_bit",
    "qk_norm_pair": "q's and k's head norms in one launch (ops.cu rmsnorm_pair): test_fused_ops.py "
                    "test_rmsnorm_pair_is_two_rmsnorms",
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
