"""Prometheus metrics: pool and per-model bytes read from the ledger at scrape time, plus request,
token and latency counters fed by the server. Where the daemon has a token, /metrics asks for it
as `Authorization: Bearer` (the model names are what a token keeps from strangers).

A scrape first drops the counters' series of names no longer loaded: a client that loads and
unloads many names must not grow what /metrics holds. The port is served by uvicorn on one
event-loop thread: a thread per connection (prometheus_client's own server) let 100 idle
connections, which any local user may open, add 100 threads to the daemon."""
from __future__ import annotations

import os
import threading
import time

from prometheus_client import (CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector, make_asgi_app)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from minferd.errors import MinferdError

PATHS = ("w16", "mmq", "fused_b")


class PoolCollector:
    """Gauges read from one status snapshot at scrape time. Every byte appears once, so the
    series sum to the pool's used bytes: a model's own kv and scratch under its name, a file's
    weights and f16 copy under its weight set (shared by every load of the file). Labels never
    change with state: the current matmul path is a gauge of its own."""

    def __init__(self, host, on_scrape=None):
        self.host, self.on_scrape = host, on_scrape

    def collect(self):
        st = self.host.status()
        if self.on_scrape:  # registered first: the counters that follow see the pruning
            self.on_scrape({m["name"] for m in st["models"]})
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
        self.registry.register(PoolCollector(host, self.prune))
        self._series: dict[str, set] = {}  # model -> the (metric, label values) recorded for it
        self._lock = threading.Lock()
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

    def _of(self, metric, model: str, *rest):
        """metric's child for (model, *rest), remembered so prune can drop it with its model."""
        with self._lock:
            self._series.setdefault(model, set()).add((metric, (model, *rest)))
        return metric.labels(model, *rest)

    def prune(self, loaded: set[str]) -> None:
        """Drop every series of a model not in `loaded` (it was unloaded since it was recorded)."""
        with self._lock:
            gone = [m for m in self._series if m not in loaded]
            dropped = [self._series.pop(m) for m in gone]
        for series in dropped:
            for metric, labels in series:
                try:
                    metric.remove(*labels)
                except KeyError:  # removed already
                    pass

    def first_token(self, model: str, seconds: float) -> None:
        self._of(self.ttft, model).observe(seconds)

    def request(self, model: str, outcome: str, prompt_tokens: int, generated: int, seconds: float,
                timings: dict | None = None) -> None:
        """One request ended (done, cancelled or failed): counted whatever its outcome."""
        self._of(self.requests, model, outcome).inc()
        self._of(self.tokens, model, "prompt").inc(prompt_tokens)
        self._of(self.tokens, model, "generated").inc(generated)
        self._of(self.latency, model).observe(seconds)
        if timings:
            self._of(self.tokens, model, "prompt_cached").inc(timings.get("cached_tokens", 0))
            if timings.get("prefill_tok_s"):
                self._of(self.prefill_rate, model).observe(timings["prefill_tok_s"])
            if timings.get("decode_tok_s"):
                self._of(self.decode_rate, model).observe(timings["decode_tok_s"])

    def refusal(self, code: str) -> None:
        self.refusals.labels(code).inc()

    def serve(self, addr: str, port: int, token: str | None = None) -> "MetricsServer":
        """Serve /metrics on addr:port from a daemon thread; .shutdown() stops it."""
        app = make_asgi_app(self.registry)
        return MetricsServer(bearer_gate(app, token) if token else app, addr, port)


class MetricsServer:
    """uvicorn on its own thread and event loop (the HTTP front's way, http_api.start)."""

    def __init__(self, app, addr: str, port: int):
        import uvicorn
        self.server = uvicorn.Server(uvicorn.Config(app, host=addr, port=port, log_level="warning", lifespan="off",
                                                    access_log=False, timeout_keep_alive=5))
        self.thread = threading.Thread(target=self.server.run, name="minferd-metrics", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise MinferdError(f"the metrics endpoint did not start on {addr}:{port} (in use?)")

    def shutdown(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def bearer_gate(app, token: str):
    """The ASGI app behind `Authorization: Bearer <token>`; anything else is 401 and no metrics."""
    from minferd.auth import bearer_matches
    expected = f"Bearer {token}".encode()

    async def gated(scope, receive, send):
        if scope["type"] == "http":
            got = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
            if not bearer_matches(got.decode("latin-1"), expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"www-authenticate", b'Bearer realm="minferd"')]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        await app(scope, receive, send)
    return gated
