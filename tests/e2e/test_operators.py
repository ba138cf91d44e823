"""Rough edges an operator meets (issue 13, items 1 and 13), against real daemons: relative paths
in minferctl, numeric flags, --drain-seconds, a clamped budget, readable start-up figures, help
text, a daemon outliving a killed pytest, and a keep-alive reaper error that must not end it."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minferd._proto import pb2
from minferd.model.synth import write_model
from minferd.spawn import pid_alive
from tests.e2e.daemon import Daemon

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("op-models")
    write_model(d / "qwen2.gguf", "qwen2", "tiny", "q8_0", seed=1)
    write_model(d / "long.gguf", "qwen2", "tiny", "q8_0", seed=1, overrides={"ctx": 8192})
    return d


def ctl(address, *args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "minferd.ctl", "--address", address, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_minferctl_load_resolves_paths_against_the_callers_directory(tmp_path, models):
    d = Daemon(tmp_path, "--models-dir", models, "--threads", "1")  # its working directory is not `models`
    try:
        for arg, name in (("./qwen2.gguf", "dot"), ("qwen2.gguf", "here"), (f"../{models.name}/qwen2.gguf", "up")):
            p = ctl(d.address, "load", arg, "--name", name, "--ctx", "64", "-q", "--json", cwd=models)
            assert p.returncode == 0, (arg, p.stderr)
            assert json.loads(p.stdout)["path"] == str(models / "qwen2.gguf")
        p = ctl(d.address, "load", "qwen2", "--name", "bare", "--ctx", "64", "-q", cwd=tmp_path)
        assert p.returncode == 0, p.stderr  # no such file here: a name the daemon looks up in --models-dir
    finally:
        assert d.stop() == 0


BAD_CTL = [
    ["load", "x.gguf", "--ctx", "0"], ["load", "x.gguf", "--ctx", "-5"], ["load", "x.gguf", "--ctx", str(1 << 32)],
    ["generate", "m", "hi", "--max-tokens", "-1"], ["generate", "m", "hi", "--max-tokens", "0"],
    ["generate", "m", "hi", "--seed", "-1"], ["generate", "m", "hi", "--seed", str(1 << 64)],
    ["generate", "m", "hi", "--top-k", "-1"], ["generate", "m", "hi", "--top-k", str(1 << 31)],
    ["generate", "m", "hi", "--temperature", "-0.5"], ["generate", "m", "hi", "--temperature", "nan"],
    ["generate", "m", "hi", "--top-p", "0"], ["generate", "m", "hi", "--top-p", "1.5"],
    ["generate", "m", "hi", "--min-p", "-0.1"], ["generate", "m", "hi", "--repeat-penalty", "0"],
    ["chat", "m", "hi", "--max-tokens", "-3"], ["chat", "m", "hi", "--seed", "-2"],
    ["detokenize", "m", f"1,{1 << 40}"], ["keep-alive", "m", "nan"], ["--timeout", "-1", "status"],
]


@pytest.mark.parametrize("argv", BAD_CTL, ids=" ".join)
def test_minferctl_numeric_flags_are_usage_errors(argv, capsys):
    from minferd.ctl import parser
    with pytest.raises(SystemExit) as e:
        parser().parse_args(argv)
    assert e.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_minferctl_negative_numbers_end_in_one_usage_line_not_a_traceback(tmp_path):
    p = ctl(f"unix:{tmp_path}/none.sock", "generate", "m", "hi", "--max-tokens", "-1")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("minferctl generate: error: argument --max-tokens")


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--threads", "-2"], ["--metrics-port", "-1"],
                                  ["--metrics-port", "70000"], ["--w16-min-bytes", "-1"], ["--drain-seconds", "-1"],
                                  ["--drain-seconds", "inf"], ["--keep-alive", "nan"], ["--parent-pid", "0"]],
                         ids=" ".join)
def test_serve_numeric_flags_are_usage_errors(argv, capsys):
    from minferd.cli import parser
    with pytest.raises(SystemExit) as e:
        parser().parse_args(["serve", *argv])
    assert e.value.code == 2 and "error: argument" in capsys.readouterr().err


def test_help_says_what_the_flags_do():
    from minferd.cli import parser
    top = parser().format_help()
    assert "joins later" not in top and "serve" in top
    serve = next(a for a in parser()._subparsers._group_actions[0].choices.items() if a[0] == "serve")[1]
    text = " ".join(re.split(r"\n(?:options|optional arguments):\n", serve.format_help())[1].split())
    for flag in ("--w16-min-bytes", "--threads", "--metrics-port", "--drain-seconds", "--metrics-listen",
                 "--tls-client-ca", "--parent-pid"):
        entry = re.search(re.escape(flag) + r" \S+ (\S+)", text)
        assert entry and not entry.group(1).startswith("--"), f"{flag} has no help text"


def test_drain_seconds_bounds_the_drain(tmp_path, models):
    """SIGTERM waits --drain-seconds for in-flight requests, then exits 0: here 1 s against an
    8000-token generation that would run for far longer."""
    d = Daemon(tmp_path, "--models-dir", models, "--threads", "1", "--drain-seconds", "1")
    d.load("long.gguf", "long", ctx=8192)
    stream = d.stub().Generate(pb2.GenerateRequest(model="long", ids=pb2.TokenIds(ids=[300]),
                                                   sampling=pb2.SamplingParams(temperature=0, max_tokens=8000)))
    next(stream)
    t = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(60) == 0
    took = time.monotonic() - t
    assert took < 20, f"drained for {took:.1f} s with --drain-seconds 1"
    stream.cancel()


def test_drain_seconds_from_the_environment_and_the_file(tmp_path):
    from minferd.config import load_config
    assert load_config({}, env={"MINFERD_DRAIN_SECONDS": "12.5"}).drain_seconds == 12.5
    toml = tmp_path / "minferd.toml"
    toml.write_text("drain_seconds = 7\n")
    assert load_config({}, env={}, toml_path=str(toml)).drain_seconds == 7
    assert load_config({"drain_seconds": 3.0}, env={"MINFERD_DRAIN_SECONDS": "12.5"}).drain_seconds == 3.0


def test_a_clamped_budget_says_so_and_figures_read_as_bytes(tmp_path):
    d = Daemon(tmp_path, "--device", "cpu", "--budget", "100TiB")
    try:
        log = d.log.read_text()
        warned = [line for line in log.splitlines() if "100TiB" in line]
        assert len(warned) == 1 and "using" in warned[0] and "GiB" in warned[0], log
        start = next(line for line in log.splitlines() if "listening on" in line)
        assert re.search(r"budget \d+\.\d\d (GiB|MiB)\)", start), start
    finally:
        assert d.stop() == 0
    d = Daemon(tmp_path, "--device", "cpu", "--budget", "64MiB", log_name="small.log")
    try:
        log = d.log.read_text()
        assert "budget 64.00 MiB" in log and "using" not in log  # what fits is no news
    finally:
        assert d.stop() == 0


REAP_FAILS = """
import sys
from minferd.errors import NotFound
from minferd.host import Host
real, calls = Host.reap, []
def reap(self, *a, **kw):
    calls.append(1)
    if len(calls) <= 2:  # the race with UnloadModel, as issue 13 found it
        raise NotFound("no model named 'b' is loaded")
    return real(self, *a, **kw)
Host.reap = reap
from minferd.cli import main
sys.exit(main(["serve", *sys.argv[1:]]))
"""


def test_a_reaper_error_is_one_log_line_and_the_daemon_serves_on(tmp_path):
    log = tmp_path / "daemon.log"
    sock = tmp_path / "d.sock"
    proc = subprocess.Popen([sys.executable, "-c", REAP_FAILS, "--listen", f"unix:{sock}", "--device", "cpu"],
                            stderr=open(log, "w"), stdout=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("keep-alive reaper") < 2:
            assert proc.poll() is None, f"the daemon died: {log.read_text()}"
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(1.5)  # a round after the errors
        assert proc.poll() is None, f"the daemon died: {log.read_text()}"
        from minferd.client import Client
        c = Client(f"unix:{sock}", timeout=10)
        assert c.status()["pool"]["device"] == "cpu"
        c.close()
        text = log.read_text()
        lines = [line for line in text.splitlines() if "keep-alive reaper" in line]
        assert len(lines) == 2 and "NotFound" in lines[0] and "Traceback" not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


HOLD = """
import os, time
def test_hold(minferd_daemon):
    open(os.environ["MINFERD_TEST_PIDFILE"], "w").write(f"{minferd_daemon.pid} {os.getpid()}")
    time.sleep(600)
"""


def _plugin_args() -> list[str]:
    eps = importlib.metadata.entry_points(group="pytest11")
    return [] if any(ep.value == "minferd.testing" for ep in eps) else ["-p", "minferd.testing"]


@pytest.mark.parametrize("workers", [0, 1], ids=["plain", "xdist"])
def test_a_daemon_outlives_no_killed_pytest(tmp_path, workers):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_hold.py").write_text(textwrap.dedent(HOLD))
    pidfile = tmp_path / "daemon.pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "MINFERD_"))}
    env.update(MINFERD_TEST_PIDFILE=str(pidfile), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", str(suite), *_plugin_args(), "-q", "-p", "no:cacheprovider",
           "--minferd-budget=64MiB", f"--basetemp={tmp_path / 'tmp'}", *(["-n", str(workers)] if workers else [])]
    run = subprocess.Popen(cmd, cwd=suite, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon = worker = None
    try:
        deadline = time.monotonic() + 120
        while not (pidfile.exists() and pidfile.read_text()):
            assert run.poll() is None and time.monotonic() < deadline, "the inner suite never got its daemon"
            time.sleep(0.1)
        daemon, worker = map(int, pidfile.read_text().split())
        assert pid_alive(daemon)
        run.send_signal(signal.SIGKILL)  # the controller: no finalizer, no session end runs
        run.wait()
        deadline = time.monotonic() + 15
        while pid_alive(daemon):
            assert time.monotonic() < deadline, "the daemon outlived its pytest by 15 s"
            time.sleep(0.1)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in (daemon, worker):  # an xdist worker may sleep on after its controller is gone
            if pid and pid != run.pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
