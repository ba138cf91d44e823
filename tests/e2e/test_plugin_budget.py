"""A user's suite of three model fixtures over a budget that holds two, with the default
keep-alive: the idle model gives way to the third (keep-alive only says how long an idle model
stays when nobody needs the room) and is loaded again when a later test asks for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from minferd.devices import cpu_traits
from minferd.model.loader import open_model_file
from minferd.model.synth import write_model
from minferd.pool.estimator import estimate
from tests.e2e.test_plugin import plugin_args

SUITE = '''
import pytest
from minferd.model.synth import write_model

def model(seed):
    @pytest.fixture(scope="session")
    def fixture(minferd_shared_file, minferd_model):
        path = minferd_shared_file(f"m{seed}.gguf", lambda p: write_model(p, "qwen2", "tiny", "q8_0", seed=seed))
        return minferd_model(path, ctx=256)
    return fixture

a, b, c = model(1), model(2), model(3)

def test_a(a):
    assert a.generate([5, 6, 7], max_tokens=3, temperature=0)

def test_b(b):
    assert b.generate([5, 6, 7], max_tokens=3, temperature=0)

def test_c(c):
    assert c.generate([5, 6, 7], max_tokens=3, temperature=0)

def test_a_again(a):
    assert a.generate([5, 6, 7], max_tokens=3, temperature=0)
'''


def test_three_fixtures_over_a_budget_of_two(tmp_path):
    probe = tmp_path / "probe.gguf"
    write_model(probe, "qwen2", "tiny", "q8_0", seed=1)
    one = estimate(open_model_file(probe), cpu_traits(os.cpu_count() or 1), 256).total(False)
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_three.py").write_text(textwrap.dedent(SUITE))
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "MINFERD_"))}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args(),
                        f"--minferd-budget={int(2.5 * one)}", "--minferd-device=cpu", f"--minferd-report={report}",
                        f"--rootdir={tmp_path / 'suite'}", f"--basetemp={tmp_path / 'tmp'}", str(tmp_path / "suite")],
                       cwd=tmp_path / "suite", env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "4 passed" in p.stdout, f"{p.stdout[-4000:]}\n{p.stderr[-2000:]}"
    events = json.loads(report.read_text())["status"]["events"]
    assert sum(e.startswith("evicted") for e in events) >= 2, events  # a for c, then b (or c) for a again
