"""kernel() compiles a module's part, not the whole module (kernels/__init__.py): each part is one
quant type's (or head dim's) instances, every instance is in exactly one part, and the part a
kernel is taken from holds it. No GPU: the parts are lists of names."""
import pytest

from minferd.kernels import part, part_key, parts
from minferd.kernels import attn_decode, dequant, gemm_f16, mmq_small, mmvq, tcgemv
from minferd.kernels.precompile import every_part, module_names, name_expressions
from minferd.kernels.quant import TYPES


def test_part_key_reads_the_first_template_argument():
    assert part_key("mmvq<12, 1, 4, 1, 2, 2>") == "12"
    assert part_key("attn_decode_merge<128>") == "128"
    assert part_key("quantize_x") is None


@pytest.mark.parametrize("stem", module_names())
def test_the_parts_split_the_module(stem):
    exprs = name_expressions(stem)
    got = parts(exprs)
    assert got[0] == ()  # the extern "C" kernels' part
    flat = [e for p in got for e in p]
    assert sorted(flat) == sorted(exprs) and len(flat) == len(set(flat))
    for e in exprs:
        p = part(exprs, e)
        assert e in p and all(part_key(x) == part_key(e) for x in p)


def test_a_typed_launcher_has_a_part_per_type():
    assert len(parts(tcgemv.names())) - 1 == len(tcgemv.SUPPORTED)
    assert len(parts(dequant.names())) - 1 == len(dequant.CUDA_TYPES)
    assert len(parts(mmq_small.names())) - 1 == len(mmq_small.SUPPORTED)
    assert len(parts(gemm_f16.names())) - 1 == len(gemm_f16.CUDA_TYPES) + 1  # + the f16 copy's loader
    assert len(parts(attn_decode.names())) - 1 == len(attn_decode.HEAD_DIMS)
    q4k = part(tcgemv.names(), tcgemv.kernel_name(TYPES["Q4_K"], 16))
    assert len(q4k) == len(tcgemv.names()) // len(tcgemv.SUPPORTED)


def test_a_model_of_one_type_compiles_a_fraction_of_the_mat_vecs():
    every = mmvq.names()
    q4k = part(every, mmvq.kernel_name(TYPES["Q4_K"], 1, mmvq.CONFIGS["Q4_K"][1]["few"]))
    assert 0 < len(q4k) <= len(every) // 8


def test_plain_names_come_from_the_part_of_no_instances():
    assert part(mmvq.names(), "quantize_x") == ()


def test_a_name_outside_the_module_is_refused_by_name():
    with pytest.raises(KeyError, match="tcgemv<99"):
        part(tcgemv.names(), "tcgemv<99, 1, 1, 4, 1>")


def test_warmup_compiles_every_part_once():
    todo = every_part()
    assert len(todo) == len(set(todo))
    assert {s for s, _ in todo} == set(module_names())


def test_a_models_parts_are_its_types_and_head_dims():
    """precompile.parts_for: a Q4_K_M 7B (F32, Q4_K, Q6_K; head dim 128) compiles its types' parts of
    every typed module, head dim 128's of attention, every part of sample and mmq, and every
    module's extern "C" part; no other type's or head dim's."""
    from minferd.kernels.precompile import parts_for
    q4k, q6k, q5k = (TYPES[n].ggml_id for n in ("Q4_K", "Q6_K", "Q5_K"))
    got = parts_for({0, 1, q4k, q6k}, {128})
    names = {e for _, exprs in got for e in exprs}
    assert {stem for stem, exprs in got if not exprs} == set(module_names())
    for stem, exprs in every_part():
        if stem in ("sample", "mmq"):
            assert (stem, exprs) in got
    keys = {part_key(e) for stem, exprs in got if stem not in ("sample", "mmq") for e in exprs}
    assert keys <= {str(t) for t in (0, 1, q4k, q6k)} | {"-1", "128"}
    assert any(e.startswith(f"tcgemv<{q4k},") for e in names) and any(e.startswith(f"mmvq<{q6k},") for e in names)
    assert not any(e.startswith(f"mmvq<{q5k},") for e in names)
    assert any(e.startswith("attn_decode") and part_key(e) == "128" for e in names)
    assert len(got) < len(every_part()) / 2


def test_mmvq_ids_shapes_from_a_sweeps_file_and_a_bad_one_refused(tmp_path, monkeypatch):
    """MINFERD_IDS_CONFIGS (bench/moe_ids.py --json): its shapes replace the table's for their
    type and class only; a shape that cannot run is refused by name."""
    from minferd.kernels import mmvq_ids
    f = tmp_path / "ids.json"
    f.write_text('{"Q4_K": {"few": [4, 1, 4, 1]}}')
    monkeypatch.setenv("MINFERD_IDS_CONFIGS", str(f))
    mmvq_ids._overrides.cache_clear()
    try:
        assert mmvq_ids.ids_config(TYPES["Q4_K"], 768) == (4, 1, 4, 1)
        assert mmvq_ids.ids_config(TYPES["Q4_K"], 2048) == mmvq.IDS_CONFIGS["Q4_K"]["mid"]
        assert mmvq_ids.ids_config(TYPES["Q6_K"], 768) == mmvq.IDS_CONFIGS["Q6_K"]["few"]
        f.write_text('{"Q4_K": {"few": [4, 3, 4, 1]}}')  # 4 warps do not split into groups of 3
        mmvq_ids._overrides.cache_clear()
        with pytest.raises(ValueError, match="'Q4_K' 'few' .* is not a type, class"):
            mmvq_ids.ids_config(TYPES["Q4_K"], 768)
    finally:
        monkeypatch.delenv("MINFERD_IDS_CONFIGS")
        mmvq_ids._overrides.cache_clear()


def test_the_x_planes_valve_defines_one_plane_for_the_mat_vec_module_alone(monkeypatch):
    from minferd.kernels import valve_defines
    monkeypatch.delenv("MINFERD_X_PLANES", raising=False)
    assert valve_defines("mmvq") == ()
    monkeypatch.setenv("MINFERD_X_PLANES", "1")
    assert valve_defines("mmvq") == ("-DMINFERD_X_ONE_PLANE",)
    assert valve_defines("tcgemv") == ()
    monkeypatch.setenv("MINFERD_X_PLANES", "2")
    assert valve_defines("mmvq") == ()
    monkeypatch.setenv("MINFERD_X_PLANES", "one" * 20)
    with pytest.raises(ValueError, match="MINFERD_X_PLANES='oneone"):
        valve_defines("mmvq")
