"""Prometheus metrics: pool and per-model bytes read from the ledger at scrape time, plus request,
token and latency counters fed by the server. Where the daemon has a token, /metrics asks for it
as `Authorization: Bearer` (the model names are what a token keeps from strangers)."""
from __future__ import annotations

import os
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector, make_wsgi_app)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

PATHS = ("w16", "mmq", "fused_b")


class PoolCollector:
    """Gauges read from one status snapshot at scrape time. Every byte appears once, so the
    series sum to the pool's used bytes: a model's own kv and scratch under its name, a file's
    weights and f16 copy under its weight set (shared by every load of the file). Labels never
    change with state: the current matmul path is a gauge of its own."""

    def __init__(self, host):
        self.host = host

    def collect(self):
        st = self.host.status()
        pools = st.get("pools") or [st["pool"]]  # a series per device: they sum to the daemon's
        yield _gauge("minferd_pool_capacity_bytes", "The pool's capacity (the budget)", ["device"],
                     [([p["device"]], p["capacity_bytes"]) for p in pools])
        yield _gauge("minferd_pool_bytes", "Pool memory by state", ["device", "state"],
                     [([p["device"], state], p[f"{state}_bytes"]) for p in pools for state in ("used", "reserved", "free")])
        models, sets = st["models"], {}
        for m in models:
            sets.setdefault(m["weight_set"], (os.path.basename(m["path"]), m["bytes"]))
        yield _gauge("minferd_model_bytes", "A model's own memory (its KV and scratch) by kind", ["model", "kind"],
                     [([m["name"], k], m["bytes"][k]) for m in models for k in ("kv", "scratch")])
        yield _gauge("minferd_weight_set_bytes", "A loaded file's weights and f16 copy, shared by its loads",
                     ["weight_set", "file", "kind"],
                     [([ws, f, k], b[k]) for ws, (f, b) in sets.items() for k in ("weights", "w16")])
        yield _gauge("minferd_model_matmul_path", "1 for the matmul path a model runs now", ["model", "path"],
                     [([m["name"], path], float(m["matmul_path"] == path)) for m in models for path in PATHS])
        yield _gauge("minferd_model_sequences", "Sequences per model by state", ["model", "state"],
                     [([m["name"], state], m["engine"][state]) for m in models for state in ("running", "waiting")])
        yield _gauge("minferd_model_kv_blocks", "Paged KV blocks per model by state", ["model", "state"],
                     [([m["name"], state], m["engine"][f"blocks_{state}"]) for m in models
                      for state in ("used", "cached", "free")])
        ev = CounterMetricFamily("minferd_pool_events", "Demotions, promotions, evictions, expiries", labels=["kind"])
        for kind, n in self.host.event_counts.items():
            ev.add_metric([kind], n)
        yield ev


def _gauge(name: str, doc: str, labels: list[str], rows) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for values, v in rows:
        g.add_metric(values, v)
    return g


class Metrics:
    def __init__(self, host, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.registry.register(PoolCollector(host))
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.requests = Counter("minferd_requests", "Generate/Chat requests ended, by outcome (a finish reason, "
                                "cancelled, or the error's status code)", ["model", "outcome"], registry=r)
        self.tokens = Counter("minferd_tokens", "Tokens processed", ["model", "kind"], registry=r)
        self.latency = Histogram("minferd_request_seconds", "Generate/Chat latency", ["model"], registry=r,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.ttft = Histogram("minferd_time_to_first_token_seconds", "From a request's start to its first token",
                              ["model"], registry=r,
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        speeds = (1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000)
        self.prefill_rate = Histogram("minferd_prefill_tokens_per_second", "A request's prefill rate", ["model"],
                                      registry=r, buckets=speeds)
        self.decode_rate = Histogram("minferd_decode_tokens_per_second", "A request's decode rate", ["model"],
                                     registry=r, buckets=speeds)
        self.refusals = Counter("minferd_refusals", "Requests refused, by gRPC status code", ["code"], registry=r)

    def first_token(self, model: str, seconds: float) -> None:
        self.ttft.labels(model).observe(seconds)

    def request(self, model: str, outcome: str, prompt_tokens: int, generated: int, seconds: float,
                timings: dict | None = None) -> None:
        """One request ended (done, cancelled or failed): counted whatever its outcome."""
        self.requests.labels(model, outcome).inc()
        self.tokens.labels(model, "prompt").inc(prompt_tokens)
        self.tokens.labels(model, "generated").inc(generated)
        self.latency.labels(model).observe(seconds)
        if timings:
            self.tokens.labels(model, "prompt_cached").inc(timings.get("cached_tokens", 0))
            if timings.get("prefill_tok_s"):
                self.prefill_rate.labels(model).observe(timings["prefill_tok_s"])
            if timings.get("decode_tok_s"):
                self.decode_rate.labels(model).observe(timings["decode_tok_s"])

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
