"""Start and stop a `minferd serve` subprocess, and a directory where processes share one.

The pytest plugin (minferd.testing) and the end-to-end tests get their daemon from here. No
pytest and no heavy imports: this runs in every test process, usually to do nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import minferd
from minferd.client import Client

_CHILDREN: dict[int, subprocess.Popen] = {}  # daemons this process started: it reaps them


def start_daemon(workdir: Path, serve_args: list[str], timeout: float = 180.0) -> dict:
    """`minferd serve` on workdir/d.sock, ready (health SERVING) on return: {address, pid, log}.
    It exits by itself when this process is gone, unless serve_args name another --parent-pid."""
    sock, log = Path(workdir) / "d.sock", Path(workdir) / "daemon.log"
    address = f"unix://{sock}"
    cmd = [sys.executable, "-m", "minferd.cli", "serve", "--listen", address, *serve_args]
    if not any(a.split("=")[0] == "--parent-pid" for a in serve_args):
        cmd += ["--parent-pid", str(os.getpid())]
    env = dict(os.environ)
    # The daemon runs this very minferd, wherever the test process happens to be run from.
    here = str(Path(minferd.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    env.pop("MINFERD_ADDRESS", None)
    with open(log, "ab") as out:
        # Its own session: a Ctrl-C in the terminal reaches pytest, which then stops the daemon in order.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    _CHILDREN[proc.pid] = proc
    try:
        wait_ready(address, proc, log, timeout)
    except BaseException:
        stop_daemon(proc.pid)
        raise
    return {"address": address, "pid": proc.pid, "log": str(log)}


def wait_ready(address: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    import grpc
    deadline = time.monotonic() + timeout
    client = Client(address, timeout=2.0)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode} before it was ready:\n{log_tail(log)}")
            try:
                if client.health("") == "SERVING":
                    return
            except grpc.RpcError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"not SERVING after {timeout:.0f} s:\n{log_tail(log)}")
            time.sleep(0.1)
    finally:
        client.close()


def log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_daemon(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM (the daemon drains and exits), SIGKILL if it has not gone after `timeout`."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if _wait_gone(pid, wait):
            break
    proc = _CHILDREN.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1.0)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = _CHILDREN.get(pid)
        if proc is not None and proc.poll() is not None:
            return True
        if proc is None and not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def pid_alive(pid: int) -> bool:
    """Running, and not a zombie: a daemon whose parent (another xdist worker) has not reaped it is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class RunDir:
    """<tmp>/minferd-pytest-<uid>/<run id>: the lock, the shared state and the socket of one test run."""

    def __init__(self, run_id: str):
        base = Path(tempfile.gettempdir()) / f"minferd-pytest-{os.getuid()}"
        self.path = base / run_id[:16]  # short: a unix socket path must fit in 108 bytes

    def exists(self) -> bool:
        return (self.path / "state.json").exists()

    def _make(self) -> None:
        base = self.path.parent
        base.mkdir(mode=0o700, exist_ok=True)
        if base.stat().st_uid != os.getuid():  # the daemon's socket must not live in someone else's dir
            raise RuntimeError(f"{base} belongs to another user")
        self.path.mkdir(mode=0o700, exist_ok=True)

    def files(self) -> Path:
        """Where minferd_shared_file writes: inside a directory the daemon may load from."""
        self._make()
        (self.path / "files").mkdir(exist_ok=True)
        return self.path / "files"

    @contextlib.contextmanager
    def locked(self, name: str = "state"):
        """Holds an exclusive flock; yields the state dict of `name`, written back on the way out."""
        self._make()
        with open(self.path / f"{name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if this process dies
            state = self.read_json(f"{name}.json") or {}
            try:
                yield state
            finally:  # a failure is state too: the other workers must see "error" and not retry it
                self.write_json(f"{name}.json", state)

    def read_json(self, name: str) -> dict | None:
        try:
            return json.loads((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def write_json(self, name: str, obj: dict) -> None:
        tmp = self.path / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, self.path / name)  # readers see the old or the new file, never half of one

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
