"""Start a real `minferd serve` subprocess for a test and stop it again."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc

from minferd._proto import pb2, pb2_grpc

# The daemon has the machine to itself (pytest without -n, or one worker): latency bars that
# hold alone are loosened beside another pytest worker, where half the cores run other tests.
ALONE = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1


class Daemon:
    """token: passed as MINFERD_TOKEN (never in argv) and sent by load/status. cwd, umask: the
    daemon's. env: more environment."""

    def __init__(self, tmp_path, *args, listen: str | None = None, wait: bool = True, token: str | None = None,
                 cwd=None, umask: int | None = None, env: dict | None = None, log_name: str = "daemon.log"):
        self.sock = str(tmp_path / "d.sock")
        self.address = listen or f"unix://{self.sock}"
        self.log = tmp_path / log_name
        cmd = [sys.executable, "-m", "minferd.cli", "serve", "--listen", self.address, *map(str, args)]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env.pop("MINFERD_TOKEN", None)
        if token is not None:
            full_env["MINFERD_TOKEN"] = token
        self.proc = subprocess.Popen(cmd, stderr=open(self.log, "w"), stdout=subprocess.DEVNULL, env=full_env,
                                     cwd=cwd, preexec_fn=None if umask is None else (lambda: os.umask(umask)))
        self.token = token
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if "listening on" in self.log.read_text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log.read_text()}")
            time.sleep(0.05)
        raise TimeoutError(self.log.read_text())

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)

    def stub(self) -> pb2_grpc.MinferdStub:
        return pb2_grpc.MinferdStub(self.channel())

    def metadata(self):
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def load(self, path, name, **kw) -> list:
        return list(self.stub().LoadModel(pb2.LoadModelRequest(name=name, path=str(path), **kw),
                                          metadata=self.metadata()))

    def status(self) -> pb2.Status:
        return self.stub().GetStatus(pb2.GetStatusRequest(), metadata=self.metadata())

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)
