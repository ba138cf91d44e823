"""The seeds' scenario: blind f16 warming of every model ran a shared test pool out of memory.
Here a 0.5b-, 1.5b- and 7b-like trio (scaled down by the same factor, the w16 gate with them)
loads into a budget that cannot hold every f16 copy: the small two keep their quantized
footprint, the big one goes W16; a fourth load that needs the room demotes it instead of
failing, and unloading the fourth promotes it back."""
import pytest

from minferd.backend.cpu import CpuBackend, HostMemory
from minferd.devices import MatmulPath, cpu_traits
from minferd.host import Host, LoadOptions
from minferd.model.loader import open_model_file
from minferd.model.synth import write_model
from minferd.pool.estimator import estimate

# Qwen2.5 widths 896 / 1536 / 3584 scaled by 1/7 (and rounded to whole 256-element super-blocks).
SHAPES = {"0.5b": dict(hidden=256, ffn=768), "1.5b": dict(hidden=256, ffn=1280), "7b": dict(hidden=512, ffn=2816)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeds")
    out = {}
    for name, shape in {**SHAPES, "other": dict(hidden=512, ffn=1536)}.items():
        out[name] = str(d / f"{name}.gguf")
        write_model(out[name], "qwen2", "tiny", "q4_k_m", overrides=dict(shape, layers=4, head_dim=64, heads=shape["hidden"] // 64))
    return out


def test_seeds_scenario(files):
    traits = cpu_traits(1)
    est = {k: estimate(open_model_file(p), traits, 256) for k, p in files.items()}
    gate = (est["1.5b"].matmul_bytes + est["7b"].matmul_bytes) // 2  # the 7b passes, the others do not
    quantized = sum(est[k].total(False) for k in SHAPES)
    capacity = quantized + est["7b"].w16 + est["0.5b"].w16 // 2  # one f16 copy, never all of them
    mem = HostMemory()
    h = Host(lambda **kw: CpuBackend(1, mem, **kw), mem, traits, capacity, w16_min_bytes=gate, default_parallel=1)
    for k in SHAPES:
        h.load(k, files[k], LoadOptions(ctx=256))
    paths = {k: lm.ws.plan.matmul_path for k, lm in h.models.items()}
    assert paths == {"0.5b": MatmulPath.MMQ, "1.5b": MatmulPath.MMQ, "7b": MatmulPath.W16}
    assert h.ledger.held() == quantized + est["7b"].w16
    for k in ("0.5b", "1.5b"):
        assert h.model_bytes(h.models[k])["w16"] == 0 and "under the w16 gate" in h.models[k].ws.plan.reason

    h.load("other", files["other"], LoadOptions(ctx=256))  # needs the 7b's f16 copy
    assert h.events == ["demoted 7b"]
    assert h.model_bytes(h.models["7b"])["w16"] == 0
    assert h.ledger.held() == quantized + est["other"].total(False) <= capacity

    h.unload("other")
    assert h.events == ["demoted 7b", "promoted 7b"]
    assert h.model_bytes(h.models["7b"])["w16"] == est["7b"].w16
    assert h.ledger.held() == quantized + est["7b"].w16
    h.unload_all()
    assert h.ledger.held() == 0 == mem.used_bytes()


def test_three_big_models_one_w16_copy(tmp_path):
    """Issue 6's pool scenario (scaled as above; tests/cuda/test_pool_scenario.py runs it at full
    size on the GPU): three 7b-like models and room for one f16
    copy. The first runs W16, the other two MMQ (quantized only because the copy did not fit);
    unloading the W16 one promotes the most recently used of the others."""
    shape = SHAPES["7b"]
    files = {}
    for i, name in enumerate("abc"):
        files[name] = str(tmp_path / f"{name}.gguf")
        write_model(files[name], "qwen2", "tiny", "q4_k_m", seed=i,
                    overrides=dict(shape, layers=4, head_dim=64, heads=shape["hidden"] // 64))
    traits = cpu_traits(1)
    est = estimate(open_model_file(files["a"]), traits, 256)
    capacity = 3 * est.total(False) + est.w16 + est.w16 // 2
    mem = HostMemory()
    h = Host(lambda **kw: CpuBackend(1, mem, **kw), mem, traits, capacity, w16_min_bytes=est.matmul_bytes, default_parallel=1)
    for k in "abc":
        h.load(k, files[k], LoadOptions(ctx=256))
    assert [h.models[k].ws.current_path(traits) for k in "abc"] == [MatmulPath.W16, MatmulPath.MMQ, MatmulPath.MMQ]
    assert all(h.models[k].ws.plan.wants_w16 for k in "bc") and "f16 copy needs" in h.models["b"].ws.plan.reason
    assert [h.model_info(h.models[k])["waiting_for_w16"] for k in "abc"] == [False, True, True]
    h.models["c"].last_used += 1.0  # c is the most recently used of the two
    h.unload("a")
    assert h.events == ["promoted c"]
    info = h.model_info(h.models["c"])
    assert info["matmul_path"] == "w16" and info["planned_matmul_path"] == "mmq" and "promoted" in info["reason"]
    assert h.model_bytes(h.models["c"])["w16"] == est.w16 and h.models["b"].ws.current_path(traits) == MatmulPath.MMQ
    assert not info["waiting_for_w16"] and h.model_info(h.models["b"])["waiting_for_w16"]
    assert h.ledger.held() == 2 * est.total(False) + est.w16 <= capacity
    h.unload_all()
    assert h.ledger.held() == 0 == mem.used_bytes()
