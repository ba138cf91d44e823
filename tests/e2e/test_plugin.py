"""The pytest plugin as a user meets it: tests/plugin_suite run in a pytest of its own, plain and
under xdist, must start one daemon, load each model file once, and add up to the daemon's counters."""
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minferd.spawn import pid_alive

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "plugin_suite"


def plugin_args() -> list[str]:
    # Installed, the pytest11 entry point loads the plugin by itself; `-p` on top would register it twice.
    eps = importlib.metadata.entry_points(group="pytest11")
    return [] if any(ep.value == "minferd.testing" for ep in eps) else ["-p", "minferd.testing"]


def run_suite(tmp_path: Path, *extra: str):
    record, report = tmp_path / "record.jsonl", tmp_path / "report.json"
    # This test may itself run in an xdist worker or beside a user's daemon: the suite gets neither.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "MINFERD_ADDRESS"))}
    env.update(MINFERD_PLUGIN_SUITE="1", MINFERD_SUITE_RECORD=str(record))
    cmd = [sys.executable, "-m", "pytest", str(SUITE), *plugin_args(), "-q", "-p", "no:cacheprovider",
           "--minferd-budget=1GiB", f"--minferd-report={report}", f"--basetemp={tmp_path / 'tmp'}", *extra]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}"
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return p.stdout, lines, json.loads(report.read_text())


@pytest.mark.parametrize("workers", [0, 2], ids=["plain", "xdist-2"])
def test_sample_suite_shares_one_daemon_and_one_load_per_file(tmp_path, workers):
    out, lines, report = run_suite(tmp_path, *(["-n", str(workers)] if workers else []))
    assert "11 passed" in out

    pids = {line["pid"] for line in lines}
    assert pids == {report["pid"]}, "every test of every worker talked to the one daemon"
    if workers:
        assert {line["worker"] for line in lines} == {"gw0", "gw1"}
        assert sorted(report["users"]) == ["gw0", "gw1"]
        assert report["stopped_by"] in ("gw0", "gw1"), "the last worker stopped it, not the controller's backstop"
    assert not pid_alive(report["pid"]), "the daemon is stopped at the end"

    models = report["status"]["models"]
    assert sorted(m["name"].split("-tiny-")[0] for m in models) == ["llama", "qwen2"]  # one entry per file
    loaded = {(line["model"], line["loaded_unix"]) for line in lines if line["kind"] == "loaded"}
    assert {m["name"]: m["loaded_unix"] for m in models} == dict(loaded), "loaded once, never again"

    gens = [line for line in lines if line["kind"] == "generate"]
    for m in models:
        mine = [g for g in gens if g["model"] == m["name"]]
        assert m["requests"] == len(mine), m
        assert m["tokens_generated"] == sum(g["tokens"] for g in mine), m
    # The same prompt and sampling gave the same text, whichever worker asked.
    texts: dict[tuple, set] = {}
    for g in gens:
        texts.setdefault((g["model"], json.dumps(g["prompt"]), json.dumps(g["sampling"], sort_keys=True)),
                         set()).add(g["text"])
    assert all(len(t) == 1 for t in texts.values()), texts

    assert "minferd" in out and f"daemon pid {report['pid']}" in out  # the terminal summary


def test_main_run_does_not_collect_the_suite():
    env = {k: v for k, v in os.environ.items() if k != "MINFERD_PLUGIN_SUITE" and not k.startswith("PYTEST_XDIST")}
    p = subprocess.run([sys.executable, "-m", "pytest", str(SUITE), "--collect-only", "-q", "-p", "no:cacheprovider"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "no tests collected" in p.stdout + p.stderr, p.stdout
