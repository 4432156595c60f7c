"""Prometheus metrics with SGLang's names, behind ``--enable-metrics``.

Mirrors python/sglang/srt/metrics/collector.py: TokenizerMetricsCollector (per-request
token counters and latency histograms, fed by the TokenizerManager as outputs arrive)
and SchedulerMetricsCollector (gauges of the scheduler's queues and KV pool). SGLang's
scheduler pushes its gauges every few decode steps from its own process; minisgl's
scheduler may live on a thread or in a TP process, so the gauges are set from
``get_internal_state`` when /metrics is scraped, which costs nothing between scrapes.
Each collector registers in the app's own CollectorRegistry (SGLang uses the process-wide
one), so several servers can live in one test process. Omitted: LoRA, speculative,
disaggregation, grammar, storage and per-stage metrics, custom labels.
"""

from __future__ import annotations

import time

# SGLang's buckets (collector.py, TokenizerMetricsCollector.__init__), in seconds.
_TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
_ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]  # fmt: skip
_E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800]


class TokenizerMetricsCollector:
    """Counters and histograms of finished requests (SGLang's TokenizerMetricsCollector)."""

    def __init__(self, registry, labels: dict[str, str]) -> None:
        from prometheus_client import Counter, Histogram

        self.labels = labels
        names = list(labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"sglang:{name}", doc, names, registry=registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(f"sglang:{name}", doc, names, buckets=buckets, registry=registry).labels(**labels)

        # prometheus_client appends "_total" to a counter's name itself, as SGLang's names end.
        self.prompt_tokens_total = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens_total = counter("generation_tokens", "Number of generation tokens processed.")
        self.cached_tokens_total = counter("cached_tokens", "Number of cached prompt tokens.")
        self.num_requests_total = counter("num_requests", "Number of requests processed.")
        self.num_aborted_requests_total = counter("num_aborted_requests", "Number of requests aborted.")
        self.histogram_time_to_first_token = histogram(
            "time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self.histogram_inter_token_latency = histogram(
            "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )
        self.histogram_e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", _E2E_BUCKETS
        )

    def observe_one_finished_request(self, prompt_tokens: int, generation_tokens: int, cached_tokens: int,
                                     e2e_latency: float) -> None:  # fmt: skip
        self.prompt_tokens_total.inc(prompt_tokens)
        self.generation_tokens_total.inc(generation_tokens)
        self.cached_tokens_total.inc(cached_tokens)
        self.num_requests_total.inc(1)
        self.histogram_e2e_request_latency.observe(e2e_latency)

    def observe_one_aborted_request(self) -> None:
        self.num_aborted_requests_total.inc(1)

    def new_request_timer(self) -> "ReqTimer":
        return ReqTimer(self)


class ReqTimer:
    """One request's clock: its first output gives the TTFT, every later one the inter-token
    latency (spread over the tokens it carries, as SGLang's observe_inter_token_latency), the
    last one the end-to-end latency and the token counts."""

    def __init__(self, collector: TokenizerMetricsCollector) -> None:
        self.collector = collector
        self.created = self.last = time.perf_counter()
        self.first_token_seen = False

    def on_output(self, num_new_tokens: int, meta_info: dict) -> None:
        now = time.perf_counter()
        if num_new_tokens:
            if not self.first_token_seen:
                self.collector.histogram_time_to_first_token.observe(now - self.created)
                self.first_token_seen = True
            else:
                interval = (now - self.last) / num_new_tokens
                for _ in range(num_new_tokens):
                    self.collector.histogram_inter_token_latency.observe(interval)
            self.last = now
        if meta_info.get("finish_reason") is not None:
            self.collector.observe_one_finished_request(
                meta_info.get("prompt_tokens", 0),
                meta_info.get("completion_tokens", 0),
                meta_info.get("cached_tokens", 0),
                now - self.created,
            )


class SchedulerMetricsCollector:
    """Gauges of the scheduler's state (SGLang's SchedulerMetricsCollector.log_stats)."""

    def __init__(self, registry, labels: dict[str, str]) -> None:
        from prometheus_client import Gauge

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, list(labels), registry=registry).labels(**labels)

        self.num_running_reqs = gauge("num_running_reqs", "The number of running requests.")
        self.num_used_tokens = gauge("num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("token_usage", "The token usage.")
        self.num_queue_reqs = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        self.cache_hit_rate = gauge("cache_hit_rate", "The prefix cache hit rate.")
        self.max_total_num_tokens = gauge("max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.num_retracted_reqs = gauge("num_retracted_reqs", "The number of retracted requests.")

    def log_stats(self, state: dict) -> None:
        """Set the gauges from Scheduler.get_internal_state's dict. Used tokens are those
        held by running requests: what is in the radix cache unreferenced (evictable) is free room."""
        total = state["max_total_num_tokens"]
        used = total - state["available_kv_tokens"] - state["evictable_tokens"]
        self.num_running_reqs.set(state["num_running_reqs"])
        self.num_used_tokens.set(used)
        self.token_usage.set(used / max(total, 1))
        self.num_queue_reqs.set(state["num_waiting_reqs"])
        self.cache_hit_rate.set(state["hit_rate"])
        self.max_total_num_tokens.set(total)
        self.num_retracted_reqs.set(state["num_retracted_reqs"])


class MetricsCollectors:
    """Both collectors over one registry, as the /metrics route renders them."""

    def __init__(self, model_name: str) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self.tokenizer = TokenizerMetricsCollector(self.registry, labels)
        self.scheduler = SchedulerMetricsCollector(self.registry, labels)

    def render(self, internal_state: dict) -> tuple[bytes, str]:
        """The Prometheus text exposition, after setting the scheduler's gauges from its state."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.scheduler.log_stats(internal_state)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
