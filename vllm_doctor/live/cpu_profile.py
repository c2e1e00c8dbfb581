"""``cpu-profile``: py-spy record of a running engine's EngineCore and workers.

Each process gets a speedscope JSON (open it at https://www.speedscope.app) and a flamegraph
SVG, recorded side by side without pausing the engine (py-spy ``--nonblocking``); each file is
written atomically by the gateway. :func:`record_engine` returns the index the CLI writes as
``index.json``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vllm_doctor.compat.pyspy import PySpy, PySpyError, RecordFormat, RecordResult
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.live.proctree import ProcInfo
from vllm_doctor.live.stacks import pyspy_or_input_error, targets

__all__ = ["INDEX_KIND", "profiled_processes", "record_engine", "stem_of"]

INDEX_KIND = "vllm-doctor cpu-profile"
SUFFIXES: dict[RecordFormat, str] = {"speedscope": ".speedscope.json", "flamegraph": ".svg"}
KEYS: dict[RecordFormat, str] = {"speedscope": "speedscope", "flamegraph": "flamegraph"}


def stem_of(info: ProcInfo) -> str:
    """``cpu-worker0-123``, ``cpu-enginecore-122``, ``cpu-apiserver-120``."""
    role = info.role.replace("-", "")
    rank = "" if info.rank is None or info.role != "worker" else str(info.rank)
    return f"cpu-{role}{rank}-{info.pid}"


def profiled_processes(procs: list[ProcInfo], include_api_server: bool) -> list[ProcInfo]:
    """EngineCore and workers (and the API server on request); every process if none is either."""
    roles = {"engine-core", "worker"} | ({"api-server"} if include_api_server else set())
    chosen = [p for p in procs if p.role in roles]
    return chosen or procs


def record_engine(
    out: Path,
    duration: float,
    url: str | None = None,
    pid: int | None = None,
    rate: int = 100,
    native: bool = False,
    idle: bool = False,
    include_api_server: bool = False,
    spy: PySpy | None = None,
) -> dict[str, Any]:
    """Record every chosen process for ``duration`` s into ``out``; the index of what was written.

    Raises DoctorInputError for a bad target, a missing or too old py-spy, or when py-spy may
    read none of the processes.
    """
    if duration <= 0:
        raise DoctorInputError("--duration must be positive")
    spy = spy or pyspy_or_input_error()
    procs = profiled_processes(targets(url, pid), include_api_server)
    jobs = [(p, fmt) for p in procs for fmt in ("speedscope", "flamegraph")]
    started = time.time()

    Outcome = tuple[ProcInfo, RecordFormat, RecordResult | None, PySpyError | None]

    def one(job: tuple[ProcInfo, RecordFormat]) -> Outcome:
        info, fmt = job
        path = out / f"{stem_of(info)}{SUFFIXES[fmt]}"
        try:
            return info, fmt, spy.record(info.pid, path, fmt, duration, rate=rate, native=native, idle=idle), None
        except PySpyError as exc:
            return info, fmt, None, exc

    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        results = list(pool.map(one, jobs))
    entries: dict[int, dict[str, Any]] = {}
    errors: list[PySpyError] = []
    for info, fmt, result, error in results:
        entry = entries.setdefault(
            info.pid,
            {
                "pid": info.pid,
                "role": info.role,
                "rank": info.rank,
                "title": info.title,
                "label": info.label(),
                "speedscope": None,
                "flamegraph": None,
                "error": None,
                "hint": None,
                "samples": None,
                "behind_s": None,
            },
        )
        if result is not None:
            entry[KEYS[fmt]] = result.path.name
            if fmt == "speedscope":  # the stack traces py-spy kept (both recordings sample alike)
                entry["samples"] = result.samples
            entry["behind_s"] = max(entry["behind_s"] or 0.0, result.behind_s)
        if error is not None:
            errors.append(error)
            entry["error"], entry["hint"] = error.message, error.hint or None
    if errors and all(e.kind == "permission" for e in errors) and len(errors) == len(results):
        raise DoctorInputError(errors[0].message, errors[0].hint)
    return {
        "kind": INDEX_KIND,
        "target": url or f"pid {pid}",
        "started_at": started,
        "duration_s": duration,
        "rate_hz": rate,
        "native": native,
        "idle": idle,
        "processes": list(entries.values()),
    }
