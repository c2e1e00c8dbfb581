"""Linux ``/proc`` (standard library only): the one parser of ``/proc/PID/stat``.

Used by the child helper's memory watchdog, the process tree and the device sampler.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def stat_fields(pid: int | str, proc: Path = PROC) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name: ``[0]`` is field 3 (state),
    ``[1]`` ppid, ``[2]`` pgrp, ``[3]`` session, ``[11]``/``[12]`` utime/stime, ``[17]`` threads,
    ``[19]`` starttime, ``[21]`` rss in pages. The command name may hold spaces and parentheses,
    so the fields start after the last ``)``. None when the process is gone or unreadable."""
    try:
        raw = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def started_at(pid: int | str, proc: Path = PROC) -> float | None:
    """When process ``pid`` started, on the wall clock (``/proc/stat``'s boot time plus the
    process's start in clock ticks; about 1/100 s); None when the process is gone."""
    fields = stat_fields(pid, proc)
    if fields is None or len(fields) < 20:
        return None
    try:
        boot = next(
            float(line.split()[1])
            for line in (proc / "stat").read_text(encoding="ascii", errors="replace").splitlines()
            if line.startswith("btime ")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None
