"""MINFERD_X_PLANES=1: the mat-vec module compiled with MINFERD_X_ONE_PLANE reads x's first int8
plane alone, x = d * q_hi per 32 elements (llama.cpp's q8_1). Kernel modules are cached per
process, so the valve's side runs in a subprocess of its own.

Where a type's values are signed integers (Q8_0, Q6_K, Q3_K), the product is exactly x's
one-plane rounding times the weights: the kernel matches that reference to f32 summation (1e-5),
and the default two planes do not (they are ~1e-5 from the exact x). Q4_K's minimum and Q5_0's
offset use x's exact block sum, so those only have q8_1's error bound against the exact x."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cupy")

ROOT = Path(__file__).resolve().parents[2]

# In the subprocess: each type's rel err against the exact x and against x's one-plane rounding.
SCRIPT = r"""
import json, sys
import numpy as np, cupy as cp
from minferd.kernels.mmvq import mmvq
from minferd.kernels.quant import TYPES
from minferd.kernels.random_blocks import random_blocks
from tests.cuda.conftest import matmul_reference, rel_err

def one_plane(x):
    b = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(b).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(np.divide(b, d, out=np.zeros_like(b), where=d > 0)), -127, 127)
    return (q * d).reshape(x.shape)

got = {}
for name in sys.argv[1:]:
    qt = TYPES[name]
    rng = np.random.default_rng(qt.ggml_id)
    raw = random_blocks(qt, 515, 3584, rng)
    for n in (1, 2):
        x = rng.standard_normal((n, 3584)).astype(np.float32)
        out = cp.full((n, 515), np.nan, cp.float32)
        mmvq(qt, cp.asarray(raw), cp.asarray(x), out)
        got[f"{name} n={n}"] = (rel_err(out, matmul_reference(qt, raw, x)),
                                rel_err(out, matmul_reference(qt, raw, one_plane(x))))
print(json.dumps(got))
"""
EXACT_TYPES = ("Q8_0", "Q6_K", "Q3_K")


def errors(planes: str) -> dict[str, tuple[float, float]]:
    env = dict(os.environ, MINFERD_X_PLANES=planes, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    run = subprocess.run([sys.executable, "-c", SCRIPT, *EXACT_TYPES, "Q4_K", "Q5_0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_one_plane_is_x_rounded_once_times_the_weights():
    one, two = errors("1"), errors("2")
    for key, (exact, rounded) in one.items():
        assert exact < 5e-2, f"{key}: {exact:.2e} from the exact x, past q8_1's bound"
        if key.split()[0] in EXACT_TYPES:
            assert rounded < 1e-5, f"{key}: {rounded:.2e} from x's one-plane rounding"
            assert two[key][1] > 10 * rounded, f"{key}: two planes as near the one-plane x ({two[key][1]:.2e})"
    for key, (exact, _) in two.items():
        assert exact < 1e-4, f"{key}: two planes {exact:.2e} from the exact x"
    assert np.median([e for e, _ in one.values()]) > 10 * np.median([e for e, _ in two.values()])
