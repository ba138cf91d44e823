"""minferd's pytest plugin: one daemon per test run, and each model file loaded once for all of it.

Fixtures (session scope):
  minferd_daemon      the daemon: .address, .pid, .started_here. Started on a private socket, or the
                      one at --minferd-address / MINFERD_ADDRESS, which is never started or stopped.
  minferd_client      a minferd.client.Client on it (plain dicts, lists and str).
  minferd_model       minferd_model(path, name=None, **load_opts) -> ModelHandle, loaded once per run.
  minferd_shared_file minferd_shared_file(filename, make) -> Path: make(path) runs once per run,
                      so xdist workers that write the same test model end up with one file, one load.

Under pytest-xdist the workers of a run share one daemon through a directory keyed by the run's
id (PYTEST_XDIST_TESTRUNUID): the first worker to need a daemon starts it and writes its address
there, the others read it, all under fcntl.flock; every worker marks itself done when its session
ends and the last one stops the daemon. The controller stops it too if it is still up at the very
end (a worker that crashed never marks itself done), and removes the directory. A controller that
never gets there (SIGKILL) leaves no daemon behind: the daemon watches its pid (--parent-pid).

Under budget pressure an idle fixture's model is unloaded to make room for the next (whatever
its keep-alive: that only says how long an idle model stays when nobody needs the room); a
handle whose model is gone loads it again on its next call.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path

import pytest

from minferd.client import Client
from minferd.spawn import RunDir, pid_alive, start_daemon, stop_daemon


def pytest_addoption(parser):
    g = parser.getgroup("minferd", "minferd daemon for tests")
    g.addoption("--minferd-budget", default=os.environ.get("MINFERD_TEST_BUDGET", "2GiB"),
                help="the pool budget of the daemon the plugin starts (env MINFERD_TEST_BUDGET; default 2GiB)")
    g.addoption("--minferd-address", default=os.environ.get("MINFERD_ADDRESS"),
                help="attach to this running daemon instead of starting one (env MINFERD_ADDRESS)")
    g.addoption("--minferd-device", default="cpu", help="cpu or cuda:N (default cpu)")
    g.addoption("--minferd-models-dir", action="append", default=None,
                help="a directory the daemon may load from (repeatable; default: the rootdir, "
                     "the temp dir and ~/.cache)")
    g.addoption("--minferd-serve-arg", action="append", default=[],
                help="one more argument for `minferd serve` (repeatable), e.g. --minferd-serve-arg=--threads=2")
    g.addoption("--minferd-report", default=None,
                help="write the daemon's final status (JSON) here before it stops")


_SESSION = pytest.StashKey["DaemonSession"]()


def pytest_configure(config):
    wi = getattr(config, "workerinput", None)  # set on xdist workers only (not the env: it leaks to children)
    if wi:
        run_id, worker, workers = wi["testrunuid"], wi["workerid"], int(wi["workercount"])
    else:
        # An xdist controller hands its own id to the workers, so it can find their daemon afterwards.
        xdist = getattr(config.option, "dist", "no") != "no" and hasattr(config.option, "testrunuid")
        if xdist and not config.option.testrunuid:
            config.option.testrunuid = os.urandom(8).hex()
        run_id, worker, workers = (config.option.testrunuid if xdist else os.urandom(8).hex()), "main", 1
    config.stash[_SESSION] = DaemonSession(config, RunDir(run_id), worker, workers)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    s = session.config.stash.get(_SESSION, None)
    if s and s.worker != "main":
        try:
            s.finish()
        except Exception as e:  # never fail a run that may not even use minferd
            warnings.warn(f"minferd plugin: {e}")


def pytest_terminal_summary(terminalreporter, config):
    s = config.stash.get(_SESSION, None)
    final = s.rundir.read_json("final.json") if s and s.worker == "main" else None
    if final:
        terminalreporter.write_sep("-", "minferd")
        for line in summary_lines(final):
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    s = config.stash.get(_SESSION, None)
    if s and s.worker == "main":
        s.cleanup()


class Daemon:
    def __init__(self, address: str, pid: int | None, started_here: bool, log: str | None = None):
        self.address, self.pid, self.started_here, self.log = address, pid, started_here, log

    def __repr__(self):
        return f"Daemon({self.address!r}, pid={self.pid})"


class DaemonSession:
    """This process's share of the run's daemon (see the module docstring for the protocol)."""

    def __init__(self, config, rundir: RunDir, worker: str, workers: int):
        self.config, self.rundir, self.worker, self.workers = config, rundir, worker, workers
        self.daemon: Daemon | None = None

    def acquire(self) -> Daemon:
        if self.daemon:
            return self.daemon
        address = self.config.getoption("minferd_address")
        if address:
            self.daemon = Daemon(address, None, False)
            return self.daemon
        with self.rundir.locked() as st:
            if st.get("error"):  # one worker failed to start it: the others fail at once, same message
                raise RuntimeError(st["error"])
            if not (st.get("pid") and not st.get("stopped") and pid_alive(st["pid"])):
                try:
                    st.update(start_daemon(self.rundir.path, self._serve_args()), stopped=False, starter=self.worker)
                except Exception as e:
                    st["error"] = f"minferd serve did not start: {e}"
                    raise RuntimeError(st["error"]) from None
            st["users"] = sorted(set(st.get("users", [])) | {self.worker})
            self.daemon = Daemon(st["address"], st["pid"], st["starter"] == self.worker, st["log"])
        return self.daemon

    def _serve_args(self) -> list[str]:
        opt = self.config.getoption
        # minferd_shared_file writes under the run directory: always loadable, whatever the option says.
        dirs = [*(opt("minferd_models_dir") or self.default_models_dirs()), self.rundir.files()]
        args = ["--budget", opt("minferd_budget"), "--device", opt("minferd_device"),
                "--parent-pid", str(self.controller_pid())]
        for d in dict.fromkeys(str(Path(d).resolve()) for d in dirs):
            args += ["--models-dir", d]
        return args + list(opt("minferd_serve_arg"))

    def controller_pid(self) -> int:
        """The process whose death ends the run: a daemon still up then (pytest SIGKILLed, a
        crashed controller) exits by itself. An xdist worker's parent is the controller."""
        return os.getpid() if self.worker == "main" else os.getppid()

    def default_models_dirs(self) -> list[str]:
        import tempfile
        dirs = [str(self.config.rootpath), tempfile.gettempdir(), os.path.expanduser("~/.cache")]
        if self.config.option.basetemp:
            dirs.append(str(self.config.option.basetemp))
        return [d for d in dirs if os.path.isdir(d)]

    def finish(self) -> None:
        """This process is done; the last of the run's workers to get here stops the daemon.
        Workers that never used it count too: one of them may be the last to finish."""
        with self.rundir.locked() as st:
            st["done"] = sorted(set(st.get("done", [])) | {self.worker})
            if len(st["done"]) >= self.workers:
                self._stop(st)

    def cleanup(self) -> None:
        """The end of the whole run (controller, or the only process): nothing may outlive it."""
        if self.rundir.exists():
            with self.rundir.locked() as st:
                self._stop(st)
        self.rundir.remove()

    def _stop(self, st: dict) -> None:
        if not st.get("pid") or st.get("stopped"):
            return
        final = {"pid": st["pid"], "address": st["address"], "users": st.get("users", []), "stopped_by": self.worker,
                 "status": None}
        try:
            c = Client(st["address"], timeout=10)
            final["status"] = c.status()
            c.close()
        except Exception as e:  # a dead daemon still gets stopped and reported
            final["error"] = str(e)
        self.rundir.write_json("final.json", final)
        report = self.config.getoption("minferd_report")
        if report:
            Path(report).write_text(json.dumps(final, indent=1))
        stop_daemon(st["pid"])
        st["stopped"] = True


def summary_lines(final: dict) -> list[str]:
    users = ", ".join(final["users"]) or "no worker"
    lines = [f"daemon pid {final['pid']} at {final['address']}, used by {users}"]
    if final.get("status") is None:
        return lines + [f"no final status: {final.get('error', '?')}"]
    for m in final["status"]["models"]:
        lines.append(f"  {m['name']}: {m['matmul_path']}, {m['requests']} requests, "
                     f"{m['tokens_generated']} tokens ({os.path.basename(m['path'])})")
    return lines


# ---- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def minferd_daemon(request) -> Daemon:
    s = request.config.stash[_SESSION]
    d = s.acquire()
    request.addfinalizer(s.finish)
    return d


@pytest.fixture(scope="session")
def minferd_client(minferd_daemon):
    c = Client(minferd_daemon.address)
    yield c
    c.close()


@pytest.fixture(scope="session")
def minferd_model(minferd_client):
    """minferd_model(path, name=None, **load_opts) -> ModelHandle; load_opts are Client.load's."""
    handles: dict[tuple, ModelHandle] = {}

    def get(path, name: str | None = None, **opts) -> ModelHandle:
        from minferd.model.loader import PACKAGED_MODELS
        # A packaged model's name (gemma3-270m) goes to the daemon as it is: it is no file here.
        real = path if path in PACKAGED_MODELS else os.path.realpath(path)
        key = (real, name, tuple(sorted(opts.items())))
        if key not in handles:
            handles[key] = ModelHandle(minferd_client, real, name or model_name(real, opts), opts)
        return handles[key]
    return get


@pytest.fixture(scope="session")
def minferd_shared_file(request):
    """minferd_shared_file(filename, make) -> Path; make(path) writes the file, once per run."""
    rundir = request.config.stash[_SESSION].rundir

    def get(filename: str, make) -> Path:
        path = rundir.files() / filename
        with rundir.locked("files"):
            if not path.exists():
                part = path.with_name(path.name + ".part")
                make(part)
                os.replace(part, path)  # a file that exists is complete
        return path
    return get


def model_name(realpath: str, opts: dict) -> str:
    """The same file and options give the same name in every worker: the daemon's no-op reload."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(realpath).stem)[:80]
    digest = hashlib.sha1(repr((realpath, sorted(opts.items()))).encode()).hexdigest()[:6]
    return f"{stem}-{digest}"


class ModelHandle:
    """A model loaded for the run. Its calls return plain values; a model evicted meanwhile is reloaded."""

    def __init__(self, client: Client, path: str, name: str, opts: dict):
        self.client, self.path, self.name, self.opts = client, path, name, opts
        self.loaded = self._load()  # what the load returned: plan, reason, footprint

    def _load(self) -> dict:
        import grpc
        try:
            return self.client.load(self.path, self.name, **self.opts)
        except grpc.RpcError as e:  # one line in the test report, not a dump of the call object
            raise RuntimeError(f"minferd could not load {self.path}: {e.code().name}: {e.details()}") from None

    @property
    def info(self) -> dict:
        """The model as the daemon has it now (requests, tokens, bytes by kind, ...)."""
        for m in self._call(self.client.models):
            if m["name"] == self.name:
                return m
        self.loaded = self._load()
        return self.loaded

    def generate(self, prompt: str | list[int], **sampling) -> str:
        return self.complete(prompt, **sampling)["text"]

    def complete(self, prompt: str | list[int], **sampling) -> dict:
        """text, token_ids, finish_reason and timings."""
        return self._call(self.client.generate, self.name, prompt, **sampling)

    def chat(self, message: str | list[dict], **sampling) -> str:
        msgs = [{"role": "user", "content": message}] if isinstance(message, str) else message
        return self._call(self.client.chat, self.name, msgs, **sampling)["text"]

    def tokenize(self, text: str, add_special: bool | None = None) -> list[int]:
        return self._call(self.client.tokenize, self.name, text, add_special)

    def _call(self, fn, *args, **kw):
        import grpc
        try:
            return fn(*args, **kw)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
        # Evicted or expired since it was loaded: load it again, once.
        self.loaded = self._load()
        return fn(*args, **kw)

    def __repr__(self):
        return f"ModelHandle({self.name!r}, {self.path!r})"
