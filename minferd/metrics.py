"""Prometheus metrics: pool and per-model bytes read from the ledger at scrape time, plus request,
token and latency counters fed by the server. Where the daemon has a token, /metrics asks for it
as `Authorization: Bearer` (the model names are what a token keeps from strangers)."""
from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer


class PoolCollector:
    def __init__(self, host):
        self.host = host

    def collect(self):
        st = self.host.status()
        pool = GaugeMetricFamily("minferd_pool_bytes", "Pool memory by state", labels=["device", "state"])
        p = st["pool"]
        for state in ("capacity", "used", "reserved", "free"):
            pool.add_metric([p["device"], state], p[f"{state}_bytes"])
        yield pool
        mb = GaugeMetricFamily("minferd_model_bytes", "Model memory by kind", labels=["model", "kind", "matmul_path"])
        for m in st["models"]:
            for kind, n in m["bytes"].items():
                mb.add_metric([m["name"], kind, m["matmul_path"]], n)
        yield mb
        seqs = GaugeMetricFamily("minferd_model_sequences", "Sequences per model by state", labels=["model", "state"])
        blocks = GaugeMetricFamily("minferd_model_kv_blocks", "Paged KV blocks per model by state",
                                   labels=["model", "state"])
        for m in st["models"]:
            e = m["engine"]
            for state in ("running", "waiting"):
                seqs.add_metric([m["name"], state], e[state])
            for state in ("used", "cached", "free"):
                blocks.add_metric([m["name"], state], e[f"blocks_{state}"])
        yield seqs
        yield blocks
        ev = CounterMetricFamily("minferd_pool_events", "Demotions, promotions, evictions, expiries", labels=["kind"])
        for kind, n in self.host.event_counts.items():
            ev.add_metric([kind], n)
        yield ev


class Metrics:
    def __init__(self, host, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.registry.register(PoolCollector(host))
        r = self.registry
        self.requests = Counter("minferd_requests", "Generate/Chat requests completed", ["model"], registry=r)
        self.tokens = Counter("minferd_tokens", "Tokens processed", ["model", "kind"], registry=r)
        self.latency = Histogram("minferd_request_seconds", "Generate/Chat latency", ["model"], registry=r,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.refusals = Counter("minferd_refusals", "Requests refused, by gRPC status code", ["code"], registry=r)

    def request(self, model: str, prompt_tokens: int, generated: int, seconds: float, cached: int = 0) -> None:
        self.requests.labels(model).inc()
        self.tokens.labels(model, "prompt").inc(prompt_tokens)
        self.tokens.labels(model, "prompt_cached").inc(cached)
        self.tokens.labels(model, "generated").inc(generated)
        self.latency.labels(model).observe(seconds)

    def refusal(self, code: str) -> None:
        self.refusals.labels(code).inc()

    def serve(self, addr: str, port: int, token: str | None = None) -> ThreadingWSGIServer:
        """Serve /metrics on addr:port in a daemon thread; .shutdown() stops it."""
        app = make_wsgi_app(self.registry)
        if token:
            app = bearer_gate(app, token)
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        httpd = make_server(addr, port, app, server_class, handler_class=_Quiet)
        threading.Thread(target=httpd.serve_forever, name="minferd-metrics", daemon=True).start()
        return httpd


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):  # a line on stderr per scrape is noise in the daemon's log
        pass


def bearer_gate(app, token: str):
    """The WSGI app behind `Authorization: Bearer <token>`; anything else is 401 and no metrics."""
    from minferd.auth import bearer_matches
    expected = f"Bearer {token}".encode()

    def gated(environ, start_response):
        if bearer_matches(environ.get("HTTP_AUTHORIZATION"), expected):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", 'Bearer realm="minferd"')])
        return [b"missing or wrong bearer token\n"]
    return gated
