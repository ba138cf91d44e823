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
# stays for prefills only (cuda_ops.NORM_ROPE_MIN_ROWS), where it won (NOTES). Session 17 saw
# router_split, warp_topk, grouped_bias and oai_f16 pass and win, and took them out; wide_norm
# passed but cost the dense models' decode (0.5B -11%, 7B -4%) and went. Session 18 saw
# weight_prefetch (mat-vec CTAs asking L2 for their rows before pdl_enter) and mmvq_wave (a
# resident wave of mat-vec CTAs walking the rows) pass and lose (7B decode 386.7 -> 338.8 tok/s
# with the prefetch; every wave slower than a CTA a share): both went.
# Session 20 wrote q6k_units16; session 21 saw it pass (18 tests) and win at K <= 4096, and took it
# out (cuda_matmul.UNITS16_MAX_K). Session 21 wrote deferred_norm (the rmsnorm between decode
# mat-vecs folded into both: x * w and block sums of squares left by the producer, the scale
# applied by the consumers); session 22 saw its 39 tests pass and lose (0.5B decode 1195.5 -> 1008.0
# tok/s, 7B 386.4 -> 381.1): the producer's tail (fence, counter atomic, the last CTA's L2 reads)
# costs more than the norm's own node under programmatic launch. It went. Session 24 saw early_weights
# (mmvq and tcgemv fetching their first weights before pdl_enter) pass and change nothing (7B decode
# 400.7 / 401.9 tok/s without, 402.9 / 389.9 with, in turns in one call): it went. Session 24 also
# wrote and measured mmvq_stream (one decode column's rows into shared memory by bulk copies,
# persistent CTAs): its 48 tests passed, but the big Q4_K matrices ran 15-25% slower than mmvq and
# the 7B decoded at 295-302 tok/s against 406: the weights' side was not the limit (NOTES s24). It went.
# Session 24 saw norm_w_ahead (the decode norms' weights read before pdl_enter) pass its tests and
# win a little on every dense model, against the old code in the same call, and took it out.
# Session 25 saw tc_group (a short prefill's q/k/v and gate/up in one tcgemv launch each) pass and win
# (16-token TTFT -0.3 to -0.4 ms) and took it out; attn_out16 (attention past 8 rows writing its
# output's f16 rounding, no cast launch) passed its tests and measured no gain (within the spread,
# if anything slower on all three models): it went. Session 26 saw one_row (a short prompt's last
# row's logits alone) and tc_small (3-8 rows through tcgemv) pass (21 tests) and win (the 7B's
# 8-token prompt 8.96 -> 3.75 ms in the engine) and took them out. Session 27 saw tc_chunks (65-256
# rows through tcgemv in launches of 64) pass its tests and lose (the 7B's 65-256-token prompts 0.1-0.6
# ms slower in the engine, the 0.5B's 256 1.5 ms slower, 128 0.2-0.5 faster): it went. It saw
# graph_tiles (dequantized tiles inside graphs) pass (8 tests) and win (the 0.5B's 128-token prompt
# 5.02 -> 3.06 ms in the engine, 512 6.36 -> 4.08) and took it out. Session 29 wrote mmvq_xs (one
# decode column with each thread's slice of x held in registers, only weight bytes in the row loop):
# its tests passed on an H100 and alone it beat mmvq on gate/up (29.1 -> 25.0 us) and the 8B's Q6_K
# ffn_down (26.5 -> 23.4), but inside the decode graphs it lost (8B 348.6 / 348.7 -> 331.5 / 323.6
# tok/s in turns in one call; the 7B within the spread): it went (bench/results/s29, NOTES).
# Session 28 wrote caller_steps (a request that finds its engine idle runs its first step on its own
# thread, on CUDA a graph's replay only); session 29 saw its tests pass; session 31 measured it under
# 16 busy loops on an H100's host (TTFT 2.5-3x lower, NOTES) and at rest (within the spread) and took
# it out.
# Session 35 wrote q4k_wide (Q4_K's one-column mat-vec in units of a whole 32-byte run, 27% fewer
# instructions); session 36 saw its 34 tests pass on an H100 and lose (7B decode 402.7 / 402.7 ->
# 376.2 / 376.3 tok/s in turns; ncu: 72 registers, occupancy 55 -> 42%, the same long-scoreboard
# stalls: the mat-vec waits on memory, not on issue). It went.
# Session 37 measured (decode graphs with nodes left out, an H100) that the 7B's 57 rmsnorm_q nodes
# cost 0.18 ms of its 2.68 ms token, and wrote norm_pre (the decode norm over a CTA for each 8 blocks,
# each warp's values read with the row's sum); session 38 saw its 11 tests pass on an H100 and win
# (7B decode 2.681 / 2.680 -> 2.636 / 2.633 ms a token in turns in one call, the 0.5B's 0.731 / 0.732
# -> 0.727 / 0.729) and made it rmsnorm_q.
# Session 38 wrote norm16 (rmsnorm_q's arithmetic for 3-64 rows, writing f32 and f16), saw its tests
# pass on an H100 and win (the 7B's 16-token prompt 4.12 -> 3.94 ms in the engine, medians of 10,
# the 8B's likewise) and made it rmsnorm_h.
# Session 39 wrote glu (a 3-32-row MLP's gated activation made in the gate / up tcgemv launch, half a
# CTA's warps on each matrix: no activation node, no f32 gate / up), saw its 235 tests pass on an H100
# and measure no gain (16-token engine share in turns: 7B 3.84 / 3.87 -> 3.80 / 3.82 ms, 0.5B 1.36 /
# 1.37 -> 1.44 / 1.39): it went (bench/results/s39/glu.patch, NOTES).
# Session 40 wrote l2_ahead (each decode mat-vec launch's CTAs asking L2, by cp.async.bulk.prefetch
# from one thread before pdl_enter, for the weights MINFERD_L2_AHEAD megabytes further down the token's
# byte stream, planned from a first capture's launch order); its tests passed on an H100 bar one test
# bug, and it lost at every distance (7B decode 2.598 / 2.593 ms a token off, 2.740 / 2.738 at 16 MB,
# 2.789 at 8, 2.893 at 32; the 0.5B 0.726 -> 0.738): it went (bench/results/s40/l2_ahead.patch, NOTES).
# Session 46 wrote q4k_words (Q4_K's one-column mat-vec walked by 16-byte words, a warp's loads on
# 512 consecutive bytes, block headers shuffled between lanes), saw its 34 tests pass on an H100 and
# lose (7B decode 2.512 / 2.516 -> 2.690 / 2.696 ms a token in turns; its kernels 15-17% slower on
# gate/up and down): it went (bench/results/s46/q4k_words.patch, NOTES).
# Session 49 wrote qkv_rope (a decode step's q / k / v mat-vecs end in rope_kv's work: one node a layer
# fewer; a neox model's q / k rows stored reordered so rope pairs are adjacent rows, model/rope_rows.py).
PATHS: dict[str, str] = {
    "qkv_rope": "q / k / v mat-vecs with rope and the KV write in their epilogue (kernels/mmvq_rope_kv.py, "
                "cuda_matmul.qkv_rope_kv, model/rope_rows.py): test_qkv_rope.py "
                "test_the_launch_is_mmvq_then_rope_kv_bit_for_bit, test_off_or_past_the_matvec_rows_it_declines, "
                "test_a_model_decodes_the_same_with_the_path_on, test_the_launcher_refuses_bad_arguments",
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
