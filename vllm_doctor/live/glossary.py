"""For every number ``top`` shows: where it comes from and how it is computed (the ``?`` screen)."""

from __future__ import annotations

from vllm_doctor.compat.metrics import BY_KEY


def _n(key: str) -> str:
    return " | ".join(BY_KEY[key].names)


def _layer_timing(mode: str | None) -> str:
    """How the doctor times a decoder layer under ``mode``."""
    eager = "eager mode: the layer's module forwards, timed from entry to return"
    compiled = "compiled modes: the spans between the token mixers' calls (attention, SSM), which run outside the graph"
    if mode is None:
        return f"{eager}; {compiled}"
    return f"this server runs {mode}: " + (eager if mode == "eager" else compiled)


def glossary(mode: str | None = None) -> list[tuple[str, str, str, str]]:
    """(panel, number, source, formula) rows; ``mode``: how the server runs the model (the model
    panel's, live/sources.run_mode), which decides how the layers are timed."""
    rate = (
        "Δcounter / Δvllm_doctor_scrape_timestamp_seconds (the server's clock in both scrapes: "
        "VLLM_DOCTOR_METRICS=1; exact); else / the longest time the server can have taken between its two "
        "reads (this scrape's reply read minus the last one's request sent: never above the real rate), "
        "'≥' where late replies leave that time uncertain (a gap in the history); none across a restart; never < 0"
    )
    hist = "histogram_quantile over (buckets now − buckets at window start); n = Δcount"
    return [
        ("engine", "running", _n("running"), "gauge, summed over engines"),
        ("engine", "waiting", _n("waiting"), "gauge, summed over engines"),
        ("engine", "preempted", _n("preemptions") + "_total", "counter total (and its rate)"),
        (
            "engine",
            "restarts seen",
            "process_start_time_seconds; every counter",
            "+1 when the start time changes or any counter goes back",
        ),
        ("engine", "server up", "process_start_time_seconds", "now − start time"),
        ("throughput", "generation tok/s", _n("generation_tokens") + "_total", rate),
        ("throughput", "prompt tok/s", _n("prompt_tokens") + "_total", rate),
        ("throughput", "requests/s", _n("requests") + "_total", rate),
        ("latency", "TTFT", _n("ttft"), hist),
        ("latency", "inter-token", _n("itl"), hist),
        ("latency", "end-to-end", _n("e2e"), hist),
        ("latency", "queue", _n("queue"), hist),
        (
            "latency",
            "'< X'",
            "the histogram's first bucket bound",
            "the percentile lies in the first bucket: the histogram cannot say more",
        ),
        ("KV cache", "usage", _n("kv_usage"), "gauge × 100 %"),
        ("KV cache", "blocks", _n("cache_config") + "{num_gpu_blocks, block_size}", "usage × num_gpu_blocks"),
        (
            "KV cache",
            "prefix hits",
            _n("prefix_hits") + " / " + _n("prefix_queries"),
            "Δhits / Δqueries over the latency window",
        ),
        (
            "GPUs",
            "util, memory, power, temp, clocks",
            "NVML (nvidia-ml-py) in the doctor's process",
            "nvmlDeviceGetUtilizationRates, GetMemoryInfo, GetPowerUsage, GetTemperature, GetClockInfo",
        ),
        (
            "GPUs",
            "cpu%, rss, threads (CPU host)",
            "/proc/PID/stat, status of the engine processes",
            "Δ(utime+stime) / Δt; VmRSS; Threads",
        ),
        (
            "model",
            "fwd per step (prefill/decode)",
            "doctor_collect on the private channel (worker extension)",
            "mean forward time of the profiled steps of each phase",
        ),
        (
            "model",
            "slowest layers/step",
            f"doctor_collect per-layer timing on sampled steps; {_layer_timing(mode)}",
            "each layer's time summed over the steps timed per layer, over their number (per step, as fwd)",
        ),
        ("model", "KV bytes", "doctor_kv", "bytes of the KV-cache storages"),
        (
            "model",
            "roofline",
            "config sizes (doctor_kv), step counts and times (doctor_collect), the device (doctor_placement)",
            "(weights once + KV of blocks in use x block size) / mean step time, as % of the device's peak "
            "bandwidth (2 x bus width / 8 x memory clock); 'above peak' = a wrong step time",
        ),
        (
            "model",
            "doctor % of the worker's time",
            "doctor_collect: the doctor's perf_counter around its step wrappers, timers and the calls it serves",
            "(own time in steps + in doctor_* calls) / the window's wall time, rank 0",
        ),
        ("model", "findings", "the engine checks (VD4xx/VD5xx) on the gathered facts", "as vllm-doctor attach"),
        ("status", "STALE n s", "the last good scrape", "now − time of the last good scrape; numbers frozen"),
        (
            "status",
            "BEHIND n s",
            "the frame on screen",
            "now − when its scrape came back, past 2 refreshes + 3 s: no new frame (a stuck poll, a starved top)",
        ),
        ("status", "SLOW /metrics n s", "the last scrape", "its request sent to its reply read, past the interval"),
    ]
