"""Prometheus metrics: pool and per-model bytes read from the ledger at scrape time, plus request,
token and latency counters fed by the server."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


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

    def request(self, model: str, prompt_tokens: int, generated: int, seconds: float) -> None:
        self.requests.labels(model).inc()
        self.tokens.labels(model, "prompt").inc(prompt_tokens)
        self.tokens.labels(model, "generated").inc(generated)
        self.latency.labels(model).observe(seconds)

    def refusal(self, code: str) -> None:
        self.refusals.labels(code).inc()

    def serve(self, port: int, addr: str = "127.0.0.1"):
        return start_http_server(port, addr=addr, registry=self.registry)
