"""backend/pending.py: every path waiting names the tests in tests/cuda that will let it on, and
those tests exist (a renamed test must not leave a path waiting on nothing)."""
from pathlib import Path

import pytest

from minferd.backend import pending

CUDA_TESTS = Path(__file__).resolve().parents[1] / "cuda"


def test_every_waiting_path_names_tests_that_exist():
    assert pending.WAITING <= set(pending.PATHS)
    root = CUDA_TESTS.parents[1]
    for name in pending.PATHS:
        files, functions = pending.tests({name})
        assert files and functions, f"{name}: names no test file and test: {pending.PATHS[name]}"
        text = "".join((root / f).read_text() for f in files)
        for fn in functions:
            assert f"def {fn}(" in text, f"{name}: {fn} is not in {', '.join(files)}"


def test_ready_refuses_an_unknown_name():
    """A misspelt name in a backend's check must fail loudly, not read as 'ready'."""
    with pytest.raises(KeyError, match="not a pending path"):
        pending.ready("moe_aligned")


def test_the_valve_runs_a_waiting_path_and_refuses_an_unknown_one(monkeypatch):
    """MINFERD_PENDING=name,...: a device call's A/B of paths still waiting (read at import)."""
    monkeypatch.setattr(pending, "PATHS", {"moe_align": "...", "paired_ids": "...", "other": "..."})
    monkeypatch.setenv("MINFERD_PENDING", "moe_align, paired_ids")
    assert pending._run_anyway() == {"moe_align", "paired_ids"}
    monkeypatch.setenv("MINFERD_PENDING", "moe_aligned")
    with pytest.raises(ValueError, match="MINFERD_PENDING names moe_aligned, not pending paths"):
        pending._run_anyway()
