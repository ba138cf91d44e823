"""Issue 6's pool scenario at full size on the device: three Qwen2.5-7B-shaped Q4_K_M models
(28 layers, random blocks) and a budget that holds one f16 copy. The first runs W16, the other
two MMQ; each generates; unloading the W16 one promotes the most recently used other; the
ledger equals CuPy's pool and stays within the budget throughout.
"""
from __future__ import annotations

import pytest

cp = pytest.importorskip("cupy")

from minferd.backend.cuda import CudaBackend  # noqa: E402
from minferd.devices import MatmulPath, cuda_traits  # noqa: E402
from minferd.host import Host, LoadOptions  # noqa: E402
from minferd.model.loader import open_model_file  # noqa: E402
from minferd.model.sampler import SamplingParams  # noqa: E402
from minferd.model.synth import write_model  # noqa: E402
from minferd.pool.estimator import estimate  # noqa: E402


def test_three_7b_models_one_w16_copy(tmp_path, device_memory):
    files = {}
    for i, name in enumerate("abc"):
        files[name] = str(tmp_path / f"{name}.gguf")
        write_model(files[name], "qwen2", "7b", "q4_k_m", seed=i, random_blocks_=True)
    traits = cuda_traits()
    est = estimate(open_model_file(files["a"]), traits, 512)
    # One f16 copy (13 GiB, about twice a model's quantized footprint), never two.
    budget = 3 * est.total(False) + est.w16 + (256 << 20)
    assert est.w16 > est.total(False) + (256 << 20)
    mem = device_memory(budget)
    h = Host(lambda **kw: CudaBackend(mem, **kw), mem, traits, budget, device="cuda:0")

    def check():
        cp.cuda.Stream.null.synchronize()
        assert h.ledger.held() == h.allocator.held_bytes() == mem.used_bytes() <= budget

    for k in "abc":
        h.load(k, files[k], LoadOptions(ctx=512))
        check()
    paths = [h.models[k].ws.current_path(traits) for k in "abc"]
    assert paths == [MatmulPath.W16, MatmulPath.MMQ, MatmulPath.MMQ], [h.models[k].ws.plan.reason for k in "abc"]
    for k in "abcb":  # b last: the most recently used of the two quantized ones
        r = h.generate(k, list(range(300, 364)), SamplingParams(temperature=0, max_tokens=8))
        assert len(r.token_ids) == 8
        check()
    h.unload("a")
    check()
    assert h.events[-1] == "promoted b", h.events
    assert h.models["b"].ws.current_path(traits) == MatmulPath.W16
    assert h.models["c"].ws.current_path(traits) == MatmulPath.MMQ
    h.generate("b", list(range(300, 364)), SamplingParams(temperature=0, max_tokens=4))
    h.unload_all()
    check()
    assert h.ledger.held() == 0 == mem.used_bytes()
