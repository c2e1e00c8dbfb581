"""vLLM's Prometheus metric names, 0.26 .. 0.32, in one table (the live view reads only this).

vLLM renamed families over time; a dashboard that knows one name shows nothing on a server
with the other. Each row is one quantity the doctor shows, with every name a vLLM release
used for it, newest first; :func:`resolve` picks whichever a scrape actually contains, so
the names are probed from the server's answer, never from its version string.

Sources: 0.32 ``vllm/v1/metrics/loggers.py`` (the installed wheel). Older releases of the V1
logger published both the old and the new name of a renamed family side by side for a
deprecation period (``vllm:gpu_cache_usage_perc`` beside ``vllm:kv_cache_usage_perc``,
``vllm:gpu_prefix_cache_*`` beside ``vllm:prefix_cache_*``, ``vllm:time_per_output_token_seconds``
before ``vllm:inter_token_latency_seconds``); a server that publishes only the old name is still
read. Counter samples carry the ``_total`` suffix on the wire (prometheus_client adds it).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricName:
    """One quantity: its key in the doctor, its Prometheus type, every family name (newest first)."""

    key: str
    kind: str  # "gauge" | "counter" | "histogram" | "info"
    names: tuple[str, ...]
    summary: str


METRICS: tuple[MetricName, ...] = (
    MetricName("running", "gauge", ("vllm:num_requests_running",), "requests in the running batch"),
    MetricName("waiting", "gauge", ("vllm:num_requests_waiting",), "requests waiting to be scheduled"),
    MetricName(
        "kv_usage",
        "gauge",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "fraction of KV-cache blocks in use (0..1)",
    ),
    MetricName("preemptions", "counter", ("vllm:num_preemptions",), "requests preempted (KV cache full)"),
    MetricName("prompt_tokens", "counter", ("vllm:prompt_tokens",), "prompt (prefill) tokens processed"),
    MetricName("generation_tokens", "counter", ("vllm:generation_tokens",), "tokens generated"),
    MetricName("requests", "counter", ("vllm:request_success",), "requests finished (every finish reason)"),
    MetricName(
        "prefix_queries",
        "counter",
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        "prefix-cache lookups (tokens)",
    ),
    MetricName(
        "prefix_hits",
        "counter",
        ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        "prefix-cache hits (tokens)",
    ),
    MetricName("ttft", "histogram", ("vllm:time_to_first_token_seconds",), "time to first token"),
    MetricName(
        "itl",
        "histogram",
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "time between two output tokens",
    ),
    MetricName("e2e", "histogram", ("vllm:e2e_request_latency_seconds",), "request latency, end to end"),
    MetricName("queue", "histogram", ("vllm:request_queue_time_seconds",), "time a request waited in the queue"),
    MetricName("cache_config", "info", ("vllm:cache_config_info",), "KV-cache configuration (labels)"),
    MetricName(
        "start_time",
        "gauge",
        ("process_start_time_seconds",),
        "API server process start (Unix time): a change means a restart",
    ),
)

BY_KEY: dict[str, MetricName] = {m.key: m for m in METRICS}


def resolve(present: Container[str]) -> dict[str, str]:
    """key -> the family name this server publishes (the newest one present); absent keys are left out."""
    out: dict[str, str] = {}
    for metric in METRICS:
        for name in metric.names:
            if name in present:
                out[metric.key] = name
                break
    return out
