"""A CUDA load compiles its model's kernel parts side by side before the first pass (backend
precompile -> kernels/precompile.py): after the load, every part of its types and head dim has
been compiled (or found in CuPy's disk cache) by this process."""
from __future__ import annotations

import pytest

pytest.importorskip("cupy")

from minferd.kernels import precompile  # noqa: E402
from minferd.model.loader import load_local  # noqa: E402


def test_a_load_compiles_its_models_parts(synth_model):
    lm = load_local(str(synth_model("qwen2", "q4_k")), "mmq", device="cuda", ctx=64)
    types = {w.qtype.ggml_id for w in lm.model.w.values()} | {0, 1}
    want = precompile.parts_for(types, {lm.spec.head_dim})
    assert want and all((0, stem, exprs) in precompile._done for stem, exprs in want)
