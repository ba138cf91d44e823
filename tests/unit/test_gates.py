"""The prefill gate table (minferd/backend/gates.py over prefill_gates_h200.json, measured on the
H200 by bench/crossover.py): well-formed, covering the shapes and batches it is asked about, and
choosing only among the kernels a plan allows."""
from __future__ import annotations

import json

import pytest

from minferd.backend import gates
from minferd.errors import InvalidRequest

KERNELS = {"mmvq", "cublas", "tiles", "fused_b", "mmq", "small", "tc"}
NO_COPY = ("fused_b", "tiles", "mmq")


def test_table_is_well_formed():
    table = json.loads(gates.TABLE.read_text())
    assert "crossover.py" in table["made_by"] and table["rows"]
    for r in table["rows"]:
        assert set(r["us"]) <= KERNELS and all(t > 0 for t in r["us"].values()), r
        assert "tiles" in r["us"] and "fused_b" in r["us"], r  # what every no-copy plan can run
    measured = {(r["type"], r["N"], r["K"]) for r in table["rows"]}
    assert {("Q4_K", 3584, 3584), ("Q4_K", 3584, 18944), ("Q6_K", 18944, 3584)} <= measured
    assert max(r["n"] for r in table["rows"]) >= 2048


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_0", "F16"])
@pytest.mark.parametrize("N,K", [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944), (151936, 896)])
@pytest.mark.parametrize("n", [9, 33, 512, 2048, 8192])
def test_choice_is_allowed(qtype, N, K, n):
    assert gates.choose(NO_COPY, qtype, N, K, n) in NO_COPY
    assert gates.choose(("fused_b", "tiles"), qtype, N, K, n) in ("fused_b", "tiles")
    assert gates.choose(("cublas",), qtype, N, K, n) == "cublas"
    assert gates.choose(("tiles",), qtype, N, K, n) == "tiles"


def test_choice_follows_the_measured_times(tmp_path):
    rows = [{"type": "Q4_K", "N": 4096, "K": 4096, "n": 16, "us": {"fused_b": 10.0, "tiles": 30.0, "mmq": 9.5}},
            {"type": "Q4_K", "N": 4096, "K": 4096, "n": 1024, "us": {"fused_b": 90.0, "tiles": 50.0, "mmq": 200.0}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"rows": rows}))
    assert gates.choose(NO_COPY, "Q4_K", 4096, 4096, 12, path) == "fused_b"  # mmq within the tie margin
    assert gates.choose(("mmq", "fused_b"), "Q4_K", 4096, 4096, 12, path) == "mmq"
    assert gates.choose(NO_COPY, "Q4_K", 4096, 4096, 2048, path) == "tiles"
    assert gates.choose(NO_COPY, "Q6_K", 5000, 3000, 900, path) == "tiles"  # Q4_K's rows stand in
    assert gates.choose(("cublas", "tiles"), "Q4_K", 4096, 4096, 16, path) == "tiles"  # cublas unmeasured


def test_another_gpu_is_told_to_measure_its_own(tmp_path, caplog):
    assert gates.table_path({}) == gates.TABLE
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"device": "NVIDIA L4", "rows": []}))
    assert gates.table_path({"MINFERD_GATE_TABLE": str(mine)}) == mine
    with caplog.at_level("WARNING", logger="minferd"):
        assert gates.check_device("NVIDIA H200", gates.TABLE)
        assert not caplog.records
        assert not gates.check_device("NVIDIA L4 (other)", mine)
    assert "measured on NVIDIA L4" in caplog.text and "MINFERD_GATE_TABLE" in caplog.text
    assert gates.choose(NO_COPY, "Q4_K", 4096, 4096, 512, mine) == NO_COPY[0]  # nothing measured


@pytest.mark.parametrize("text", [None, "not json", '{"rows": [{"type": "Q4_K"}]}', '{"device": "x"}'])
def test_a_bad_table_is_refused_by_name(tmp_path, text):
    path = tmp_path / "gates.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(InvalidRequest, match=f"prefill gate table {path}"):
        gates.check_device("NVIDIA H200", path)


@pytest.mark.parametrize("N,K", [(3584, 3584), (3584, 18944), (512, 3584)])
def test_decode_batches_of_a_quantized_plan_read_the_quantized_bytes_once(N, K):
    """The committed H200 table (graph-timed rows up to 64): for a plan without f16 copies,
    mmq_small (offered alone) at 9-32 rows; with the copy, cuBLAS stays over it (mmq_small is within
    TIE of it at best)."""
    for n in (9, 16, 32):
        assert gates.choose(("small",) + NO_COPY, "Q4_K", N, K, n) == "small"
        assert gates.choose(("cublas", "small"), "Q4_K", N, K, n) == "cublas"


@pytest.mark.parametrize("N,K", [(3584, 3584), (3584, 18944), (512, 3584), (18944, 3584)])
def test_decode_batches_of_16_take_tcgemv_over_cublas_on_the_copy(N, K):
    """The committed H200 table (s9's graph-timed rows): Q4_K at 9-16 rows reads the quantized bytes
    through tcgemv even where the f16 copy is there; at 64 rows cuBLAS on the copy stays; without
    a copy tcgemv beats mmq_small at every batch of 9-64."""
    for n in (9, 16):
        assert gates.choose(("cublas", "small", "tc"), "Q4_K", N, K, n) == "tc"
    assert gates.choose(("cublas", "small", "tc"), "Q4_K", N, K, 64) == "cublas"
    for n in (9, 16, 32, 64):
        assert gates.choose(("small", "tc") + NO_COPY, "Q4_K", N, K, n) == "tc"


def test_a_type_measured_only_at_far_shapes_takes_the_proxys_nearer_rows(tmp_path):
    """Q8_0 timed only at the 0.5B's 896-wide shapes: a 3584-wide Q8_0 matmul takes Q4_K's 3584
    rows (strictly nearer), an 896-wide one its own."""
    rows = [{"type": "Q8_0", "N": 896, "K": 896, "n": 128, "us": {"fused_b": 9.0, "tiles": 5.0}},
            {"type": "Q4_K", "N": 3584, "K": 3584, "n": 128, "us": {"fused_b": 5.0, "tiles": 9.0}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"rows": rows}))
    assert gates.choose(("fused_b", "tiles"), "Q8_0", 3584, 3584, 128, path) == "fused_b"
    assert gates.choose(("fused_b", "tiles"), "Q8_0", 896, 896, 128, path) == "tiles"
    assert gates.choose(("fused_b", "tiles"), "Q5_0", 896, 896, 128, path) == "fused_b"  # unmeasured: Q4_K's rows
    assert gates.choose(("fused_b", "tiles"), "Q8_0", 1536, 1536, 128, path) == "tiles"  # nearer its own 896


@pytest.mark.parametrize("qtype", ["Q5_0", "Q8_0"])
@pytest.mark.parametrize("N,K", [(896, 896), (128, 896), (4864, 896), (896, 4864)])
def test_the_05b_quantized_plan_takes_tiles_past_64_rows(qtype, N, K):
    """The committed H200 table's 0.5B rows (s27 call 2): without the f16 copy, fused_b and mmq fill
    a few dozen CTAs on 896-wide matrices (Q5_0 896x4864 at 128 rows: tiles 18.7 us, mmq 47.3,
    fused_b 75.4), so 128-2048 rows take dequantized tiles through cuBLAS (but Q8_0's gate / up at
    128, where fused_b's 19.1 us is within TIE of tiles' 17.7)."""
    for n in (128, 256, 512, 1024, 2048):
        want = "fused_b" if (qtype, N, n) == ("Q8_0", 4864, 128) else "tiles"
        assert gates.choose(NO_COPY, qtype, N, K, n) == want, n
