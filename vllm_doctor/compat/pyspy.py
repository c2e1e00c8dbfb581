"""The ONE gateway to py-spy: ``dump`` (stacks now) and ``record`` (a CPU profile).

The binary is the ``py-spy`` wheel's, next to ``sys.executable`` (the venv's ``bin/``), else the
one on ``PATH``, else ``$VLLM_DOCTOR_PY_SPY``. The doctor never calls sudo. Every call runs
in its own process group under a time limit; past it the group is killed. A failure of the
doctor's own access becomes :class:`PySpyError` with the exact fix:

- ``missing``: no py-spy (``pip install py-spy``); ``too-old``: older than MIN_VERSION;
- ``permission``: ptrace refused, told apart as another user's process, Yama's
  ``kernel.yama.ptrace_scope``, or a container without ``CAP_SYS_PTRACE``;
- ``gone`` / ``not-python`` / ``timeout`` / ``no-samples`` / ``failed``: the process ended, is
  no Python process, py-spy did not answer in time, an idle process gave no samples, anything
  else (py-spy's own line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vllm_doctor.facts.stacks import ProcessDump, threads_from_pyspy

__all__ = [
    "MIN_VERSION",
    "PySpy",
    "PySpyError",
    "RecordResult",
    "diagnose_permission",
    "find_pyspy",
    "parse_version",
]

MIN_VERSION = (0, 4, 0)  # Python 3.12/3.13 targets; dump --json and record -f speedscope
ENV_BINARY = "VLLM_DOCTOR_PY_SPY"
CAP_SYS_PTRACE = 19
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
ErrorKind = Literal["missing", "too-old", "permission", "gone", "not-python", "timeout", "no-samples", "failed"]
RecordFormat = Literal["speedscope", "flamegraph"]


class PySpyError(Exception):
    """py-spy could not do what was asked; ``message`` says what, ``hint`` how to fix it."""

    def __init__(self, kind: ErrorKind, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"py-spy 0.4.3"`` -> ``(0, 4, 3)``."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in match.groups()) if match else None


def find_pyspy() -> str | None:
    """The py-spy binary: next to this Python (the wheel's), on PATH, or $VLLM_DOCTOR_PY_SPY."""
    if env := os.environ.get(ENV_BINARY):
        return env  # the user's explicit choice, checked when run
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run in a new process group; kill the whole group past ``timeout``."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    except BaseException:  # Ctrl-C: leave no py-spy attached to the engine
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _capabilities() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def _uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])  # the effective uid
    except (OSError, ValueError, IndexError):
        pass
    return None


def _in_container() -> bool:
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod"))


def diagnose_permission(pid: int) -> tuple[str, str]:
    """Why ptrace of ``pid`` is refused here, and the exact fix (message, hint)."""
    has_ptrace = bool(_capabilities() >> CAP_SYS_PTRACE & 1)
    me, owner = os.geteuid(), _uid_of(pid)
    if owner is not None and owner != me and not has_ptrace:
        return (
            f"py-spy may not read process {pid}: it belongs to uid {owner} and vllm-doctor runs as uid {me}",
            f"run vllm-doctor as the engine's user (uid {owner}): `sudo -u '#{owner}' vllm-doctor ...`, or as root",
        )
    try:
        scope = int(PTRACE_SCOPE.read_text().strip())
    except (OSError, ValueError):
        scope = 0
    if scope > 0 and not has_ptrace:
        fix = (
            "ptrace_scope 3 cannot be lowered until a reboot: run vllm-doctor as root"
            if scope == 3
            else "allow it until the next reboot: `sudo sysctl -w kernel.yama.ptrace_scope=0` "
            "(or run vllm-doctor as root)"
        )
        return (f"py-spy may not read process {pid}: kernel.yama.ptrace_scope is {scope} ({PTRACE_SCOPE})", fix)
    if not has_ptrace and _in_container():
        return (
            f"py-spy may not read process {pid}: this container lacks the SYS_PTRACE capability",
            "start the container with `docker run --cap-add SYS_PTRACE ...` "
            "(Kubernetes: securityContext.capabilities.add: [SYS_PTRACE])",
        )
    return (
        f"py-spy may not read process {pid}: permission denied",
        "run vllm-doctor as the engine's user or as root",
    )


def _first_error_line(stderr: str) -> str:
    for line in stderr.splitlines():
        line = line.strip()
        if line and not line.startswith(("Stack backtrace", "0:", "1:")):
            return line[:300]
    return "no output"


@dataclass(frozen=True)
class RecordResult:
    pid: int
    fmt: RecordFormat
    path: Path


class PySpy:
    """One py-spy binary, checked once. ``PySpy()`` raises PySpyError (missing / too-old)."""

    def __init__(self, binary: str | None = None, version_timeout: float = 20.0) -> None:
        found = binary or find_pyspy()
        if not found:
            raise PySpyError(
                "missing",
                "py-spy is not installed (neither next to this Python nor on PATH)",
                f"`{Path(sys.executable).parent / 'pip'} install py-spy` (or set {ENV_BINARY}=/path/to/py-spy)",
            )
        try:
            proc = _run([found, "--version"], version_timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PySpyError(
                "missing",
                f"py-spy at {found} cannot run: {exc}",
                "reinstall it: `pip install --force-reinstall py-spy`",
            ) from None
        version = parse_version(proc.stdout)
        if proc.returncode != 0 or version is None:
            raise PySpyError("missing", f"{found} is not py-spy: {_first_error_line(proc.stdout + proc.stderr)}")
        if version < MIN_VERSION:
            need = ".".join(map(str, MIN_VERSION))
            raise PySpyError(
                "too-old",
                f"py-spy {'.'.join(map(str, version))} at {found} is too old (vllm-doctor needs {need} or newer)",
                f"`pip install -U 'py-spy>={need}'`",
            )
        self.binary = found
        self.version = version

    def _error(self, pid: int, stderr: str) -> PySpyError:
        text = stderr.lower()
        if "permission denied" in text or "operation not permitted" in text:
            return PySpyError("permission", *diagnose_permission(pid))
        if not Path(f"/proc/{pid}").exists() or "no such process" in text or "no such file" in text:
            return PySpyError("gone", f"process {pid} is gone", "it ended while being read; run again")
        if "failed to find python version" in text or "failed to get python version" in text:
            return PySpyError("not-python", f"process {pid} is not a Python process py-spy can read")
        return PySpyError("failed", f"py-spy failed on process {pid}: {_first_error_line(stderr)}")

    def dump(self, pid: int, native: bool = False, timeout: float = 30.0) -> ProcessDump:
        """Every thread's stack now (``py-spy dump --json``); raises PySpyError."""
        argv = [self.binary, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
        try:
            proc = _run(argv, timeout)
        except subprocess.TimeoutExpired:
            raise PySpyError(
                "timeout",
                f"py-spy dump of process {pid} took longer than {timeout:g} s",
                "retry, or raise --pyspy-timeout",
            ) from None
        if proc.returncode != 0:
            raise self._error(pid, proc.stderr + proc.stdout)
        try:
            threads = threads_from_pyspy(json.loads(proc.stdout))
        except (ValueError, TypeError, KeyError) as exc:
            raise PySpyError("failed", f"py-spy's JSON for process {pid} is unreadable: {exc}") from None
        return ProcessDump(pid=pid, threads=threads, native=native)

    def record(
        self,
        pid: int,
        out: Path,
        fmt: RecordFormat,
        duration: float,
        rate: int = 100,
        native: bool = False,
        idle: bool = False,
    ) -> RecordResult:
        """``py-spy record`` of ``pid`` for ``duration`` s into ``out``, written atomically.

        Non-blocking (the engine is never paused), so a speedscope and a flamegraph recording of
        one process may run side by side. Raises PySpyError.
        """
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        seconds = max(1, round(duration))
        argv = [self.binary, "record", "--pid", str(pid), "--format", fmt, "--output", str(tmp)]
        argv += ["--duration", str(seconds), "--rate", str(rate), "--nonblocking"]
        argv += (["--native"] if native else []) + (["--idle"] if idle else [])
        try:
            try:
                proc = _run(argv, seconds + 60.0)
            except subprocess.TimeoutExpired:
                raise PySpyError("timeout", f"py-spy record of process {pid} did not finish in time") from None
            said = proc.stdout + proc.stderr
            if "No stack counts found" in said or re.search(r"Samples: 0\b", said):
                raise PySpyError(
                    "no-samples",
                    f"process {pid} ran no Python code in {seconds} s (idle: no samples)",
                    "profile while the engine serves requests, or add --idle to record waiting threads too",
                )
            if proc.returncode != 0:
                raise self._error(pid, said)
            os.chmod(tmp, 0o644)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return RecordResult(pid=pid, fmt=fmt, path=out)
