"""The gateway's Prometheus metrics, in a registry of its own (never the global default).

Request-side metrics are observed as requests pass; engine-side ones come from one
stats() call per scrape. tl_step_duration_seconds is the core's own histogram of every
step's duration (stats()["step_ms_histogram"], core/step_times.py), exported as it is.
Gauge names never end in `_total`: Prometheus keeps that suffix for counters.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from core.sched_types import FINISH_REASONS, FinishReason
from frontend.http.format import Tally

ABORT = FinishReason.ABORT.value
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class EngineCollector(Collector):
    """Gauges and counters read from the latest stats() snapshot (None: engine down)."""

    def __init__(self):
        self.stats: dict | None = None

    def collect(self):
        s = self.stats
        yield _gauge("tl_engine_up", "1 when the last scrape's stats() call answered",
                     0 if s is None else 1)
        if s is None:
            return
        yield _gauge("tl_requests_running", "requests in the running batch", s["running"])
        yield _gauge("tl_requests_waiting", "requests in the waiting queue", s["waiting"])
        yield _gauge("tl_kv_blocks_used", "KV cache blocks in use",
                     s["total_blocks"] - s["free_blocks"])
        yield _gauge("tl_kv_blocks_capacity", "KV cache blocks in the pool", s["total_blocks"])
        yield CounterMetricFamily("tl_preemptions", "requests preempted by the scheduler",
                                  value=s.get("preemptions", 0))
        yield CounterMetricFamily("tl_engine_steps", "engine steps run", value=s["steps"])
        yield _gauge("tl_kv_blocks_cached", "free KV blocks holding a reusable prefix",
                     s.get("cached_blocks", 0))
        for name, doc in PREFIX_COUNTERS + SPEC_COUNTERS:
            yield CounterMetricFamily(f"tl_{name}", doc, value=s.get(name, 0))
        yield from replica_gauges(s.get("replicas") or [])
        hist = s.get("step_ms_histogram")
        if hist is not None:
            yield step_histogram(hist)


def step_histogram(h: dict) -> HistogramMetricFamily:
    """The core's step-time histogram (cumulative counts per bound in ms, then +Inf)."""
    *finite, total = h["counts"]
    buckets = [(f"{le / 1000:g}", c) for le, c in zip(h["le_ms"], finite)]
    return HistogramMetricFamily(
        "tl_step_duration_seconds", "engine step time (schedule, forward, on_step), every step",
        buckets=[*buckets, ("+Inf", total)], sum_value=h["sum_ms"] / 1000)


PREFIX_COUNTERS = (
    ("prefix_query_tokens", "prompt tokens looked up in the prefix cache at admissions"),
    ("prefix_hit_tokens", "of those, tokens served from the cache"),
    ("prefix_recompute_hit_tokens", "of the hits, a preempted request's own earlier blocks"))
SPEC_COUNTERS = (
    ("draft_tokens", "speculative decoding: draft tokens verified"),
    ("accepted_tokens", "of those, drafts the model sampled too (kept)"))


REPLICA_GAUGES = (
    ("tl_replica_requests_running", "requests in one replica's running batch",
     lambda r: r["running"]),
    ("tl_replica_requests_waiting", "requests in one replica's waiting queue",
     lambda r: r["waiting"]),
    ("tl_replica_kv_blocks_used", "KV cache blocks in use in one replica's pool",
     lambda r: r["total_blocks"] - r["free_blocks"]),
    ("tl_replica_kv_blocks_capacity", "KV cache blocks in one replica's pool",
     lambda r: r["total_blocks"]))


def replica_gauges(replicas: list[dict]):
    """Each engine replica's figures, labelled `replica` (stats()["replicas"])."""
    for name, doc, value in REPLICA_GAUGES:
        g = GaugeMetricFamily(name, doc, labels=["replica"])
        for r in replicas:
            g.add_metric([str(r["replica"])], value(r))
        yield g


def _gauge(name: str, doc: str, value) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.engine = EngineCollector()
        r.register(self.engine)
        self.http = Counter("tl_http_requests", "HTTP requests answered, by path and status",
                            ["path", "code"], registry=r)
        self.finished = Counter("tl_requests_finished",
                                "generation requests finished, by the engine's finish reason",
                                ["finish_reason"], registry=r)
        for reason in FINISH_REASONS:
            self.finished.labels(reason)
        self.prompt_tokens = Counter("tl_prompt_tokens", "prompt tokens of requests served",
                                     registry=r)
        self.completion_tokens = Counter("tl_completion_tokens", "tokens generated",
                                         registry=r)
        self.ttft = Histogram("tl_time_to_first_token_seconds",
                              "request arrival at the gateway to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("tl_time_per_output_token_seconds",
                              "mean time between tokens after the first, per request",
                              buckets=LATENCY_BUCKETS, registry=r)

    def observe_http(self, path: str, code: int) -> None:
        self.http.labels(path, str(code)).inc()

    def observe_request(self, t: Tally, aborted: bool = False) -> None:
        """Once per generation request, when it ends (finished, failed or abandoned).
        `aborted`: its client disconnected (the gateway's 499) or the gateway stopped, so
        one still unfinished was aborted: counted under finish_reason "abort"."""
        self.prompt_tokens.inc(t.prompt_tokens)
        self.completion_tokens.inc(t.completion_tokens)
        reason = t.finish_reason or (ABORT if aborted else None)
        if reason is not None:
            self.finished.labels(reason).inc()
        if t.first_token_at is not None:
            self.ttft.observe(t.first_token_at - t.started)
            if t.completion_tokens > 1:
                self.tpot.observe((t.last_token_at - t.first_token_at)
                                  / (t.completion_tokens - 1))

    def refresh(self, stats: dict | None) -> None:
        self.engine.stats = stats

    def render(self) -> bytes:
        return generate_latest(self.registry)
