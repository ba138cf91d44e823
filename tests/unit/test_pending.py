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


def test_the_valve_runs_a_waiting_path_and_refuses_an_unknown_one():
    """MINFERD_PENDING=name,...: a device call's A/B of paths still waiting (read at import)."""
    import os
    import subprocess
    import sys
    code = "from minferd.backend import pending; print(sorted(n for n in pending.PATHS if pending.ready(n)))"
    env = dict(os.environ, MINFERD_PENDING="moe_align, paired_ids")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "'moe_align'" in out.stdout and "'paired_ids'" in out.stdout, out.stderr
    env["MINFERD_PENDING"] = "moe_aligned"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "MINFERD_PENDING names moe_aligned, not pending paths" in out.stderr
