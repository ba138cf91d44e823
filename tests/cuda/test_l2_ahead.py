"""backend/l2_ahead.py on the device: a mat-vec that asks L2 for other weights (mmvq.cu's
l2_ahead) computes the same bits, and a decode graph captured with MINFERD_L2_AHEAD replays to
the logits of one captured without it, its launches each given a window of the stream."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except cp.cuda.runtime.CUDARuntimeError:
    pytest.skip("no CUDA device", allow_module_level=True)

from minferd.kernels import mmvq as mv  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from minferd.kernels.random_blocks import random_blocks  # noqa: E402
from tests.cuda.test_engine_cuda import _close_local_models, decode_step  # noqa: E402,F401 (its fixture)


@pytest.mark.parametrize("tname", ["Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("n", [1, 2])
def test_a_matvec_asking_l2_ahead_changes_no_bit(tname, n):
    qt, rows, K = TYPES[tname], 1000, 3584
    rng = np.random.default_rng(7)
    w = cp.asarray(random_blocks(qt, rows, K, rng))
    other = cp.asarray(random_blocks(qt, 3 * rows, K, rng))  # what a later node would read
    x = cp.asarray(rng.standard_normal((n, K)).astype(np.float32))
    outs = []
    for ahead in ((), ((other.data.ptr, other.nbytes // 16 * 16),),
                  ((other.data.ptr + 4096, 1 << 20), (w.data.ptr, w.nbytes // 32 * 16))):
        out = cp.zeros((n, rows), cp.float32)
        mv.mmvq(qt, w, x, out, ahead=ahead)
        outs.append(cp.asnumpy(out))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_ahead_pieces_are_checked():
    qt, K = TYPES["Q4_K"], 256
    w = cp.asarray(random_blocks(qt, 8, K, np.random.default_rng(1)))
    x, out = cp.ones((1, K), cp.float32), cp.zeros((1, 8), cp.float32)
    for bad in (((w.data.ptr + 8, 16),), ((w.data.ptr, 24),), ((w.data.ptr, 16),) * 3, ((0, 32),)):
        with pytest.raises(ValueError, match="prefetch"):
            mv.mmvq(qt, w, x, out, ahead=bad)


@pytest.mark.parametrize("path", ["w16", "mmq"])
@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("arch,quant", [("qwen2", "q4_k_m"), ("llama", "q8_0")])
def test_decode_graph_reading_ahead_changes_no_bit(synth_model, arch, quant, path, B, monkeypatch):
    from minferd.backend import cuda_graph
    plans = []
    real = cuda_graph.DecodeGraph._capture

    def spy(self):
        real(self)
        plans.append(self.be.ahead)

    monkeypatch.setattr(cuda_graph.DecodeGraph, "_capture", spy)
    outs = []
    for mb in ("0", "1"):
        monkeypatch.setenv("MINFERD_L2_AHEAD", mb)
        outs.append(decode_step(str(synth_model(arch, quant)), path, B))
    assert np.array_equal(outs[0], outs[1])
    assert plans[0] is None
    plan = plans[-1]
    if cp.cuda.Device().compute_capability >= "90":
        assert plan.planned and len(plan.windows) == len(plan.order) > 2, plan.order
        total = sum(n for launch in plan.order for _, n in launch)
        for pieces in plan.windows.values():  # each a window the size of its launch, less edge bytes
            assert len(pieces) <= mv.MAX_AHEAD and all(p % 16 == 0 and n % 16 == 0 for p, n in pieces)
            assert sum(n for _, n in pieces) <= total
        assert sum(1 for p in plan.windows.values() if p) > len(plan.windows) // 2
