"""mmvq_ids_glu (an MoE decode's gate, up and gated activation in one launch) against mmvq_ids
paired and act_gate_q, the two launches it replaces: g, u, y and y's mat-vec format bit for bit;
and tiny qwen3moe / gpt-oss decode steps with it on and off: the same logits, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minferd.backend import pending  # noqa: E402
from minferd.backend.cuda import CudaBackend, DeviceMemory  # noqa: E402
from minferd.kernels.mmvq import glu_config, scratch_bytes  # noqa: E402
from minferd.kernels.mmvq_ids import ids_config, mmvq_ids, mmvq_ids_glu  # noqa: E402
from minferd.kernels.quant import TYPES  # noqa: E402
from tests.conftest import MOE_TYPES  # noqa: E402
from tests.cuda.conftest import poisoned  # noqa: E402
from tests.cuda.test_attn_decode import _xq_regions  # noqa: E402
from tests.cuda.test_moe_cuda import decode_step_on_both  # noqa: E402
from tests.cuda.test_moe_device import two_stacks  # noqa: E402


@pytest.fixture
def be():
    b = CudaBackend(DeviceMemory())
    b.stream = cp.cuda.Stream.null  # where the inputs are made (test_fused_ops.py says why)
    return b


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "MXFP4", "Q5_0", "IQ4_XS"])
@pytest.mark.parametrize("act,biased", [("silu", False), ("oai", True), ("oai", False)])
@pytest.mark.parametrize("R,P,k", [(96, 8, 8), (64, 8, 4), (32, 2, 1)])
def test_glu_is_paired_ids_then_act_gate(be, name, act, biased, R, P, k, to_device):
    """One launch equals mmvq_ids (gate and up paired, the same warp shape) then act_gate_q: g, u,
    y and y's int8 format, bit for bit (R rows an expert: one, two and three 32-row blocks)."""
    qt, E = TYPES[name], 6
    w, w2, xd, ids, scratch, rng = two_stacks(qt, 3, to_device, E, R, P, k)
    b, b2 = (cp.asarray(rng.standard_normal((E, R)).astype(np.float32)) if biased else None for _ in range(2))
    nw, _, r, unr = glu_config(ids_config(qt, R))
    g0, u0 = (poisoned((P, R), cp.float32) for _ in range(2))
    mmvq_ids(qt, w, E, xd, ids, k, g0, scratch=scratch, w2=w2, out2=u0, bias=b, bias2=b2, config=(nw // 2, 1, r, unr))
    g, u, y = (poisoned((P, R), cp.float32) for _ in range(3))
    ys = cp.zeros(scratch_bytes(P, R), cp.uint8)
    mmvq_ids_glu(qt, w, w2, E, xd, ids, k, g, u, y, act, scratch=scratch, y_scratch=ys, alpha=1.702, limit=7.0,
                 bias=b, bias2=b2)
    assert cp.array_equal(g, g0) and cp.array_equal(u, u0)
    with be.scope():
        want = be._act_gate(g0, u0, 0) if act == "silu" else be._act_gate(g0, u0, 2, 1.702, 7.0)
        theirs = be._quantized(want)
        assert cp.array_equal(y, want)
        for a, c in zip(_xq_regions(ys, P, R), _xq_regions(theirs, P, R)):
            assert np.array_equal(a, c), "the fused activation's int8 copy differs from act_gate_q's"


def test_glu_refuses_what_it_cannot_do(to_device):
    qt, E, R, P, k = TYPES["Q8_0"], 4, 40, 4, 4
    w, w2, xd, ids, scratch, _ = two_stacks(qt, 5, to_device, E, R, P, k)
    g, u, y = (cp.zeros((P, R), cp.float32) for _ in range(3))
    ys = cp.zeros(scratch_bytes(P, R), cp.uint8)
    with pytest.raises(ValueError, match="rows % 32 == 0"):
        mmvq_ids_glu(qt, w, w2, E, xd, ids, k, g, u, y, "silu", scratch=scratch, y_scratch=ys)
    w, w2, xd, ids, scratch, _ = two_stacks(qt, 5, to_device, E, 32, P, k)
    g, u, y = (cp.zeros((P, 32), cp.float32) for _ in range(3))
    with pytest.raises(ValueError, match="act one of"):
        mmvq_ids_glu(qt, w, w2, E, xd, ids, k, g, u, y, "relu", scratch=scratch, y_scratch=ys)
    with pytest.raises(ValueError, match="y must be C-contiguous float32"):
        mmvq_ids_glu(qt, w, w2, E, xd, ids, k, g, u, y[:, :16], "silu", scratch=scratch, y_scratch=ys)


@pytest.mark.parametrize("quant", MOE_TYPES)
@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_moe_decode_with_glu_matches_without(synth_model, arch, quant, monkeypatch):
    """A decode step of five sequences (a captured graph where the model's step is one) with the
    fused launch and without: the same logits bit for bit, both times."""
    monkeypatch.setenv("MINFERD_DEVICE_MOE", "1")
    got = {}
    for on in (False, True):
        monkeypatch.setattr(pending, "WAITING", pending.WAITING - {"glu_ids"} if on else pending.WAITING | {"glu_ids"})
        _, gpu, again, _ = decode_step_on_both(str(synth_model(arch, quant)), "w16", seed=5)
        assert np.array_equal(gpu, again)
        got[on] = gpu
    assert np.array_equal(got[False], got[True])
