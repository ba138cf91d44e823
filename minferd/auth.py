"""Who may talk to the daemon: the bearer token's rules, the interceptor that asks for it on every
call, and a health service whose per-model answers need it too.

A token is never taken from argv (every local user reads /proc/PID/cmdline) and never echoed: no
message here names it, only where it came from."""
from __future__ import annotations

import hmac
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2

from minferd.config import HEALTH_WATCH_SECONDS, MIN_TOKEN_CHARS
from minferd.errors import InvalidRequest

MAKE_ONE = "make one with `openssl rand -hex 16`"
MODEL_PREFIX = "model/"  # per-model health: "model/<name>"
SERVING, UNKNOWN = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
HEALTH_METHODS = "/grpc.health.v1.Health/"


def check_token(token: str, source: str) -> str:
    """The token itself, or InvalidRequest saying what is wrong with it (never what it is)."""
    if not token.strip():
        raise InvalidRequest(f"the bearer token from {source} is blank; {MAKE_ONE}")
    if any(c.isspace() for c in token):
        raise InvalidRequest(f"the bearer token from {source} contains whitespace; {MAKE_ONE}")
    if not all(" " < c < "\x7f" for c in token):  # what an HTTP header or gRPC metadata value can carry
        raise InvalidRequest(f"the bearer token from {source} has characters other than printable ASCII; {MAKE_ONE}")
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidRequest(f"the bearer token from {source} has {len(token)} characters, fewer than "
                             f"{MIN_TOKEN_CHARS}; {MAKE_ONE}")
    return token


def read_token(token: str | None, token_file: str | None) -> str | None:
    """The daemon's token from MINFERD_TOKEN / the TOML file (token) or --token-file, checked."""
    if token is not None and token_file:
        raise InvalidRequest("give the token one way: MINFERD_TOKEN or --token-file, not both")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"--token-file {token_file}: {getattr(e, 'strerror', None) or e}") from None
        # `openssl rand -hex 16 > FILE` ends in a newline; anything else around it is refused below.
        return check_token(text.removesuffix("\n").removesuffix("\r"), f"--token-file {token_file}")
    if token is not None:
        return check_token(token, "MINFERD_TOKEN")
    return None


def bearer_matches(got: str | None, expected: bytes) -> bool:
    """Constant time: how long the comparison takes says nothing about how much of it matched."""
    return hmac.compare_digest((got or "").encode("latin-1", "replace"), expected)


def _authorization(metadata) -> str | None:
    return next((v for k, v in (metadata or ()) if k == "authorization"), None)


class TokenAuth(grpc.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every call except health checks (Kubernetes'
    gRPC probes send no metadata); GatedHealth asks for it on the per-model ones itself."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()
        self._deny = grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token"))

    def intercept_service(self, continuation, details):
        if details.method.startswith(HEALTH_METHODS):
            return continuation(details)
        if bearer_matches(_authorization(details.invocation_metadata), self._expected):
            return continuation(details)
        return self._deny


class GatedHealth(health.HealthServicer):
    """grpc.health.v1 with the overall entries ("" and the API's name) open for probes, and
    `model/<name>` read from the host's table at call time (a table of health.set() calls drifted
    from it: SERVING after a model expired), answered only with the token where one is set, and
    refused before the table is read, so a stranger learns nothing about which models exist."""

    def __init__(self, host=None, token: str | None = None):
        super().__init__(experimental_non_blocking=True)
        self._host = host
        self._expected = f"Bearer {token}".encode() if token else None
        self._model_watchers: dict = {}  # send_response_callback -> (model name, last status sent)
        self._watch_lock = threading.Lock()
        self._poller: threading.Thread | None = None

    def _serving(self, service: str) -> bool:
        return self._host is not None and self._host.has_model(service[len(MODEL_PREFIX):])

    def _authorize(self, context) -> None:
        # Before the table is read: a refusal is the same whether or not the model exists.
        if self._expected is not None and not bearer_matches(_authorization(context.invocation_metadata()),
                                                             self._expected):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def Check(self, request, context):
        if not request.service.startswith(MODEL_PREFIX):
            return super().Check(request, context)
        self._authorize(context)
        if not self._serving(request.service):
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=SERVING)

    def Watch(self, request, context, send_response_callback=None):
        if not request.service.startswith(MODEL_PREFIX) or send_response_callback is None:
            return super().Watch(request, context, send_response_callback)
        self._authorize(context)
        status = SERVING if self._serving(request.service) else UNKNOWN
        # Never send under _watch_lock: in gRPC's non-blocking mode a send completes on the
        # server's one event thread, which may be waiting for that lock in gone() (40 watchers
        # cancelled at once wedged the whole daemon, SIGTERM included).
        send_response_callback(health_pb2.HealthCheckResponse(status=status))
        with self._watch_lock:
            self._model_watchers[send_response_callback] = (request.service, status)
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll, name="minferd-health-watch", daemon=True)
                self._poller.start()

        def gone():
            with self._watch_lock:
                self._model_watchers.pop(send_response_callback, None)
            send_response_callback(None)
        context.add_callback(gone)
        return None

    def _poll(self) -> None:
        """The table has no change feed: a model's watchers hear of a change within a second."""
        while True:
            time.sleep(HEALTH_WATCH_SECONDS)
            with self._watch_lock:
                watched = {service for service, _ in self._model_watchers.values()}
            now = {service: SERVING if self._serving(service) else UNKNOWN for service in watched}
            sends = []
            with self._watch_lock:
                for send, (service, last) in list(self._model_watchers.items()):
                    if service in now and now[service] != last:
                        self._model_watchers[send] = (service, now[service])
                        sends.append((send, now[service]))
            for send, status in sends:  # outside the lock (see Watch); one gone meanwhile drops it
                send(health_pb2.HealthCheckResponse(status=status))
