"""`minferd serve`: build the host for a device, bind the socket, preload, reap idle models, and
drain on SIGTERM (health NOT_SERVING, in-flight requests finish, exit 0)."""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import threading

import grpc
from grpc_health.v1 import health_pb2

from minferd.config import ServeConfig
from minferd.errors import InvalidRequest
from minferd.host import Host, LoadOptions
from minferd.model.loader import resolve_path
from minferd.pool.budget import measure_device, parse_budget, resolve_budget
from minferd.server import SERVICE, MinferdServicer, create_server, new_health

log = logging.getLogger("minferd")


def _gpu_present() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: the CPU serves
        return False


def build_host(cfg: ServeConfig) -> Host:
    device = cfg.device
    if device == "auto":
        device = "cuda:0" if _gpu_present() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InvalidRequest(f"device {device!r}: expected auto, cpu or cuda[:N]")
    if device != "cpu" and not _gpu_present():
        raise InvalidRequest(f"device {device}: no CUDA device (or no CuPy: pip install 'minferd[cuda12]')")
    device = "cuda:0" if device == "cuda" else device
    total, others = measure_device(device)
    budget = resolve_budget(device, parse_budget(cfg.budget) if cfg.budget else None, total, others)
    if device == "cpu":
        from minferd.backend.cpu import CpuBackend, HostMemory
        from minferd.devices import cpu_traits
        threads = cfg.threads or os.cpu_count() or 1
        mem = HostMemory()
        factory, traits = (lambda: CpuBackend(threads, mem)), cpu_traits(threads)
    else:
        from minferd.backend import gates
        from minferd.backend.cuda import CudaBackend, DeviceMemory, device_name
        from minferd.devices import cuda_traits
        index = int(device.partition(":")[2])
        gates.check_device(device_name(index), gates.table_path())  # a bad MINFERD_GATE_TABLE fails here, at start
        mem = DeviceMemory(index, limit=budget.capacity)
        factory, traits = (lambda: CudaBackend(mem)), cuda_traits()
    host = Host(factory, mem, traits, budget.capacity, cfg.w16_min_bytes, device)
    host.promote_in_background = True
    return host


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_transport(cfg: ServeConfig) -> None:
    """TCP needs TLS or a token; plain TCP only with --insecure, and only on loopback."""
    if cfg.listen.startswith("unix://"):
        return
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise InvalidRequest("--tls-cert and --tls-key go together")
    if cfg.tls_cert or cfg.bearer_token():
        return
    host = cfg.listen.rsplit(":", 1)[0]
    if not cfg.insecure:
        raise InvalidRequest(f"refusing plain TCP on {cfg.listen}: give --tls-cert/--tls-key or --token, "
                             f"or --insecure for a loopback address")
    if not _is_loopback(host):
        raise InvalidRequest(f"--insecure is for loopback addresses only, not {host!r}")


def _bind_unix(server: grpc.Server, listen: str) -> str:
    path = listen[len("unix://"):]
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # a stale socket from a daemon that was killed
        else:
            raise InvalidRequest(f"another daemon is listening on {path}")
        finally:
            probe.close()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    old = os.umask(0o177)  # the socket is created owner-only, never briefly open
    try:
        if not server.add_insecure_port(listen):
            raise InvalidRequest(f"cannot listen on {listen}")
    finally:
        os.umask(old)
    return path


def serve(cfg: ServeConfig) -> int:
    check_transport(cfg)
    host = build_host(cfg)
    health = new_health()
    metrics = None
    if cfg.metrics_port is not None:
        from minferd.metrics import Metrics
        metrics = Metrics(host)
        metrics.serve(cfg.metrics_port)
    servicer = MinferdServicer(host, cfg.models_dirs, cfg.keep_alive, health, metrics)
    server = create_server(servicer, health, cfg.bearer_token(), cfg.max_message_bytes)
    sock = None
    if cfg.listen.startswith("unix://"):
        sock = _bind_unix(server, cfg.listen)
    elif cfg.tls_cert:
        with open(cfg.tls_cert, "rb") as c, open(cfg.tls_key, "rb") as k:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        if not server.add_secure_port(cfg.listen, creds):
            raise InvalidRequest(f"cannot listen on {cfg.listen}")
    elif not server.add_insecure_port(cfg.listen):
        raise InvalidRequest(f"cannot listen on {cfg.listen}")
    server.start()
    if sock:
        os.chmod(sock, 0o600)
    for item in cfg.preload:
        path, _, name = item.partition("=")
        path = resolve_path(path)
        name = name or os.path.basename(path).removesuffix(".gguf")
        host.load(name, path, LoadOptions(pinned=True, keep_alive=-1.0))
        health.set(f"model/{name}", health_pb2.HealthCheckResponse.SERVING)
    for svc in ("", SERVICE):
        health.set(svc, health_pb2.HealthCheckResponse.SERVING)
    print(f"minferd: listening on {cfg.listen} ({host.device}, budget {host.ledger.capacity} bytes)",
          file=sys.stderr, flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(1.0):
        host.reap()
    for svc in ("", SERVICE):
        health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
    server.stop(grace=cfg.drain_seconds).wait()  # refuses new calls, lets in-flight ones finish
    host.unload_all()
    if sock and os.path.exists(sock):
        os.unlink(sock)
    print("minferd: drained, exiting", file=sys.stderr, flush=True)
    return 0
