"""The sources behind ``vllm-doctor top``: one interface, typed frames.

A :class:`Source` answers :meth:`Source.poll` with a :class:`Frame` (metrics derived from a
``/metrics`` scrape, the devices, the model seen from inside); ``top`` polls a
:class:`LiveSource`, ``replay`` a :class:`vllm_doctor.live.record.ReplaySource`. The app only
draws frames. Every external call is time-boxed; nothing here raises for a server that is down.
"""

from __future__ import annotations

import http.client
import math
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from vllm_doctor.analysis.records import (
    DoctorOverhead,
    EngineAnatomy,
    EngineProfile,
    KvSummary,
    LayerTotal,
    PhaseSummary,
    ProcessBox,
    Record,
    Roofline,
)
from vllm_doctor.compat.http import normalize_url
from vllm_doctor.facts.anatomy import CompileState
from vllm_doctor.live.derive import Deriver, MetricsFrame
from vllm_doctor.live.devices import DevicesFrame
from vllm_doctor.model import Report, report_order
from vllm_doctor.units import clip

__all__ = [
    "EnginePids",
    "Frame",
    "LiveSource",
    "ModelChannel",
    "ModelSummary",
    "Source",
    "model_summary",
    "normalize_url",
    "scrape",
]

MAX_SCRAPE_BYTES = 16 * 2**20
MODEL_EVERY_S = 5.0
# top times the layers on every 64th step of a phase (attach/profile: every 8th). Per-layer timing
# is most of the doctor's cost in a serving engine (bench/bench_engine.py: 3.1 % of a step's host
# time on the H200 at every 8th step, against 0.9 % for the per-step wrappers alone); a live
# overview needs a few sampled steps per window, not one in eight.
MODEL_SAMPLE_EVERY = 64
# Each window asks the workers for the profile only; the anatomy, placement, KV cache and memory
# (each one more collective_rpc that the engine serves between two steps, plus /version,
# /v1/models and an NVML snapshot in top) are asked for again once a minute.
MODEL_FULL_EVERY_S = 60.0
# a full read that found no KV cache in vLLM's workers (the engine still starting: the /metrics
# exporter attaches while vLLM loads the model, before it makes the KV cache) is asked again at
# the next read instead of a minute later, this many times at most (an engine with no KV cache
# to find keeps its minute)
MODEL_FULL_RETRIES = 12
# the model channel failed (no channel yet, a server restarted): tried again after 5 s, doubling to this
MODEL_RETRY_MAX_S = 60.0


@dataclass(frozen=True)
class PanelFinding(Record):
    """A VD4xx/VD5xx finding as the model panel shows it."""

    code: str | None = None
    outcome: str | None = None
    severity: str | None = None
    message: str | None = None
    hint: str | None = None
    subject: str | None = None


@dataclass(frozen=True)
class ModelSummary(Record):
    """What ``top``'s model panel draws of one window (:attr:`ModelChannel.latest`, a frame's
    ``model``; a recording holds its JSON): the engine profile's summaries, bounded."""

    available: bool = False
    reason: str = ""
    model_class: str | None = None
    clock: str | None = None  # the step and forward times' clock (units.clock_name)
    steps: int = 0
    # steps of this window whose records the workers let go (their buffer full while another
    # reader lagged): not in ``steps`` nor ``phases``
    dropped_steps: int = 0
    phases: dict[str, PhaseSummary] = field(default_factory=dict)
    slowest_layers: list[LayerTotal] = field(default_factory=list)  # each layer's sum over the steps timed per layer
    layers_forward_s: float | None = None  # the forward of the steps timed per layer (the layers' whole)
    layers_timed_steps: int = 0  # the steps timed per layer (the layers' sums over them; 0: unknown)
    sample_every: int | None = None  # the workers time one step in this many per phase (forward and layers)
    mode: str | None = None  # how the server runs the model (run_mode): eager, torch.compile, CUDA graphs
    timed_fraction: float | None = None
    kv: KvSummary = field(default_factory=KvSummary)
    findings: list[PanelFinding] = field(default_factory=list)
    doctor: DoctorOverhead | None = None
    roofline: Roofline | None = None
    processes: list[ProcessBox] = field(default_factory=list)
    window_s: float | None = None  # the window's length
    as_of: float | None = None  # when it was gathered (time.time())
    quiet_s: float | None = None  # an idle window: how long ago the last steps ran


@dataclass(frozen=True)
class Frame:
    """One refresh: what every panel draws. Its parts are records; the recorder writes their JSON
    (:class:`vllm_doctor.live.record.Recorder`) and a replay reads them back."""

    seq: int
    t: float
    url: str
    interval_s: float
    metrics: MetricsFrame
    devices: DevicesFrame | None = None  # the devices sampler's (None: sampling is off)
    model: ModelSummary | None = None  # ModelChannel.latest (None: the channel is off)
    raw: str | None = field(default=None, repr=False)  # the scrape as received (recording only)
    replay: dict[str, Any] | None = None  # position in a recording: {"index", "count", "speed"}
    sent: float | None = None  # when the scrape's request went out (``t``: when its reply was read)


class Source(Protocol):
    url: str

    @property
    def interval_s(self) -> float:
        """Wall seconds between two polls."""
        ...

    def poll(self) -> Frame: ...

    def close(self) -> None: ...


class Scraper:
    """``scrape`` over one kept-alive connection (top asks once a second; a new connection each
    time costs as much CPU as parsing the answer). Reconnects after any error."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._path = parts.path.rstrip("/") + "/metrics"
        self._conn: http.client.HTTPConnection | None = None

    def __call__(self, timeout: float) -> tuple[str | None, str]:
        for attempt in (0, 1):  # a kept-alive connection the server closed: one fresh try
            fresh = self._conn is None
            try:
                if self._conn is None:
                    cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                    self._conn = cls(self._host, self._port, timeout=timeout)
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
                self._conn.request("GET", self._path, headers={"Accept-Encoding": "identity"})
                resp = self._conn.getresponse()
                raw = resp.read(MAX_SCRAPE_BYTES + 1)
                if len(raw) > MAX_SCRAPE_BYTES:
                    self.close()
                    return None, f"/metrics answered more than {MAX_SCRAPE_BYTES // 2**20} MiB"
                if resp.will_close:
                    self.close()
                if resp.status != 200:
                    return None, f"/metrics answered HTTP {resp.status}"
                return raw.decode("utf-8", errors="replace"), ""
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self.close()
                if fresh or attempt:
                    reason = getattr(exc, "reason", None) or exc or type(exc).__name__
                    if isinstance(exc, TimeoutError):  # reached, but a loaded server answered too late
                        reason = f"no answer within {timeout:g} s"
                    return None, f"cannot reach {self.url}: {reason}"
        return None, f"cannot reach {self.url}"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def scrape(url: str, timeout: float) -> tuple[str | None, str]:
    """GET ``url``/metrics once within ``timeout`` seconds: (text, "") or (None, why not)."""
    once = Scraper(url)
    try:
        return once(timeout)
    finally:
        once.close()


class ModelChannel:
    """The model from inside: the doctor's worker extension, through its private channel.

    Works when the server runs with ``VLLM_DOCTOR=1`` (started by this user, on this machine:
    :mod:`vllm_doctor.live.channel`). A
    background thread attaches once (the sampled forward profiler, as ``vllm-doctor attach``),
    gathers every ``every_s`` seconds one window (:class:`WindowReader`: the steps since the
    last gather, so a reply is bounded by one window, never by the hours since the attach; the
    workers only copy what they recorded, never block a step on the doctor), and detaches on
    :meth:`close`. A window without steps keeps the last one that had some.
    """

    def __init__(self, url: str, every_s: float = MODEL_EVERY_S, timeout: float = 10.0) -> None:
        self.url = url
        self.every_s = every_s
        self.timeout = timeout
        self.latest = ModelSummary(reason="connecting to the worker extension")
        self._read_once = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-model", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Attach, read windows; when the channel fails (the server restarted on the same port:
        new processes, new sockets; or it has no channel yet), say why, and find the server's
        workers again after ``every_s`` seconds, doubling up to :data:`MODEL_RETRY_MAX_S`."""
        wait = self.every_s
        while not self._stop.is_set():
            reason = self._attached()
            if reason is None:  # closed
                return
            if self._read_once:
                wait = self.every_s  # it read before it failed: a new server is tried soon
            self.latest = ModelSummary(reason=clip(f"{reason} (trying again in {wait:.0f} s)", 300))
            self._stop.wait(wait)
            wait = min(MODEL_RETRY_MAX_S, wait * 2)

    def _attached(self) -> str | None:
        """One attachment, read until it fails: why it failed (None: closed)."""
        from vllm_doctor.errors import DoctorInputError
        from vllm_doctor.live.attach import ExtensionMissing, served_engine

        reader = None
        self._read_once = False
        try:
            # no op-by-op probe (attach's VD403/VD404): it slows the probed steps, and top watches
            # a server that serves; the sampled profiler and the checks on its facts stay
            reader = WindowReader(served_engine(self.url, timeout=self.timeout))
            while not self._stop.is_set():
                summary = reader.read()
                self._read_once = True
                last = self.latest
                if summary.steps and not summary.slowest_layers:
                    # no step of this window was sampled per layer: the last sampled ones stand
                    summary = replace(summary, slowest_layers=last.slowest_layers)
                if summary.steps or not last.steps:
                    self.latest = summary
                else:  # an idle window: keep the last window that ran steps, say how old it is
                    now = summary.as_of or time.time()
                    self.latest = replace(last, quiet_s=round(now - (last.as_of or now), 1))
                self._stop.wait(self.every_s)
            return None
        except (ExtensionMissing, DoctorInputError) as exc:
            return str(getattr(exc, "message", exc))
        except Exception as exc:  # the channel is optional: say why it stopped, keep the rest running
            return f"model channel failed: {type(exc).__name__}: {exc}"
        finally:
            if reader is not None:
                reader.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout + 5)


class WindowReader:
    """The model from inside, one window at a time: attaches to the workers behind ``handle``
    (the sampled forward profiler, as ``vllm-doctor attach`` without its op-by-op probe) and
    :meth:`read` gives what ran since the previous read, as a :class:`ModelSummary`. Each reader
    of the private channel has its own window in the workers: ``top``'s panel and the ``/metrics``
    exporter read the same server without taking steps from each other. The parts that do not
    change while serving (anatomy, KV cache, placement) are asked for once a minute."""

    def __init__(self, handle: Any, sample_every: int = MODEL_SAMPLE_EVERY) -> None:
        from vllm_doctor.live.attach import EngineDoctor

        self.doc = EngineDoctor(handle, probe=False, sample_every=sample_every)
        self.doc.attach()
        self.since = time.time()
        self._full: Any = None
        self._full_at = 0.0
        self._full_again = 0  # full reads asked again early, for a KV cache not made yet

    def read(self) -> ModelSummary:
        from vllm_doctor.live.attach import build_engine_report

        doc = self.doc
        full = self._full is None or time.monotonic() - self._full_at >= MODEL_FULL_EVERY_S
        if full:
            facts = self._full = doc.gather(reset=True, timeline=False)
            self._full_at = time.monotonic()
        else:
            facts = doc.gather(reset=True, parts=("profile",), previous=self._full, timeline=False)
        now = time.time()
        gone = channel_gone(facts)
        if gone:
            raise ChannelGone(gone)
        lost = lost_windows(facts)
        if lost:  # the records since the last read went with the old connection: a new window from now
            doc.attach()
            self.since = now
            return ModelSummary(reason=f"{lost}: attached again, a new window starts now", as_of=now)
        # the panel draws summaries: no per-step records, no per-layer trace
        report = build_engine_report(facts, doc.handle.model_name(), timeline=False)
        summary = replace(model_summary(report), window_s=round(now - self.since, 2), as_of=now)
        self.since = now
        if full and summary.kv.capacity_tokens is None and self._full_again < MODEL_FULL_RETRIES:
            self._full_again += 1
            self._full_at = time.monotonic() - MODEL_FULL_EVERY_S  # the next read is a full one
        return summary

    def close(self) -> None:
        """Detach (the workers' hooks come off when their last reader leaves) and close the
        connections."""
        doc = self.doc
        try:
            if doc.attached:
                doc.detach()
        except Exception:  # the server may be gone; nothing is left to undo then
            pass
        close = getattr(doc.handle, "close", None)
        if close is not None:
            close()


class ChannelGone(RuntimeError):
    """No worker answered on its channel connection (the server went away, or restarted)."""


def channel_gone(facts: Any) -> str:
    """Why no worker answered the profile (every one's connection failed), or ""."""
    errors = [worker.errors.get("profile") or {} for worker in facts.workers]
    if not errors or any(error.get("type") != "ChannelError" for error in errors):
        return ""
    return str(errors[0].get("message") or "the channel failed")


def lost_windows(facts: Any) -> str:
    """Why this reader's window is gone from some worker ("" when it is not): the worker has
    no window for this reader (its channel connection closed and opened again: the window ended
    with the old one), or no profiler (the hooks came off when the last reader left)."""
    for worker in facts.workers:
        error = worker.errors.get("profile") or {}
        if error.get("type") == "NoWindow":
            return f"rank {worker.rank}: the window was lost with the channel's connection"
        data = worker.get("profile")
        if data is not None and data.get("profiling") is False:
            return f"rank {worker.rank}: the profiler was off (the channel's connection was lost)"
    return ""


class ModelWindow:
    """One window of the model from inside, for ``top --once``: attach through the private
    channel at :meth:`open`, read what ran until :meth:`read` (a :class:`WindowReader`'s one
    window) and detach. A server without the channel gives a summary that says why (never an
    error: the rest of ``--once`` stands)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url, self.timeout = url, timeout
        self.reader: WindowReader | None = None
        self.reason = ""

    def open(self) -> ModelWindow:
        from vllm_doctor.errors import DoctorInputError
        from vllm_doctor.live.attach import ExtensionMissing, served_engine

        try:
            self.reader = WindowReader(served_engine(self.url, timeout=self.timeout))
        except (ExtensionMissing, DoctorInputError) as exc:
            self.reason = clip(str(getattr(exc, "message", exc)), 300)
        return self

    def read(self) -> ModelSummary:
        if self.reader is None:
            return ModelSummary(reason=self.reason or "not attached")
        try:
            return self.reader.read()
        except Exception as exc:  # the model is optional in --once: say why it is missing
            return ModelSummary(reason=clip(f"model channel failed: {type(exc).__name__}: {exc}", 300))
        finally:
            self.close()

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.close()


def model_summary(report: Report, top_layers: int = 5) -> ModelSummary:
    """What the model panel draws, from an engine report's records (bounded: no steps, no
    per-layer rows)."""
    held, facts = report.profiles.get("engine"), report.facts.get("engine")
    profile = held if isinstance(held, EngineProfile) else EngineProfile()
    anatomy = facts if isinstance(facts, EngineAnatomy) else EngineAnatomy()
    slow = sorted(profile.layers.by_layer, key=lambda x: -x.total_s)[:top_layers]
    findings = [  # in the report's order (report.json's)
        PanelFinding(
            code=f.code,
            outcome=f.outcome.value,
            severity=f.severity.value,
            message=f.message,
            hint=f.hint,
            subject=f.subject,
        )
        for f in sorted(report.findings, key=report_order)
    ]
    roof = profile.roofline
    return ModelSummary(
        available=profile.available,
        reason=profile.reason or profile.layers_reason or "",
        model_class=anatomy.model.class_name,
        clock=profile.clock,
        steps=profile.steps_recorded,
        dropped_steps=profile.dropped_steps,
        phases=profile.phases,
        slowest_layers=[LayerTotal(layer=x.layer, total_s=x.total_s) for x in slow],
        layers_forward_s=profile.layers.forward_total_s if slow else None,
        layers_timed_steps=profile.layers.timed_steps,
        sample_every=profile.layers.sample_every,
        mode=run_mode(anatomy.compile or next((w.compile for w in anatomy.workers if w.compile), None)),
        timed_fraction=profile.layers.timed_fraction,
        kv=replace(anatomy.kv_cache, groups=[]),
        findings=[
            f
            for f in findings
            if str(f.code or "").startswith(("VD4", "VD5")) and f.outcome in ("fail", "warn", "crash")
        ][:20],
        doctor=profile.doctor_overhead,
        # the panel's roofline line: per phase the rate, its share and the bytes of a step
        roofline=replace(roof, layers=[], notes=[]) if roof is not None else None,
        processes=[p for p in anatomy.processes if p.pid],
    )


def run_mode(state: CompileState | None) -> str | None:
    """How vLLM runs the model, from the workers' compile state: ``eager``, ``torch.compile``,
    ``CUDA graphs`` or both joined by ``+`` (None: the workers did not say)."""
    if state is None:
        return None
    if state.eager or state.enforce_eager:
        return "eager"
    parts = [name for on, name in ((state.compiled, "torch.compile"), (state.cudagraphs, "CUDA graphs")) if on]
    return " + ".join(parts) or None


class EnginePids:
    """The engine's processes as ``(pid, label)`` for the devices sampler.

    From /proc (live/proctree: the process listening on the URL's port and its children); for
    a server on another machine, from the model channel's anatomy when it has one; else none.
    Finding the listener reads every process's open files (tens of ms), so it runs again only
    when the processes found are gone (a restarted server has new pids: checked each call from
    their /proc start times), every ``every_s`` seconds for late children, and, while nothing is
    found, after 2, 4, 8 ... up to 30 seconds.
    """

    def __init__(self, url: str, model: ModelChannel | None, every_s: float = 60.0) -> None:
        self.url = url
        self.model = model
        self.every_s = every_s
        self._pids: list[tuple[int, str]] = []
        self._starts: dict[int, str | None] = {}
        self._at = -math.inf
        self._backoff = 2.0

    def __call__(self) -> list[tuple[int, str]]:
        now = time.monotonic()
        if self._pids:
            due = now - self._at >= self.every_s or not self._alive()
        else:
            due = now - self._at >= self._backoff
            if due and self._at > -math.inf:
                self._backoff = min(30.0, self._backoff * 2)
        if due:
            self._at = now
            self._pids = self._lookup()
            self._starts = {pid: _start_time(pid) for pid, _ in self._pids}
            if self._pids:
                self._backoff = 2.0
        return self._pids

    def _alive(self) -> bool:
        return all(_start_time(pid) == start for pid, start in self._starts.items())

    def _lookup(self) -> list[tuple[int, str]]:
        from vllm_doctor.errors import DoctorInputError
        from vllm_doctor.live.proctree import discover

        try:
            return [(p.pid, p.label()) for p in discover(url=self.url) if p.role != "other"]
        except (DoctorInputError, OSError):
            pass
        procs = self.model.latest.processes if self.model is not None else []
        return [(p.pid, p.role) for p in procs if p.pid]


def _start_time(pid: int) -> str | None:
    from vllm_doctor.procfs import stat_fields

    fields = stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


class LiveSource:
    """A running server at ``url``: scrapes ``/metrics``, samples devices, reads the model channel."""

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 1.0,
        window_s: float = 60.0,
        timeout_s: float = 2.0,
        devices: Any = None,
        model: ModelChannel | None = None,
        clock: Callable[[], float] = time.time,
        prefetch: bool = False,
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.deriver = Deriver(window_s=window_s)
        self.devices = devices  # a DeviceSampler (sample() -> DevicesFrame), or None
        self.model = model
        self.clock = clock
        self.seq = 0
        self._scrape = Scraper(url)
        # prefetch: the first scrape starts now, in a thread, and the first poll() uses it (top's
        # first picture does not wait for the app's imports and the server's answer one after the other)
        self._first: tuple[str | None, float, float, Any] | None = None  # (text, sent, t, derived metrics)
        self._prefetch: threading.Thread | None = None
        if prefetch:
            self._prefetch = threading.Thread(target=self._fetch_first, name="vllm-doctor-first-scrape", daemon=True)
            self._prefetch.start()

    def _fetch_first(self) -> None:
        sent = self.clock()
        (text, error), t = self._scrape(self.timeout_s), self.clock()
        # derived here too: the first poll() joins this thread before it touches the deriver
        self._first = (text, sent, t, self.deriver.update(t, text, error, sent=sent))

    @property
    def window_s(self) -> float:
        return self.deriver.window_s

    @window_s.setter
    def window_s(self, value: float) -> None:
        self.deriver.window_s = value

    def poll(self) -> Frame:
        # a busy API server answers /metrics late: wait up to timeout_s (the next poll waits for this one)
        first = None
        if self._prefetch is not None:
            self._prefetch.join()
            self._prefetch, first, self._first = None, self._first, None
        if first is not None:
            text, sent, t, metrics = first
        else:
            # the server reads its counters somewhere between these two clock reads: the rates
            # are over what the brackets allow (live/derive), never the replies' arrival alone
            sent = self.clock()
            text, error = self._scrape(self.timeout_s)
            t = self.clock()
            metrics = self.deriver.update(t, text, error, sent=sent)
        devices = None
        if self.devices is not None:
            try:
                devices = self.devices.sample()
            except Exception as exc:  # the sampler is a gateway; it should not raise, but never take top down
                devices = DevicesFrame(t, False, f"device sampler failed: {exc}", (), ())
        self.seq += 1
        return Frame(
            seq=self.seq,
            t=t,
            url=self.url,
            interval_s=self.interval_s,
            metrics=metrics,
            devices=devices,
            model=self.model.latest if self.model is not None else None,
            raw=text,
            sent=sent,
        )

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.join()
        self._scrape.close()
        if self.model is not None:
            self.model.close()
        if self.devices is not None and hasattr(self.devices, "close"):
            self.devices.close()
