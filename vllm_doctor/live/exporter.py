"""The doctor's series in vLLM's own ``/metrics`` (``VLLM_DOCTOR=1``).

vLLM calls :func:`register` in each process it starts, through the doctor's second
``vllm.general_plugins`` entry point (:func:`vllm_doctor.plugins.register_metrics`).
The series are the operator's choice when the server starts: ``VLLM_DOCTOR=1`` and
``VLLM_DOCTOR_METRICS=1`` (:data:`~vllm_doctor.constants.METRICS_ENV`; off by default). With
both, :func:`register` adds a collector to ``prometheus_client``'s default registry, the one a
``vllm serve`` API server answers ``/metrics`` from, and in the API server starts a thread that
attaches to the engine's workers through the doctor's private channel as soon as they are up
(the process tree below this process; :class:`~vllm_doctor.live.channel.ChannelHandle`) with its
own window of their records (:class:`~vllm_doctor.live.sources.WindowReader`, the reader
``top``'s model panel uses), reads one window every :data:`WINDOW_S` seconds and adds it to the
counters below, until the server stops: the workers' hooks are on all that time (their cost:
docs/engine-stage.md). A scrape only copies what the last window left: it never waits for the
engine, and never starts, keeps or stops anything in it (vLLM does not apply ``--api-key`` to
``/metrics``: anyone who reaches the port may scrape). Without ``VLLM_DOCTOR_METRICS=1`` the
series are absent and nothing of the doctor's runs in the workers until a reader of the user's
own (``attach``, ``top``) attaches.

The series (``model_name`` is the label vLLM's own series carry; ``phase`` is prefill, decode or
mixed; times on the doctor's step clock, named in ``vllm_doctor_info``'s ``clock``):

- ``vllm_doctor_steps_total``, ``vllm_doctor_tokens_total``: steps and tokens, per phase;
  ``vllm_doctor_dropped_steps_total``: steps not counted there (their records let go in the
  workers: the buffer full while another reader lagged; 0 unless something is wrong);
- ``vllm_doctor_step_seconds_total``: their step time (the device clock on a GPU: CUDA events);
  ``vllm_doctor_clock_steps_total``: the steps whose step time is on that clock (on a GPU by
  default the sampled steps, the step after each, every 32nd and a window's first; the others count at the mean of the
  unsampled ones on it);
- ``vllm_doctor_forward_seconds_total`` over ``vllm_doctor_forward_steps_total``: the model's
  forward on the steps whose forward was timed;
- ``vllm_doctor_roofline_bandwidth_ratio``, ``vllm_doctor_roofline_compute_ratio``: the last
  window's mean step against the device's peak memory bandwidth and compute, per phase;
- ``vllm_doctor_layer_forward_ratio{layer}``: the slowest decoder layers' share of the forward
  (the last window timed per layer, five layers);
- ``vllm_doctor_own_seconds_total{part}``: the doctor's own host time in the workers (its
  wrappers, timers, per-layer marks, and the channel's calls: its reader threads' CPU time in
  them), and the exporter thread's CPU
  time in the API server (``part="exporter"``: reading and analysing each window);
  ``vllm_doctor_own_ratio``: the last window's share of the workers' wall time;
  ``vllm_doctor_samples_skipped_total``: steps due for a sample that the doctor's own budget
  (``VLLM_DOCTOR_OWN_BUDGET``, 0.5 % of the workers' time by default, on a GPU) left unsampled;
- ``vllm_doctor_kv_capacity_tokens``, ``vllm_doctor_kv_max_concurrency``: vLLM's own KV capacity
  (what it logs at start-up as "KV cache size" and "Maximum concurrency");
- ``vllm_doctor_scrape_timestamp_seconds``: the API server's clock (``time.time()``, seconds since
  the epoch) when this answer was rendered, read as :meth:`DoctorCollector.collect` runs: a gauge,
  not the exposition format's sample timestamp (Prometheus' guidance is that an exporter of live
  values sets none: Prometheus would store those samples at the given time instead of the
  scrape's and exempt them from staleness; a gauge is queryable, as node_exporter's
  ``node_time_seconds``). vLLM's counters are read in the same render: prometheus_client's ASGI
  app renders the whole registry in one turn of the API server's event loop, the loop that
  updates vLLM's counters, so none of them changes between this clock's read and theirs.
  ``top`` divides a counter's change by this series' change between two scrapes (exact rates
  however late the replies are read; without it, bounds from the client's clock);
- ``vllm_doctor_up``: 1 while attached and reading; ``vllm_doctor_info``: the clock, the model
  class, and why the doctor reads nothing (empty when it does); ``vllm_doctor_ranks{state}``: the
  engine's ranks it reads, and those it cannot (a Ray engine's workers on other nodes: each
  node's channel serves its own processes only).

With several API servers (``--api-server-count`` > 1, ``PROMETHEUS_MULTIPROC_DIR`` set) vLLM
answers ``/metrics`` from files its processes write, not from this registry: the doctor logs
that its series are not exported there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_doctor.compat.prometheus import Family
from vllm_doctor.constants import DOCTOR_ENV, METRICS_ENV, env_switch

if TYPE_CHECKING:  # the exporter loads in the API server: live.sources only when a window is read
    from vllm_doctor.live.sources import ModelSummary

WINDOW_S = 5.0  # one window of the workers' records per this many seconds
RETRY_S = 5.0  # the workers not reachable yet (still loading): try again after this
TOP_LAYERS = 5
PREFIX = "vllm_doctor_"
# the API server's clock when it rendered the /metrics answer (see the module's docstring)
SCRAPE_TIMESTAMP = PREFIX + "scrape_timestamp_seconds"
_log = logging.getLogger("vllm_doctor")
_collector: DoctorCollector | None = None
_guard = threading.Lock()


def register() -> None:
    """Called by :func:`vllm_doctor.plugins.register_metrics`, the entry point vLLM's
    ``load_general_plugins`` calls (in every process, maybe often): the series only in the API server."""
    global _collector
    if not env_switch(DOCTOR_ENV) or not env_switch(METRICS_ENV) or not serves_metrics():
        return
    with _guard:
        if _collector is not None:
            return
        from vllm_doctor.compat.prometheus import register as add

        _collector = DoctorCollector()
        try:
            why_not = add(_collector)
        except Exception as exc:  # never break vLLM's start-up for the doctor
            why_not = f"{type(exc).__name__}: {exc}"
        if why_not:
            _log.warning("vllm-doctor: no doctor series in /metrics: %s (`vllm-doctor top` reads the model)", why_not)
            return
        _collector.start()
        _log.warning(
            "vllm-doctor: %s=1: /metrics carries the doctor's series; the API server reads the workers "
            "through the doctor's channel from now until it stops",
            METRICS_ENV,
        )


def serves_metrics() -> bool:
    """Is this process a ``vllm serve`` API server (the process that answers ``/metrics``): a
    process that ``multiprocessing`` did not start, whose command line is vLLM's API server's?
    (Not the engine core or a worker, which vLLM spawns; not a script that builds ``vllm.LLM``.)"""
    import multiprocessing

    from vllm_doctor.live.proctree import label, read_proc

    if multiprocessing.parent_process() is not None:
        return False
    raw = read_proc(os.getpid())
    return raw is not None and label([raw])[0].role == "api-server"


@dataclass
class ExportState:
    """What the collector publishes: counters summed over the windows read, and the last
    window's ratios."""

    model_name: str = ""
    up: bool = False
    reason: str = "no scrape yet"
    clock: str = ""
    model_class: str = ""
    windows: int = 0
    counters: dict[tuple[str, str], float] = field(default_factory=dict)  # (series, label value) -> total
    phase_ratios: dict[tuple[str, str], float] = field(default_factory=dict)  # (series, phase) -> ratio
    layer_ratios: dict[int, float] = field(default_factory=dict)
    own_ratio: float | None = None
    # vLLM's own KV capacity (its start-up line): tokens, and requests of max_model_len at once
    kv_capacity_tokens: int | None = None
    kv_max_concurrency: float | None = None
    # the engine's ranks the exporter reads (their workers' channels are on this machine), and
    # those it cannot (a Ray engine's workers on other nodes: each node's channel is its own)
    ranks: dict[str, int] = field(default_factory=dict)

    def add(self, summary: ModelSummary) -> None:
        """One window (the channel's record of it): its sums onto the counters, its ratios in
        place of the last ones (a window without steps keeps them); read by attribute."""
        self.windows += 1
        self.clock = summary.clock or self.clock
        self.model_class = summary.model_class or self.model_class
        add = self._add
        kv = summary.kv
        if kv.capacity_tokens is not None:
            self.kv_capacity_tokens, self.kv_max_concurrency = kv.capacity_tokens, kv.max_concurrency
        add("dropped_steps_total", "", summary.dropped_steps)
        for phase, p in summary.phases.items():
            add("steps_total", phase, p.steps)
            add("tokens_total", phase, p.tokens)
            add("step_seconds_total", phase, p.steps * p.step_s_mean)
            add("clock_steps_total", phase, p.steps if p.clock_steps is None else p.clock_steps)
            if p.forward_s_mean is not None and p.forward_steps:
                add("forward_seconds_total", phase, p.forward_steps * p.forward_s_mean)
                add("forward_steps_total", phase, p.forward_steps)
                # the step time of those same steps: the forward's share of its step is the ratio of the
                # two (not of every step's mean, where the forward is timed on sampled steps only)
                if p.forward_steps_step_s_mean is not None:
                    add("forward_step_seconds_total", phase, p.forward_steps * p.forward_steps_step_s_mean)
        roof = summary.roofline
        if roof is not None and roof.available:
            for phase, rp in roof.phases.items():
                for series, value in (
                    ("roofline_bandwidth_ratio", rp.bandwidth_share),
                    ("roofline_compute_ratio", rp.compute_share),
                ):
                    if value is not None:
                        self.phase_ratios[(series, phase)] = value
        total = summary.layers_forward_s
        if summary.slowest_layers and total:  # the slowest layers' share of the forward timed per layer
            self.layer_ratios = {x.layer: x.total_s / total for x in summary.slowest_layers[:TOP_LAYERS]}
        doctor = summary.doctor
        if doctor is not None:
            for part, seconds in (doctor.host_s or {}).items():
                add("own_seconds_total", part, seconds)
            if doctor.rpc_s is not None:
                add("own_seconds_total", "channel", doctor.rpc_s)
            add("samples_skipped_total", "", doctor.samples_skipped)
            share = doctor.worker_share if doctor.worker_share is not None else doctor.share
            if share is not None and summary.steps:
                self.own_ratio = share

    def add_own(self, part: str, seconds: float) -> None:
        self._add("own_seconds_total", part, seconds)

    def _add(self, series: str, label: str, value: float | int | None) -> None:
        if value:
            key = (series, label)
            self.counters[key] = self.counters.get(key, 0.0) + float(value)


COUNTERS = {
    "steps_total": ("phase", "Steps the engine ran, per phase, as the doctor's step records count them"),
    "tokens_total": ("phase", "Tokens those steps scheduled, per phase"),
    "step_seconds_total": (
        "phase",
        "Their step time on the doctor's step clock (vllm_doctor_info's clock); where only some steps are on it "
        "(vllm_doctor_clock_steps_total), the others counted at the mean of those not sampled",
    ),
    "clock_steps_total": (
        "phase",
        "Steps whose step time is on the step clock (on a GPU by default the sampled steps, the step after each "
        "every 32nd and a window's first)",
    ),
    "forward_seconds_total": ("phase", "The model's forward time on the steps whose forward was timed"),
    "forward_steps_total": ("phase", "Steps whose forward was timed (vllm_doctor_forward_seconds_total's steps)"),
    "forward_step_seconds_total": (
        "phase",
        "The step time of the steps whose forward was timed: the forward's share of its step is "
        "vllm_doctor_forward_seconds_total over this (the forward is timed on sampled steps only)",
    ),
    "dropped_steps_total": (
        "",
        "Steps the doctor did not count: their records were let go in the workers (a full buffer while another "
        "reader lagged); not in the steps and tokens above",
    ),
    "own_seconds_total": (
        "part",
        "The doctor's own host time in the workers (wrappers, timers, marks; channel: the calls its readers' "
        "threads served, on their CPU clock) and the exporter's CPU time in the API server (exporter)",
    ),
    "samples_skipped_total": (
        "",
        "Steps due for a sample (forward and per-layer timing) that the doctor left unsampled to stay within its "
        "own budget of the workers' time (VLLM_DOCTOR_OWN_BUDGET)",
    ),
}
RATIOS = {
    "roofline_bandwidth_ratio": "The last window's mean step against the device's peak memory bandwidth, per phase",
    "roofline_compute_ratio": "The last window's mean step against the device's peak compute, per phase",
}


def more_channels(pid: int, known: int) -> bool:
    """Whether the engine around ``pid`` has more worker channels now than the ``known`` ones the
    exporter attached to (a scan of its process tree and of the channel directory; asked only
    while ranks are missing, once a window)."""
    from vllm_doctor.live.channel import ChannelHandle

    try:
        handle = ChannelHandle(None, pid=pid, timeout=5.0)
    except Exception:  # none at all now (the engine restarting): the read's own error says so
        return False
    try:
        return len(handle.paths) > known
    finally:
        handle.close()


def rows(state: ExportState, now: float | None = None) -> list[Family]:
    """The metric families of ``state``, as plain rows (:mod:`vllm_doctor.compat.prometheus`);
    ``now``: the server's clock as this answer is rendered (``vllm_doctor_scrape_timestamp_seconds``)."""
    model = state.model_name
    out = [
        Family(PREFIX + "up", "gauge", "1 while the doctor reads the workers through its channel", ["model_name"],
               [([model], 1.0 if state.up else 0.0)]),
        Family(PREFIX + "info", "gauge",
               "The doctor's clock, the model's class, and why it reads nothing (empty while it does)",
               ["model_name", "clock", "model_class", "reason"],
               [([model, state.clock, state.model_class, "" if state.up else state.reason], 1.0)]),
    ]  # fmt: skip
    if now is not None:
        out.append(
            Family(
                SCRAPE_TIMESTAMP,
                "gauge",
                "The API server's clock (seconds since the epoch) when it rendered this /metrics answer, read in the "
                "same render as vLLM's counters: rate = delta(counter) / delta(this)",
                ["model_name"],
                [([model], now)],
            )
        )
    for series, (label, text) in COUNTERS.items():
        labels = ["model_name", label] if label else ["model_name"]  # no label: one series
        samples = [
            ([model, value] if label else [model], total)
            for (name, value), total in sorted(state.counters.items())
            if name == series
        ]
        if not label and not samples and state.windows:  # read and none counted: a 0 is a value
            samples = [([model], 0.0)]
        out.append(Family(PREFIX + series.removesuffix("_total"), "counter", text, labels, samples))
    for series, text in RATIOS.items():
        samples = [([model, phase], r) for (name, phase), r in sorted(state.phase_ratios.items()) if name == series]
        out.append(Family(PREFIX + series, "gauge", text, ["model_name", "phase"], samples))
    out.append(
        Family(
            PREFIX + "layer_forward_ratio",
            "gauge",
            f"The {TOP_LAYERS} slowest decoder layers' share of the forward (the last window timed per layer)",
            ["model_name", "layer"],
            [([model, str(layer)], ratio) for layer, ratio in sorted(state.layer_ratios.items())],
        )
    )
    for series, text, value in (
        ("kv_capacity_tokens", "vLLM's own KV-cache capacity in tokens (its 'KV cache size' start-up line)",
         state.kv_capacity_tokens),
        ("kv_max_concurrency", "vLLM's own maximum concurrency: requests of max_model_len the KV cache holds at once",
         state.kv_max_concurrency),
    ):  # fmt: skip
        out.append(Family(PREFIX + series, "gauge", text, ["model_name"], [([model], float(value))] if value else []))
    out.append(
        Family(
            PREFIX + "own_ratio",
            "gauge",
            "The doctor's own time in the workers over their wall time (the last window)",
            ["model_name"],
            [([model], state.own_ratio)] if state.own_ratio is not None else [],
        )
    )
    out.append(
        Family(
            PREFIX + "ranks",
            "gauge",
            "The engine's ranks the exporter reads (state=read) and those it cannot: workers on other nodes "
            "(unreachable)",
            ["model_name", "state"],
            [([model, name], float(count)) for name, count in sorted(state.ranks.items())],
        )
    )
    return out


def families(state: ExportState, now: float | None = None) -> list[Any]:
    """The Prometheus metric families of ``state`` (prometheus_client's), with the server's clock
    ``now`` where given."""
    from vllm_doctor.compat.prometheus import families as as_families

    return as_families(rows(state, now))


class DoctorCollector:
    """A ``prometheus_client`` collector: :meth:`collect` publishes :class:`ExportState`; the
    reader thread that fills it runs from :meth:`start` (at the server's start) until
    :meth:`close`, whatever the scrapes."""

    def __init__(self, pid: int | None = None, window_s: float = WINDOW_S) -> None:
        self.pid = pid if pid is not None else os.getpid()
        self.window_s = window_s
        self.state = ExportState(reason="not attached yet: the workers are starting")
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def describe(self) -> list[Any]:
        return []  # registration asks nothing of the engine

    def start(self) -> None:
        """Start reading the workers (once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vllm-doctor-metrics", daemon=True)
                self._thread.start()

    def collect(self) -> Iterator[Any]:
        """The series as the last window left them: a copy, nothing asked of the engine; and
        this process's clock now, as the answer is rendered (the registry's other collectors,
        vLLM's counters, are read in the same render)."""
        now = time.time()
        with self._lock:
            fams = families(self.state, now)
        yield from fams

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _set(self, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self.state, key, value)

    def _run(self) -> None:
        from vllm_doctor.live.channel import ChannelHandle
        from vllm_doctor.live.sources import WindowReader

        reader = None
        handle: Any = None
        unreachable: list[int] = []
        try:
            while not self._stop.is_set():
                try:
                    if reader is None:
                        handle = ChannelHandle(None, pid=self.pid, timeout=30.0)
                        try:
                            pings = handle.rpc("doctor_ping")
                            names = [(p.get("data") or {}).get("served_model_name") for p in pings if p.get("ok")]
                            handle.name = next((n for n in names if n), None)
                            reader = WindowReader(handle)
                            unreachable = handle.unreachable_ranks()
                        except BaseException:
                            handle.close()
                            raise
                        read = len([r for r in pings if r.get("ok")])
                        # up once the first window is read (below): a scrape in between would say up
                        # with no clock or model class yet
                        self._set(
                            model_name=handle.name or "",
                            reason="",
                            ranks={"read": read, "unreachable": len(unreachable)},
                        )
                    cpu0 = time.thread_time()
                    summary = reader.read()
                    with self._lock:
                        self.state.add(summary)
                        self.state.up = True
                        # this thread's CPU in the API server (reading and analysing the window)
                        self.state.add_own("exporter", time.thread_time() - cpu0)
                    if unreachable and more_channels(self.pid, len(handle.paths)):
                        # a rank still starting when the exporter attached has its channel now
                        # (a tensor-parallel worker publishes after another): attach again to read it
                        reader.close()
                        reader = None
                        continue
                    self._stop.wait(self.window_s)
                except Exception as exc:  # the workers not up yet, gone, or restarted: try again
                    why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                    self._set(up=False, reason=str(why)[:300])
                    if reader is not None:  # its window goes with it: the steps until the next attach are not counted
                        _log.warning("vllm-doctor: /metrics stopped reading the workers (%s); attaching again", why)
                        reader.close()
                        reader = None
                    self._stop.wait(RETRY_S)
        finally:
            if reader is not None:
                reader.close()
