"""Attach the doctor to a user's running ``vllm.LLM``.

    llm = LLM(model=..., **vllm_doctor.engine_kwargs(enforce_eager=True))
    with vllm_doctor.attach(llm) as doc:
        llm.generate(prompts, params)
    report = doc.report()          # findings VD4xx/VD5xx/VD208 + report.profiles["engine"]

While attached, each worker runs the forward profiler (per step always, per layer in eager
mode) and, for the first prefill and the first decode step, the forward probe. Leaving the
``with`` block (or :meth:`EngineDoctor.detach`) collects a final snapshot and removes every
hook and wrapper from the workers.

A served engine is attached the same way by URL (``attach("http://127.0.0.1:8000")``) when it
runs with ``VLLM_DOCTOR=1``: the plugin adds the worker extension, and each process that holds
a worker opens the doctor's private channel (a Unix socket only this user can open:
:mod:`vllm_doctor.live.channel`); while attached, the engine's real traffic is profiled. vLLM's
dev endpoint ``/collective_rpc`` is a fallback for a server without the channel that listens on
loopback alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from vllm_doctor.analysis.engine import anatomy, summarize
from vllm_doctor.checks import reads_startup_error, run_checks, select_codes
from vllm_doctor.checks.perf import perf_codes
from vllm_doctor.compat import nvml
from vllm_doctor.compat.http import HttpEngineHandle
from vllm_doctor.compat.llm import EngineHandle, ExtensionMissing, engine_kwargs
from vllm_doctor.constants import DEFAULT_SAMPLE_EVERY
from vllm_doctor.facts import wire
from vllm_doctor.facts.engine import EngineFacts, RpcReply, WorkerFacts
from vllm_doctor.live import channel
from vllm_doctor.live.channel import ChannelHandle
from vllm_doctor.model import Report, Stage
from vllm_doctor.probes import environment

__all__ = ["EngineDoctor", "ExtensionMissing", "attach", "build_engine_report", "engine_kwargs", "served_engine"]


def served_engine(url: str, timeout: float = 60.0) -> ChannelHandle | HttpEngineHandle:
    """A served engine (``vllm serve``) at ``url``, through its private channel (or the dev
    endpoint on a loopback-only server); raises ServerError (an input error) with the fix."""
    return channel.served_engine(url, timeout=timeout)


# the profile first: its window (and the doctor's share of the worker's time in it) ends where the
# gather begins, so a report's own calls after a run (anatomy, placement, memory...: tens of ms
# on an 8B model) are not counted as calls the doctor served between the run's steps; a live
# reader's next window holds them (they were served while the engine ran)
PART_METHODS = {
    "profile": "doctor_collect",
    "anatomy": "doctor_anatomy",
    "placement": "doctor_placement",
    "kv": "doctor_kv",
    "memory": "doctor_memory",
    "perf": "doctor_perf",
    "quant": "doctor_quant",
}


def merge_replies(facts: EngineFacts, part: str, replies: list[dict[str, Any]]) -> None:
    """Put one part's per-worker envelopes into ``facts`` (rank order; errors kept apart)."""
    for i, raw in enumerate(replies):
        reply = wire.read(RpcReply, raw)
        while len(facts.workers) <= i:
            facts.workers.append(WorkerFacts(rank=None))
        worker = facts.workers[i]
        if worker.rank is None:
            worker.rank = reply.rank if "rank" in raw else i
        if reply.ok:
            worker.put(part, reply.data or {})  # read into its record once, here
        else:
            worker.errors[part] = reply.error or {"type": "Unknown", "message": repr(raw)[:300]}


class EngineDoctor:
    """The doctor attached to one engine. Use :func:`attach`."""

    def __init__(
        self,
        engine: Any,
        *,
        layers: bool = True,
        sample_every: int = DEFAULT_SAMPLE_EVERY,
        probe: bool = True,
        probe_phases: Iterable[str] = ("prefill", "decode"),
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
        step_clock: str | None = None,
    ) -> None:
        self.handle: EngineHandle | HttpEngineHandle | ChannelHandle
        if isinstance(engine, (EngineHandle, HttpEngineHandle, ChannelHandle)):
            self.handle = engine
        else:
            self.handle = served_engine(engine) if isinstance(engine, str) else EngineHandle(engine)
        self.layers = layers
        self.sample_every = sample_every
        # which steps carry the device clock on GPU (constants.STEP_CLOCKS); None: the workers'
        # environment's VLLM_DOCTOR_STEP_CLOCK, else "sampled"
        self.step_clock = step_clock
        self.probe = probe
        self.probe_phases = list(probe_phases)
        self.select = set(select)
        self.ignore = set(ignore)
        self.attached = False
        self.install_replies: list[dict[str, Any]] = []
        self.probe_replies: list[dict[str, Any]] = []
        self.detach_replies: list[dict[str, Any]] = []
        self._final: EngineFacts | None = None
        self.timings: dict[str, float] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def attach(self) -> EngineDoctor:
        t = time.perf_counter()
        self.handle.ensure_extension()
        install: dict[str, Any] = {"layers": self.layers, "sample_every": self.sample_every}
        if self.step_clock is not None:
            install["step_clock"] = self.step_clock
        self.install_replies = self.handle.rpc("doctor_install", install)
        if self.probe:
            self.probe_replies = self.handle.rpc("doctor_arm_probe", {"phases": self.probe_phases})
        self.attached = True
        self._final = None
        self.timings["attach_s"] = round(time.perf_counter() - t, 3)
        return self

    def detach(self) -> list[dict[str, Any]]:
        """Take the final snapshot, then remove every hook and wrapper from the workers."""
        if not self.attached:
            return self.detach_replies
        self._final = self.gather()
        self.detach_replies = self.handle.rpc("doctor_detach")
        self.attached = False
        return self.detach_replies

    def __enter__(self) -> EngineDoctor:
        return self.attach() if not self.attached else self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.detach()
        except Exception:
            if exc_type is None:  # never hide the user's own exception behind ours
                raise

    def status(self) -> list[dict[str, Any]]:
        """Each worker's ``doctor_status`` envelope (hooks installed, steps seen so far)."""
        return self.handle.rpc("doctor_status")

    # -- facts and report -----------------------------------------------------------------------
    def gather(
        self,
        reset: bool = False,
        parts: Iterable[str] | None = None,
        previous: EngineFacts | None = None,
        timeline: bool = True,
    ) -> EngineFacts:
        """Ask every worker for every part (a live snapshot, or the final one once detached).

        ``reset``: the workers' step and layer records start again after this snapshot, so the
        next one holds only what ran in between (``top`` gathers windows this way: each reply
        is bounded by one window's steps, not by everything since the attach).

        ``parts`` with ``previous``: ask only for those parts and take everything else (the
        front end, the other parts, NVML) from ``previous``. Each part is one ``collective_rpc``
        that the engine serves between two steps; ``top`` asks for the profile every window
        and for the anatomy, placement, KV cache and memory once a minute.

        ``timeline=False``: the workers leave out the per-layer trace (a report built with
        ``timeline=False`` shows none).
        """
        if not self.attached and self._final is not None:
            return self._final
        t = time.perf_counter()
        wanted = PART_METHODS if parts is None or previous is None else {p: PART_METHODS[p] for p in parts}
        facts = EngineFacts(front_end=self.handle.front_end() if previous is None else previous.front_end)
        for part, method in wanted.items():
            options = None
            if part == "profile" and (reset or not timeline):
                options = {"reset": reset, "timeline": timeline}
            merge_replies(facts, part, self.handle.rpc(method, options))
        if previous is not None:
            for worker, before in zip(facts.workers, previous.workers, strict=False):
                for part in before.parts:
                    if part not in wanted:
                        worker.carry(part, before)
                for part, error in before.errors.items():
                    if part not in wanted:
                        worker.errors[part] = error
        for i, raw in enumerate(self.install_replies):
            reply = wire.read(RpcReply, raw)
            if not reply.ok and i < len(facts.workers):
                facts.workers[i].errors.setdefault("profile", reply.error or {})
        facts.nvml = nvml_for(facts) if previous is None else previous.nvml
        self.timings["gather_s"] = round(time.perf_counter() - t, 3)
        return facts

    def report(self, target: str | None = None) -> Report:
        facts = self.gather()
        return build_engine_report(facts, target or self.handle.model_name(), self.select, self.ignore, self.timings)


def attach(
    engine: Any,
    *,
    layers: bool = True,
    sample_every: int = DEFAULT_SAMPLE_EVERY,
    probe: bool = True,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    step_clock: str | None = None,
) -> EngineDoctor:
    """Attach to ``engine``; use as a context manager.

    ``engine`` is a ``vllm.LLM`` built with the doctor's worker extension, or the URL of a
    served engine (``"http://127.0.0.1:8000"``, started with ``VLLM_DOCTOR=1`` by this user: its
    private channel). Raises :class:`ExtensionMissing` (with the fix) if the engine
    lacks the extension, and :class:`vllm_doctor.compat.http.ServerError` if a URL cannot be
    reached or has no ``/collective_rpc``. ``step_clock``: which steps carry the device clock on a
    GPU, ``"sampled"`` (the sampled steps, the step after each, every 32nd and a window's first) or
    ``"every"``; None: the workers' ``VLLM_DOCTOR_STEP_CLOCK``, else ``"sampled"``.
    """
    return EngineDoctor(
        engine,
        layers=layers,
        sample_every=sample_every,
        probe=probe,
        select=select,
        ignore=ignore,
        step_clock=step_clock,
    ).attach()


def nvml_for(facts: EngineFacts) -> dict[str, Any]:
    identities = [w.anatomy.identity for w in facts.workers if w.anatomy is not None]
    if not any((who.device or "").startswith("cuda") for who in identities):
        return {"available": False, "reason": "no worker runs on an NVIDIA GPU"}
    pids = sorted({who.pid for who in identities if who.pid is not None})
    return nvml.snapshot(pids=None) | {"worker_pids": pids}


def build_engine_report(
    facts: EngineFacts,
    target: str,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    timings: dict[str, float] | None = None,
    timeline: bool = True,
) -> Report:
    """Run the engine-stage checks on ``facts``; add anatomy and profiles (without the per-step
    records and the KV usage series when ``timeline`` is False: top's model panel)."""
    report = Report(target=target)
    codes = select_codes((Stage.ENGINE,), select, ignore)
    # an engine that failed outside eager mode was re-run eagerly: the model's own checks read that
    # run (a misplaced buffer is misplaced in every mode); VD500 reads both
    checked = facts.diagnosis if (not facts.started or facts.runtime_error) and facts.diagnosis else facts
    # the checks that read vLLM's start-up error itself read this engine's facts; the others its workers'
    findings = run_checks(facts, [c for c in codes if reads_startup_error(c)])
    findings += run_checks(checked, [c for c in codes if not reads_startup_error(c)])
    # the performance lint on the worker's real model (its static run reads the meta-device build)
    if checked.perf is not None:
        findings += run_checks(checked, perf_codes(select, ignore))
        report.facts["perf"] = checked.perf
    report.findings = sorted(findings, key=lambda f: (f.code, f.subject))
    report.environment = environment.collect()
    # the report holds the records; Report.to_dict writes them (report.json, a recording)
    report.facts["engine"] = anatomy(facts)
    report.facts["engine_mode"] = facts.mode if facts.mode.known else None
    if facts.mode.known:  # a served engine that was attached to does not say how it runs
        report.facts["engine_mode_text"] = facts.mode_text()
    failure = facts.failure_text()
    if failure:
        report.facts["engine_failure"] = failure
    if checked is not facts:
        report.facts["engine_diagnosis"] = anatomy(checked)
    report.profiles["engine"] = summarize(facts, timeline=timeline)
    report.timings.update(timings or {})
    return report
