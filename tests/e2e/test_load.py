"""bench/load.py, briefly: 8 clients for 5 s over 2 models of a real daemon on a unix socket. No call
may fail, no model may be left busy, and GetStatus stays quick while the models are busy."""
import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("load", Path(__file__).parents[2] / "bench" / "load.py")
load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(load)


@pytest.mark.slow
def test_load_brief(tmp_path, capsys):
    out = tmp_path / "load.json"
    rc = load.main(["--clients", "8", "--seconds", "5", "--models", "2", "--json", str(out)])
    table = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["error_count"] == 0, (r["errors"], r["error_samples"])
    assert rc == 0 and r["busy_after"] == []
    g = r["generate"]
    assert g["requests"] > 0 and g["tokens"] > 0 and len(g["per_model"]) == 2  # both models served
    assert g["ttft"]["p50_ms"] <= g["total"]["p50_ms"]
    busy = r["status"]["probe_busy"]  # the prober's, from a process of its own
    assert busy["n"] > 0  # status was asked while a model was busy
    assert busy["p99_ms"] < 2000, busy  # generous: a shared 2-core CI machine
    assert "status, prober, busy" in table and "errors    0" in table
