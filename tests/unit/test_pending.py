"""backend/pending.py: every path waiting names the tests in tests/cuda that will let it on, and
those tests exist (a renamed test must not leave a path waiting on nothing)."""
import re
from pathlib import Path

import pytest

from minferd.backend import pending

CUDA_TESTS = Path(__file__).resolve().parents[1] / "cuda"


def test_every_waiting_path_names_tests_that_exist():
    assert pending.WAITING <= set(pending.PATHS)
    for name, what in pending.PATHS.items():
        tests = re.findall(r"\btest_\w+", what)
        files = [t for t in tests if (CUDA_TESTS / f"{t}.py").exists()]
        functions = [t for t in tests if t not in files]
        assert files and functions, f"{name}: names no test file and test: {what}"
        text = "".join((CUDA_TESTS / f"{f}.py").read_text() for f in files)
        for fn in functions:
            assert f"def {fn}(" in text, f"{name}: {fn} is not in {', '.join(files)}"


def test_ready_refuses_an_unknown_name():
    """A misspelt name in a backend's check must fail loudly, not read as 'ready'."""
    with pytest.raises(KeyError, match="not a pending path"):
        pending.ready("moe_aligned")
