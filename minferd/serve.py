"""`minferd serve`: build the host for a device, bind the socket, preload, reap idle models, and
drain on SIGTERM or when --parent-pid's process is gone (health NOT_SERVING, in-flight requests
finish, exit 0)."""
from __future__ import annotations

import ipaddress
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from minferd.config import GIL_SWITCH_SECONDS, GRPC_MAX_STREAMS, SERVE_TICK_SECONDS, ServeConfig, valve
from minferd.errors import InvalidRequest, excerpt
from minferd.fleet import Fleet
from minferd.host import Host, LoadOptions
from minferd.model.loader import resolve_path
from minferd.pool.budget import measure_device, parse_budget, resolve_budget
from minferd.server import SERVICE, MinferdServicer, create_server, new_health
from minferd.session_socket import SessionSocket
from minferd.units import fmt_bytes
from minferd.unix_socket import BoundSocket, bind, session_path, unix_path

log = logging.getLogger("minferd")


def devices_of(spec: str) -> list[str]:
    """--device: auto (every visible GPU, else the CPU), cpu, cuda (every visible GPU), or a list
    (cuda:0,cuda:2; cpu:0,cpu:1 are CPU stand-ins for several devices, each with its own pool)."""
    if spec in ("auto", "cuda"):
        n = _gpu_count()
        if spec == "cuda" and not n:
            raise InvalidRequest("device cuda: no CUDA device (or no CuPy: pip install 'minferd[cuda12]')")
        return [f"cuda:{i}" for i in range(n)] or ["cpu"]
    devices = [d.strip() for d in spec.split(",")]
    for d in devices:
        kind, _, index = d.partition(":")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cuda" and not index):
            raise InvalidRequest(f"device {excerpt(d)}: expected auto, cpu, cuda, cuda:N or cpu:N (a list of them)")
    if len(set(devices)) != len(devices):
        raise InvalidRequest(f"device {excerpt(spec)}: a device is named twice")
    if len({d.partition(':')[0] for d in devices}) > 1:
        raise InvalidRequest(f"device {excerpt(spec)}: CPU and CUDA devices do not mix in one daemon")
    n = _gpu_count() if devices[0].startswith("cuda") else 0
    for d in devices:
        if d.startswith("cuda") and int(d.partition(":")[2]) >= n:
            raise InvalidRequest(f"device {d}: {n} CUDA device(s) visible (or no CuPy: pip install 'minferd[cuda12]')")
    return devices


def _gpu_count() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: the CPU serves
        return 0


def build_host(cfg: ServeConfig, device: str) -> Host:
    """One device's host; --budget applies to each device (bytes, or a fraction of that device)."""
    kind = device.partition(":")[0]
    total, others = measure_device(kind if kind == "cpu" else device)
    budget = resolve_budget(kind if kind == "cpu" else device, parse_budget(cfg.budget) if cfg.budget else None,
                            total, others)
    if budget.asked is not None:  # more than the device leaves: clamped, and the operator should know
        asked = f"{cfg.budget} ({fmt_bytes(budget.asked)})" if cfg.budget else f"the default {fmt_bytes(budget.asked)}"
        log.warning("budget %s is more than %s leaves (%s, %s used by others, %s headroom): using %s",
                    asked, device, fmt_bytes(total), fmt_bytes(others), fmt_bytes(budget.headroom),
                    fmt_bytes(budget.capacity))
    if kind == "cpu":
        from minferd.backend.cpu import CpuBackend, HostMemory
        from minferd.devices import cpu_traits
        threads = cfg.threads or os.cpu_count() or 1
        mem = HostMemory()
        factory, traits = (lambda **kw: CpuBackend(threads, mem, **kw)), cpu_traits(threads)
    else:
        from minferd.backend import gates
        from minferd.backend.cuda import CudaBackend, DeviceMemory, device_name
        from minferd.devices import cuda_traits
        index = int(device.partition(":")[2])
        gates.check_device(device_name(index), gates.table_path())  # a bad MINFERD_GATE_TABLE fails here, at start
        mem = DeviceMemory(index, limit=budget.capacity)
        factory, traits = (lambda **kw: CudaBackend(mem, **kw)), cuda_traits()
    return Host(factory, mem, traits, budget.capacity, cfg.w16_min_bytes, device, cfg.parallel)


def build_fleet(cfg: ServeConfig) -> Fleet:
    fleet = Fleet({d: build_host(cfg, d) for d in devices_of(cfg.device)})
    fleet.promote_in_background = True
    return fleet


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


TOKEN_HOW = "--token-file FILE or MINFERD_TOKEN"


def check_transport(cfg: ServeConfig, token: str | None) -> None:
    """Who can reach the daemon decides what it asks of them. A unix socket is owner-only. TCP
    needs a token or client certificates (TLS alone encrypts for anyone); plain TCP without either
    only with --insecure, and only on loopback. Metrics off loopback need the token too."""
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise InvalidRequest("--tls-cert and --tls-key go together")
    if cfg.tls_client_ca and not cfg.tls_cert:
        raise InvalidRequest("--tls-client-ca needs --tls-cert and --tls-key (the daemon's own certificate)")
    metrics = cfg.metrics_address()
    if metrics and not _is_loopback(metrics[0]) and not token:
        raise InvalidRequest(f"metrics on {metrics[0]}:{metrics[1]} are not loopback: give a token "
                             f"({TOKEN_HOW}) that scrapers send as `Authorization: Bearer`")
    http = cfg.http_address()
    if http and not token and not (cfg.insecure and _is_loopback(http[0])):
        raise InvalidRequest(f"refusing the HTTP front on {http[0]}:{http[1]} without a token ({TOKEN_HOW}); "
                             f"--insecure allows it on a loopback address only")
    if unix_path(cfg.listen) is not None or token or cfg.tls_client_ca:
        return
    if cfg.tls_cert:
        raise InvalidRequest(f"--tls-cert/--tls-key alone encrypt the connection but let any client in: "
                             f"add a token ({TOKEN_HOW}) or --tls-client-ca FILE")
    host = cfg.listen.rsplit(":", 1)[0]
    if not cfg.insecure:
        raise InvalidRequest(f"refusing plain TCP on {cfg.listen}: give a token ({TOKEN_HOW}) or "
                             f"--tls-client-ca, or --insecure for a loopback address")
    if not _is_loopback(host):
        raise InvalidRequest(f"--insecure is for loopback addresses only, not {host!r}")


def _check_numbers(cfg: ServeConfig) -> None:
    # The flags' types check these; MINFERD_* and the TOML file reach here unchecked.
    d = cfg.drain_seconds
    if not (isinstance(d, (int, float)) and math.isfinite(d) and d >= 0):
        raise InvalidRequest(f"drain_seconds {d!r}: expected seconds >= 0")
    if cfg.parent_pid is not None and not _process_start(cfg.parent_pid):
        raise InvalidRequest(f"--parent-pid {cfg.parent_pid}: no such process")
    m = cfg.max_streams
    if not (isinstance(m, int) and not isinstance(m, bool) and 1 <= m <= GRPC_MAX_STREAMS):
        raise InvalidRequest(f"max_streams {m!r}: a whole number from 1 to {GRPC_MAX_STREAMS}")
    i = cfg.session_idle
    if not (isinstance(i, (int, float)) and not isinstance(i, bool) and 0.1 <= i <= 86400):
        raise InvalidRequest(f"session_idle {i!r}: expected seconds from 0.1 to 86400")


def _bind_tcp(server: grpc.Server, cfg: ServeConfig) -> None:
    if cfg.tls_cert:
        try:
            with open(cfg.tls_cert, "rb") as c, open(cfg.tls_key, "rb") as k:
                pair = (k.read(), c.read())
            roots = None
            if cfg.tls_client_ca:
                with open(cfg.tls_client_ca, "rb") as f:
                    roots = f.read()
        except OSError as e:
            raise InvalidRequest(f"{e.filename}: {e.strerror}") from None
        creds = grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=roots is not None)
        if not server.add_secure_port(cfg.listen, creds):
            raise InvalidRequest(f"cannot listen on {cfg.listen}")
    elif not server.add_insecure_port(cfg.listen):
        raise InvalidRequest(f"cannot listen on {cfg.listen}")


# ---- the parent watch (--parent-pid) -------------------------------------------------------------
def _process_start(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), so that a pid the kernel hands to a
    new process later does not count as the parent still running; None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # no /proc: existence is all there is to know
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    return None if fields[0] in ("Z", "X") else fields[19]


class ParentWatch:
    def __init__(self, pid: int | None):
        self.pid = pid
        self.start = _process_start(pid) if pid else None

    def gone(self) -> bool:
        return self.pid is not None and _process_start(self.pid) != self.start


def reap_until(stop: threading.Event, host: Fleet, parent: ParentWatch) -> None:
    """Every second: unload expired models, give f16 copies to models that wait for one and were
    busy when memory freed, and look for the parent. An error in one round is one log line and the
    next round runs: the reaper ending the daemon took every model with it."""
    while not stop.wait(SERVE_TICK_SECONDS):
        try:
            host.reap()
            if host.retry_promotion:
                host.promote_waiting()
        except Exception as e:
            log.error("keep-alive reaper: %s: %s", type(e).__name__, (str(e).splitlines() or [""])[0])
        if parent.gone():
            log.info("parent process %d is gone: draining", parent.pid)
            return


def session_socket(servicer: MinferdServicer, sock: BoundSocket | None, token: str | None, cfg: ServeConfig):
    """The session socket beside a unix socket's (session_socket.py), unless MINFERD_SESSION_SOCKET=0
    or its name would not fit; a TCP daemon has none (its clients are not on this host)."""
    path = session_path(sock.path) if sock else None
    if path is None or valve("MINFERD_SESSION_SOCKET") == "0":
        return None
    try:
        return SessionSocket(servicer, path, token, cfg.max_message_bytes, cfg.session_idle)
    except (InvalidRequest, OSError) as e:  # its clients send gRPC Sessions instead: nothing is lost but speed
        log.warning("no session socket: %s", e)
        return None


def serve(cfg: ServeConfig) -> int:
    token = cfg.bearer_token()
    check_transport(cfg, token)
    _check_numbers(cfg)
    parent = ParentWatch(cfg.parent_pid)
    # Model workers hold the GIL between their kernels (sampling, the CPU backend's Python); a
    # status call waiting its turn waited up to 5 ms per hand-over, several per call.
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    host = build_fleet(cfg)
    health = new_health(host, token)
    metrics = None
    if cfg.metrics_address():
        from minferd.metrics import Metrics
        metrics = Metrics(host)
    servicer = MinferdServicer(host, cfg.models_dirs, cfg.keep_alive, health, metrics, cfg.max_streams,
                               cfg.session_idle)
    server = create_server(servicer, health, token, cfg.max_message_bytes)
    # Metrics first: a port in use then fails the start before there is a socket to leave behind.
    metrics_http = metrics.serve(*cfg.metrics_address(), token) if metrics else None
    path = unix_path(cfg.listen)
    sock: BoundSocket | None = bind(server, path) if path else None
    if sock is None:
        _bind_tcp(server, cfg)
    server.start()
    fast = session_socket(servicer, sock, token, cfg)
    http = None
    try:
        if cfg.http_address():
            from minferd.http_api import OpenAIFront, start
            http = start(OpenAIFront(host, cfg.models_dirs, cfg.keep_alive, token, metrics, cfg.http_max_requests), *cfg.http_address())
        if cfg.warmup:  # before the preloads and SERVING: no request pays a compile
            from minferd.warmup import warm_host
            with tempfile.TemporaryDirectory(prefix="minferd-warmup-") as d:
                for h in host.hosts.values():
                    warm_host(h, Path(d), log.info)
        for item in cfg.preload:
            name_path, _, name = item.partition("=")
            name_path = resolve_path(name_path)
            name = name or os.path.basename(name_path).removesuffix(".gguf")
            host.load(name, name_path, LoadOptions(pinned=True, keep_alive=-1.0))
        # Before health and the line that tell a supervisor (or a test) the daemon is up: a SIGTERM right after
        # it otherwise found Python's default handler and killed the daemon without its drain.
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        for svc in ("", SERVICE):
            health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        where = f"unix:{sock.path}" if sock else cfg.listen
        also = f", HTTP on http://{cfg.http}" if http else ""
        budgets = "; ".join(f"{d}, budget {fmt_bytes(h.ledger.capacity)}" for d, h in host.hosts.items())
        also += f", sessions on {fast.bound.path}" if fast else ""
        print(f"minferd: listening on {where}{also} ({budgets})", file=sys.stderr, flush=True)
        reap_until(stop, host, parent)
        for svc in ("", SERVICE):
            health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
    finally:
        if sock:  # at once: a successor may bind the path while this one drains
            sock.release()
        if fast:
            fast.bound.release()
    if http:  # uvicorn lets in-flight requests finish once told to exit
        http.should_exit = True
        http.thread.join(cfg.drain_seconds)
    servicer.idle_streams.drain()  # a Session between requests is no request in flight
    if fast:
        fast.drain()
    t0 = time.monotonic()
    server.stop(grace=cfg.drain_seconds).wait()  # refuses new calls, lets in-flight ones finish
    if fast:
        fast.join(max(0.0, cfg.drain_seconds - (time.monotonic() - t0)))
    if metrics_http:
        metrics_http.shutdown()
    host.unload_all()
    print("minferd: drained, exiting", file=sys.stderr, flush=True)
    return 0
