"""Session 49: a neox-rope model whose q and k rows are reordered per head (row 2i <- row i, row
2i+1 <- row i + D/2; biases and q/k head-norm weights likewise) and run with normal (adjacent
pair) rope gives the same logits, up to f32 rounding of the attention dot products' order. Why it
matters: with adjacent pairs, both rows of a rope pair sit in one warp group of the q/k mat-vec
(R even), so its epilogue could rotate them and write K (and V) into the cache itself, and decode
would drop the rope_kv node (s37: 3.6% of the 7B's token). A control run (rows reordered, rope
left neox) differs by ~25 on logits of ~200: the check is not vacuous.
    python bench/results/s49/rope_pairs_check.py"""
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from minferd.model.generate import prefill  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402

IDS = np.arange(300, 340)


def logits(lm):
    cache = lm.model.new_cache(lm.model.be.untracked(), len(IDS))
    return prefill(lm.model, IDS, cache, all_logits=True)


def reorder(lm, rope_type):
    s, m = lm.spec, lm.model
    d = s.head_dim
    perm = np.empty(d, np.int64)
    perm[0::2], perm[1::2] = np.arange(d // 2), np.arange(d // 2) + d // 2
    for i in range(s.n_layers):
        for name, heads in (("attn_q", s.n_heads), ("attn_k", s.n_kv_heads)):
            rows = (np.arange(heads)[:, None] * d + perm[None, :]).ravel()
            w = m.w[f"blk.{i}.{name}.weight"]
            w.data[...] = w.data[rows]
            if w.w16 is not None:
                w.w16[...] = w.w16[rows]
            if (b := m.w.get(f"blk.{i}.{name}.bias")) is not None:
                b.data[...] = b.data[rows]
        for norm in ("attn_q_norm", "attn_k_norm"):
            if (nw := m.w.get(f"blk.{i}.{norm}.weight")) is not None:
                nw.data[...] = nw.data[perm]
    m.spec = lm.spec = dataclasses.replace(s, rope_type=rope_type)


for path in sys.argv[1:] or ["/tmp/tiny.gguf", "gemma3-270m"]:
    for rope in ("normal", "neox"):
        lm = load_local(path, threads=2)
        ref = logits(lm)
        reorder(lm, rope)
        out = logits(lm)
        print(f"{path} ({lm.file.spec.rope_type} rope, head_dim {lm.spec.head_dim}): rows reordered, {rope} rope: "
              f"max |diff| {float(np.abs(out - ref).max()):.3g} of max |logit| {float(np.abs(ref).max()):.3g}, "
              f"argmax the same at every position: {bool((out.argmax(-1) == ref.argmax(-1)).all())}")
