"""``stacks``: dump every process of a running vLLM engine with py-spy and say what each one does.

    report = stacks.collect(url="http://127.0.0.1:8000")          # 2 samples, 1 s apart
    print(report.verdict.text)                                    # "idle: the engine waits ..."
    for report in stacks.watch(pid=1234, every=5.0, rounds=3): ...

Needs no cooperation from the engine (no plugin, no endpoint): a hung engine can be diagnosed
without the doctor having been attached before. The TUI shows ``collect(...).to_dict()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.analysis.stacks import Judged, ProcessState, Verdict, summarize_process, verdict
from vllm_doctor.compat.pyspy import PySpy, PySpyError
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts.stacks import ProcessDump
from vllm_doctor.live.proctree import ProcInfo, discover

__all__ = ["ProcessStacks", "StacksReport", "collect", "pyspy_or_input_error", "targets", "watch"]

# the multiprocessing resource tracker is no part of the engine's work
SKIP_CMDLINES = ("multiprocessing.resource_tracker",)
FATAL = ("missing", "too-old")


def pyspy_or_input_error() -> PySpy:
    """The py-spy gateway, or the input error (exit 2) that says how to get a usable py-spy."""
    try:
        return PySpy()
    except PySpyError as exc:
        raise DoctorInputError(exc.message, exc.hint) from None


def targets(url: str | None = None, pid: int | None = None) -> list[ProcInfo]:
    """The engine's processes worth dumping (the discovered tree minus the resource tracker)."""
    return [p for p in discover(url=url, pid=pid) if not any(s in p.cmdline for s in SKIP_CMDLINES)]


@dataclass
class ProcessStacks:
    info: ProcInfo
    samples: list[ProcessDump]
    state: ProcessState
    still: bool | None  # the main thread's stack did not move over the samples

    def to_dict(self, stacks: bool = True) -> dict[str, Any]:
        last = self.samples[-1]
        out: dict[str, Any] = {
            "pid": self.info.pid,
            "ppid": self.info.ppid,
            "role": self.info.role,
            "rank": self.info.rank,
            "title": self.info.title,
            "label": self.info.label(),
            **self.state.to_dict(),
            "did_not_move": self.still,
            "error": last.error,
            "hint": last.hint,
        }
        if stacks:
            out["threads"] = [
                {
                    "name": t.name,
                    "os_thread_id": t.os_thread_id,
                    "active": t.active,
                    "frames": [{"name": f.name, "file": f.short, "line": f.line} for f in t.frames],
                }
                for t in last.threads
            ]
        return out


@dataclass
class StacksReport:
    target: str
    samples: int
    seconds: float  # between the first and the last sample
    processes: list[ProcessStacks]
    verdict: Verdict
    round: int = 1
    taken_at: float = field(default_factory=time.time)

    def to_dict(self, stacks: bool = True) -> dict[str, Any]:
        return {
            "target": self.target,
            "round": self.round,
            "taken_at": self.taken_at,
            "samples": self.samples,
            "seconds": round(self.seconds, 3),
            "verdict": self.verdict.to_dict(),
            "processes": [p.to_dict(stacks) for p in self.processes],
        }


Take = dict[int, tuple[ProcInfo, ProcessDump]]


def _take(spy: PySpy, url: str | None, pid: int | None, native: bool, timeout: float) -> Take:
    taken: Take = {}
    for info in targets(url, pid):
        try:
            dump = spy.dump(info.pid, native=native, timeout=timeout)
        except PySpyError as exc:
            dump = ProcessDump(pid=info.pid, error=exc.message, hint=exc.hint or None)
            if exc.kind in FATAL:
                raise DoctorInputError(exc.message, exc.hint) from None
        taken[info.pid] = (info, dump)
    if taken and all(d.error for _, d in taken.values()):
        first = next(iter(taken.values()))[1]
        raise DoctorInputError(first.error or "py-spy read no process", first.hint or "")
    return taken


def _report(target: str, takes: list[Take], seconds: float, round_no: int = 1) -> StacksReport:
    last = takes[-1]
    processes = []
    for pid, (info, _) in last.items():
        samples = [take[pid][1] for take in takes if pid in take]
        state, still = summarize_process(samples, info.role)
        processes.append(ProcessStacks(info, samples, state, still))
    judged = [Judged(p.info.pid, p.info.label(), p.info.role, p.state, p.still) for p in processes]
    return StacksReport(target, len(takes), seconds, processes, verdict(judged, seconds), round_no)


def collect(
    url: str | None = None,
    pid: int | None = None,
    samples: int = 2,
    interval: float = 1.0,
    native: bool = False,
    timeout: float = 30.0,
    spy: PySpy | None = None,
) -> StacksReport:
    """Dump the engine's processes ``samples`` times, ``interval`` s apart, and judge them.

    Raises DoctorInputError (exit 2) for a bad target, a missing or too old py-spy, or when
    py-spy may read none of the processes (the message names the exact fix).
    """
    if samples < 1:
        raise DoctorInputError("--samples must be at least 1")
    spy = spy or pyspy_or_input_error()
    takes = []
    start = time.monotonic()
    for i in range(samples):
        if i:
            time.sleep(interval)
        takes.append(_take(spy, url, pid, native, timeout))
    return _report(url or f"pid {pid}", takes, time.monotonic() - start if samples > 1 else 0.0)


def watch(
    url: str | None = None,
    pid: int | None = None,
    every: float = 5.0,
    rounds: int | None = None,
    native: bool = False,
    timeout: float = 30.0,
    spy: PySpy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[StacksReport]:
    """One report per round, each judged on this round's dump against the last round's."""
    spy = spy or pyspy_or_input_error()
    previous: Take | None = None
    since = time.monotonic()
    round_no = 0
    while rounds is None or round_no < rounds:
        if round_no:
            sleep(every)
        round_no += 1
        current = _take(spy, url, pid, native, timeout)
        now = time.monotonic()
        takes = [previous, current] if previous is not None else [current]
        yield _report(url or f"pid {pid}", takes, now - since if previous is not None else 0.0, round_no)
        previous, since = current, now
