"""The devices side of the live view: every GPU through NVML, and the engine's processes from /proc.

``DeviceSampler.sample()`` returns a frozen ``DevicesFrame``, a record (``to_json`` /
``DevicesFrame.of``: a recording holds its JSON and replays it). NVML is read in the doctor's own
process only, initialised once per sampler (``compat.nvml.NvmlSession``) and shut down in
``close()``. On a host without NVML the frame says why (``nvml_reason``) and the processes' CPU%,
RSS and threads still come.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_doctor.compat.nvml import NvmlSession
from vllm_doctor.facts import wire
from vllm_doctor.procfs import PAGE_SIZE, stat_fields

PidsProvider = Callable[[], list[tuple[int, str]]]  # -> [(pid, role)], e.g. (1234, "engine core")

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# /proc counts CPU time in ticks (10 ms): over a shorter interval than this, one tick more or less
# is more than 4 % of a core (over 2 ms it read 568 % for one process on a 2-core host), so a
# sample that comes sooner reports the last rate measured (none yet: no CPU%) and the next one
# measures from the older baseline
MIN_CPU_INTERVAL_S = 0.25


@dataclass(frozen=True)
class GpuProcess(wire.Record):
    """A compute process NVML sees on a GPU (``used_memory`` None where the driver hides it)."""

    pid: int
    used_memory: int | None
    name: str


@dataclass(frozen=True)
class GpuSample(wire.Record):
    """One GPU at one moment; a reading the driver cannot give is None."""

    index: int
    name: str
    uuid: str
    util_gpu_pct: float | None
    util_mem_pct: float | None
    mem_used: int | None
    mem_total: int | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class ProcSample(wire.Record):
    """One engine process from /proc: CPU% since the previous sample (None on the first), RSS bytes, threads."""

    pid: int
    role: str
    cpu_pct: float | None
    rss: int | None
    threads: int | None


@dataclass(frozen=True)
class DevicesFrame(wire.Record):
    """Everything the devices panel draws at time ``t`` (seconds since the epoch)."""

    t: float
    nvml_available: bool
    nvml_reason: str
    gpus: tuple[GpuSample, ...]
    processes: tuple[ProcSample, ...]


@dataclass(frozen=True)
class _NvmlProcess:
    pid: int = 0
    used_memory: int | None = None  # None where the driver hides it


@dataclass(frozen=True)
class _NvmlReading:
    """One GPU as :meth:`NvmlSession.read_device` reads it (a reading that failed is None)."""

    name: str = ""
    uuid: str = ""
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    processes: list[_NvmlProcess] = field(default_factory=list)


@dataclass(frozen=True)
class _ProcStat:
    start_ticks: int  # tells a reused pid from the process seen before
    cpu_ticks: int  # utime + stime
    rss: int
    threads: int


def read_proc_stat(pid: int, proc: Path = Path("/proc")) -> _ProcStat | None:
    """``/proc/PID/stat`` parsed, or None when the process is gone (or /proc is unreadable)."""
    fields = stat_fields(pid, proc)
    if fields is None:
        return None
    try:  # fields[0] is field 3 (state): utime 14, stime 15, num_threads 20, starttime 22, rss 24
        return _ProcStat(
            start_ticks=int(fields[19]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            rss=int(fields[21]) * PAGE_SIZE,
            threads=int(fields[17]),
        )
    except (IndexError, ValueError):
        return None


def _process_name(pid: int, session: NvmlSession) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:  # another pid namespace (containers) or gone: ask NVML
        name = session.process_name(pid)
        return os.path.basename(name) if name else ""


class DeviceSampler:
    """Samples every GPU (NVML) and the processes ``pids_provider`` names (/proc), one frame per call.

    NVML is initialised once here and shut down by ``close()``; CPU% is the change of a process's
    utime+stime between two samples over the wall time between them. A pid that vanished is
    dropped from the frame.
    """

    def __init__(self, pids_provider: PidsProvider | None = None, *, background: bool = False) -> None:
        self._pids_provider = pids_provider
        self._nvml_session: NvmlSession | None = None
        self._starting: threading.Thread | None = None
        if background:  # NVML starts in a thread, which also finds the engine's processes once
            # (the first sample() waits for it; top's app is still importing meanwhile)
            self._starting = threading.Thread(target=self._start, name="vllm-doctor-nvml-init", daemon=True)
            self._starting.start()
        else:
            self._start()
        # pid -> (when, /proc stat, the CPU% measured then): the baseline of the next rate
        self._previous: dict[int, tuple[float, _ProcStat, float | None]] = {}
        self._names: dict[int, str] = {}

    def _start(self) -> None:
        self._nvml_session = NvmlSession()
        if self._starting is not None and self._pids_provider is not None:
            try:
                self._pids_provider()  # a provider that caches (EnginePids) answers the first sample at once
            except Exception:  # the first sample() asks again and reports what fails
                pass

    @property
    def _nvml(self) -> NvmlSession:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        assert self._nvml_session is not None
        return self._nvml_session

    def sample(self) -> DevicesFrame:
        names, self._names = self._names, {}  # keep names of the pids still on a GPU only (bounded)
        return DevicesFrame(
            t=time.time(),
            nvml_available=self._nvml.available,
            nvml_reason=self._nvml.reason,
            gpus=tuple(self._gpu(i, names) for i in range(self._nvml.device_count)),
            processes=self._processes(),
        )

    def close(self) -> None:
        self._nvml.close()

    def __enter__(self) -> DeviceSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _gpu(self, index: int, names: dict[int, str]) -> GpuSample:
        dev = wire.read(_NvmlReading, self._nvml.read_device(index))
        procs = []
        for p in dev.processes:
            if p.pid not in self._names:
                self._names[p.pid] = names.get(p.pid) or _process_name(p.pid, self._nvml)
            procs.append(GpuProcess(pid=p.pid, used_memory=p.used_memory, name=self._names[p.pid]))
        return GpuSample(
            index=index,
            name=dev.name,
            uuid=dev.uuid,
            util_gpu_pct=dev.util_gpu_pct,
            util_mem_pct=dev.util_mem_pct,
            mem_used=dev.memory_used,
            mem_total=dev.memory_total,
            power_w=dev.power_w,
            power_limit_w=dev.power_limit_w,
            temp_c=dev.temp_c,
            sm_clock_mhz=dev.sm_clock_mhz,
            mem_clock_mhz=dev.mem_clock_mhz,
            processes=tuple(procs),
        )

    def _processes(self) -> tuple[ProcSample, ...]:
        try:
            wanted = list(self._pids_provider()) if self._pids_provider else []
        except Exception:  # the provider's source (a server) may be down: no processes this time
            wanted = []
        now = time.monotonic()
        seen: dict[int, tuple[float, _ProcStat, float | None]] = {}
        out = []
        for pid, role in wanted:
            stat = read_proc_stat(pid)
            if stat is None:
                continue
            cpu_pct = None
            before = self._previous.get(pid)
            if before is not None and before[1].start_ticks == stat.start_ticks:
                if now - before[0] < MIN_CPU_INTERVAL_S:  # too short to say: keep the older baseline
                    seen[pid] = before  # and show the rate measured with it, if any (top at --interval 0.2)
                    out.append(ProcSample(pid=pid, role=role, cpu_pct=before[2], rss=stat.rss, threads=stat.threads))
                    continue
                cpu_pct = 100.0 * (stat.cpu_ticks - before[1].cpu_ticks) / _CLOCK_TICKS / (now - before[0])
            seen[pid] = (now, stat, cpu_pct)
            out.append(ProcSample(pid=pid, role=role, cpu_pct=cpu_pct, rss=stat.rss, threads=stat.threads))
        self._previous = seen
        return tuple(out)
