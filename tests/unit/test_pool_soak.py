"""A few hundred seeded random pool operations (bench/soak.py): the ledger equals the allocator
and the device within budget after every one, refusals are typed, and nothing is left at the end."""
import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("soak", Path(__file__).parents[2] / "bench" / "soak.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


@pytest.mark.parametrize("seed", [0, 1])
def test_soak(tmp_path, seed):
    report = soak.run(n_ops=300, seed=seed, over=1.7, folder=tmp_path)
    assert report["bytes_after_unload_all"] == 0
    assert report["typed_refusals"].get("PoolExhausted", 0) > 0  # the budget really was tight
    assert report["events"].get("demoted", 0) > 0
    assert set(report["typed_refusals"]) <= {"PoolExhausted", "NotFound", "Conflict", "ModelFileError",
                                             "InvalidRequest"}
