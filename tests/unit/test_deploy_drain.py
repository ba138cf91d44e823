"""deploy/ and the daemon agree on shutdown and exposure (issue 13, item 13): each entry point sets
the daemon's drain explicitly, shorter than its supervisor's grace by room for the unload (the
daemon drained 30 s, deploy/ promised requests 75 s), and metrics off loopback go with a token."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNLOAD_ROOM = 10  # seconds the supervisor must wait beyond the drain: unload and exit


def drain_of(command: str) -> float:
    m = re.search(r"--drain-seconds[\s\",]+([0-9.]+)", command)
    assert m, f"no --drain-seconds in {command!r}: the daemon's default would not be what deploy/ promises"
    return float(m.group(1))


def test_kubernetes_grace_outlasts_the_drain():
    yaml = pytest.importorskip("yaml")
    ds = next(d for d in yaml.safe_load_all((DEPLOY / "k8s" / "daemonset.yaml").read_text()) if d)
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    cmd = " ".join(c["command"] + c["args"])
    assert drain_of(cmd) + UNLOAD_ROOM <= pod["terminationGracePeriodSeconds"]
    assert "--metrics-listen 0.0.0.0:9464" in cmd and "--token-file" in cmd  # scrapeable, behind the token


def test_systemd_stop_timeout_outlasts_the_drain():
    unit = (DEPLOY / "minferd.service").read_text()
    exec_start = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", unit, re.MULTILINE).group(1)
    timeout = float(re.search(r"^TimeoutStopSec=(\d+)", unit, re.MULTILINE).group(1))
    assert drain_of(exec_start) + UNLOAD_ROOM <= timeout


def test_container_stop_advice_outlasts_the_drain():
    text = (DEPLOY / "Containerfile").read_text()
    cmd = re.search(r"^CMD (\[.*?\])$", text, re.MULTILINE | re.DOTALL).group(1)
    stop = float(re.search(r"podman stop -t (\d+)", text).group(1))
    assert drain_of(cmd) + UNLOAD_ROOM <= stop
    assert "0.0.0.0:9464" in cmd and "--token-file" in cmd


def test_the_readme_states_the_same_numbers():
    text = (DEPLOY / "README.md").read_text()
    assert "--drain-seconds 60" in text and "terminationGracePeriodSeconds: 75" in text
    assert "TimeoutStopSec=75" in text and "podman stop` needs `-t 75`" in text
