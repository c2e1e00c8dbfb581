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

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vllm_doctor.constants import PY_SPY_ENV
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
CAP_SYS_PTRACE = 19
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
ErrorKind = Literal["missing", "too-old", "permission", "gone", "not-python", "timeout", "no-samples", "failed"]
RecordFormat = Literal["speedscope", "flamegraph"]
START_TIMEOUT_S = 60.0  # py-spy attaching to a process (reading its memory maps) before it samples
WRITE_TIMEOUT_S = 60.0  # py-spy writing its file once stopped


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
    if env := os.environ.get(PY_SPY_ENV):
        return env  # the user's explicit choice, checked when run
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _spawn(argv: list[str], stderr: int) -> subprocess.Popen[str]:
    """``argv`` in a new process group (:func:`_kill_group` ends it and anything it started)."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
    )


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run in a new process group; kill the whole group past ``timeout``."""
    proc = _spawn(argv, subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        raise
    except BaseException:  # Ctrl-C: leave no py-spy attached to the engine
        _kill_group(proc)
        proc.wait()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class _NotInTime(Exception):
    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(what)
        self.what, self.seconds = what, seconds


def _record_for(argv: list[str], seconds: float, start_timeout: float, write_timeout: float) -> tuple[str, int]:
    """Run ``py-spy record`` (``argv``, no ``--duration``) in a new process group: from its
    "Sampling process" line (it has attached) for ``seconds`` of wall-clock time, then SIGINT
    (it stops sampling and writes its output). Its output (stdout and stderr) and exit code.
    Raises :class:`_NotInTime` when it does not start sampling within ``start_timeout`` or does
    not finish writing within ``write_timeout`` of being stopped; any exception (Ctrl-C
    included) kills the group: no py-spy is left reading the engine."""
    proc = _spawn(argv, subprocess.STDOUT)
    lines: list[str] = []
    sampling = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Sampling process" in line:
                sampling.set()
        sampling.set()  # it ended: an error before it sampled, or after

    reader = threading.Thread(target=pump, name="py-spy-output", daemon=True)
    reader.start()
    try:
        if not sampling.wait(start_timeout):
            raise _NotInTime("did not start sampling", start_timeout)
        try:
            proc.wait(timeout=seconds)  # it ends by itself only on an error (the process gone, refused)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=write_timeout)
        except subprocess.TimeoutExpired:
            raise _NotInTime("did not finish writing after it was stopped", write_timeout) from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        reader.join(timeout=5)
        raise
    reader.join(timeout=5)
    return "".join(lines), proc.returncode


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
    samples: int | None = None  # the stack traces py-spy kept (its "Samples: N")
    behind_s: float = 0.0  # how far py-spy's sampler fell behind its rate (0: it kept up)


class PySpy:
    """One py-spy binary, checked once. ``PySpy()`` raises PySpyError (missing / too-old)."""

    def __init__(self, binary: str | None = None, version_timeout: float = 20.0) -> None:
        found = binary or find_pyspy()
        if not found:
            raise PySpyError(
                "missing",
                "py-spy is not installed (neither next to this Python nor on PATH)",
                f"`{Path(sys.executable).parent / 'pip'} install py-spy` (or set {PY_SPY_ENV}=/path/to/py-spy)",
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
        start_timeout: float = START_TIMEOUT_S,
        write_timeout: float = WRITE_TIMEOUT_S,
    ) -> RecordResult:
        """``py-spy record`` of ``pid`` for ``duration`` seconds of wall-clock time into ``out``,
        written atomically.

        py-spy's own ``--duration`` counts sampling intervals, not seconds: a sampler that falls
        behind (a busy machine, a process of many threads) records for many times longer (on a
        2-core box, 3 s became over 3 minutes). So py-spy runs without it, and once it says it is
        sampling, it is stopped with SIGINT after ``duration`` s, as Control-C does: it writes
        what it sampled. How far it fell behind (its "behind in sampling" lines) is returned.

        Non-blocking (the engine is never paused), so a speedscope and a flamegraph recording of
        one process may run side by side. Raises PySpyError.
        """
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        argv = [self.binary, "record", "--pid", str(pid), "--format", fmt, "--output", str(tmp)]
        argv += ["--rate", str(rate), "--nonblocking"]
        argv += (["--native"] if native else []) + (["--idle"] if idle else [])
        try:
            try:
                said, code = _record_for(argv, duration, start_timeout, write_timeout)
            except _NotInTime as late:
                raise PySpyError(
                    "timeout",
                    f"py-spy record of process {pid} {late.what} within {late.seconds:g} s",
                    "retry; a machine this busy also slows the engine",
                ) from None
            if "No stack counts found" in said or re.search(r"Samples: 0\b", said):
                raise PySpyError(
                    "no-samples",
                    f"process {pid} ran no Python code in {duration:g} s (idle: no samples)",
                    "profile while the engine serves requests, or add --idle to record waiting threads too",
                )
            if code != 0:
                raise self._error(pid, said)
            os.chmod(tmp, 0o644)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        samples = re.search(r"Samples: (\d+)", said)
        behind = [float(x) for x in re.findall(r"([\d.]+)s behind in sampling", said)]
        return RecordResult(
            pid=pid,
            fmt=fmt,
            path=out,
            samples=int(samples.group(1)) if samples else None,
            behind_s=max(behind, default=0.0),
        )
