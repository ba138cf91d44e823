"""The README's pytest-plugin example, copied out of the README into a suite of its own and run
as a user would: it must pass as written."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_plugin import plugin_args

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_plugin_example_passes_as_written(tmp_path, gemma_path):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### In a pytest suite"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "minferd_model(" in code
    (tmp_path / "test_example.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "MINFERD_"))}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args(),
                        f"--rootdir={tmp_path}", str(tmp_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        pytest.fail(f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-2000:]}")
    assert "1 passed" in p.stdout
