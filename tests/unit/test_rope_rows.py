"""model/rope_rows.py: a neox model loaded with its q / k rows reordered and run with normal rope
(what a backend that asks for it gets: the CUDA backend on the pending path qkv_rope) computes the
logits the file's own layout does, to f32 rounding."""
import numpy as np
import pytest

from minferd.backend.cpu import CpuBackend
from minferd.model import rope_rows
from minferd.model.generate import prefill
from minferd.model.loader import load_local

IDS = np.arange(300, 340)


def logits(path):
    lm = load_local(path, threads=2)
    cache = lm.model.new_cache(lm.model.be.untracked(), len(IDS))
    return prefill(lm.model, IDS, cache, all_logits=True), lm.model.spec


@pytest.mark.parametrize("quant", ["q8_0", "q4_k"])
def test_a_reordered_neox_model_says_the_same(synth_model, quant, monkeypatch):
    path = str(synth_model("qwen2", quant))  # neox rope, q / k / v biases
    ref, spec = logits(path)
    assert spec.rope_type == "neox" and rope_rows.applies(spec)
    monkeypatch.setattr(CpuBackend, "pairs_rope_rows", lambda self, spec: rope_rows.applies(spec))
    got, spec = logits(path)
    assert spec.rope_type == "normal"
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    # the reorder is not a no-op: kept with neox rope, the same rows say something else
    monkeypatch.setattr(rope_rows, "as_reordered", lambda spec: spec)
    wrong, _ = logits(path)
    assert np.abs(wrong - ref).max() > 1e-2 * np.abs(ref).max()


def test_only_q_and_k_rows_move(synth_model):
    from minferd.model.loader import open_model_file
    spec = open_model_file(str(synth_model("qwen2", "q8_0"))).spec
    d, hq = spec.head_dim, spec.n_heads
    raw = np.arange(hq * d * 4, dtype=np.uint32).view(np.uint8).reshape(hq * d, 16)
    out = rope_rows.reordered(spec, "blk.0.attn_q.weight", raw)
    rows = out.view(np.uint32)[:, 0] // 4  # each row's original index
    assert rows[:4].tolist() == [0, d // 2, 1, d // 2 + 1] and rows[d].item() == d
    bias = np.arange(hq * d, dtype=np.float32).view(np.uint8).reshape(1, -1)
    assert rope_rows.reordered(spec, "blk.3.attn_q.bias", bias).view(np.float32)[0, :3].tolist() == [0, d // 2, 1]
    for name in ("blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.10.attn_q_norm.weight"):
        assert rope_rows.reordered(spec, name, raw) is raw
