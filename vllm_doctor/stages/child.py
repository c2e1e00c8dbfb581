"""The one way the doctor runs code in a child process (import pass, weights pass, engine stage).

Every child the doctor starts goes through :class:`ChildJob`, so every child gets the same
guarantees:

- **JSON in, JSON out, no pickle.** The request is a JSON file; the child writes one JSON result
  atomically (a reader never sees half a file). The child is
  ``python -c <bootstrap> TASK REQUEST OUT`` where TASK names an entry of :data:`TASKS`: no
  other code can be named from outside.
- **Nothing from the current directory.** The bootstrap drops the current directory from
  ``sys.path`` before importing anything, and ``PYTHONSAFEPATH=1`` does the same for every
  Python process below the child (vLLM starts ``python -m vllm...`` subprocesses), so a
  ``vllm.py`` lying in a downloaded model directory is never imported; ``PYTHONPATH`` still works.
- **Its own process group, a time limit, no orphans.** The child starts a new session; at the
  deadline, when the job ends, when the doctor exits and on SIGTERM/SIGHUP the whole group is
  killed (vLLM's engine core and workers included). On Linux the child also asks the kernel to
  tell it when the doctor dies without cleaning up (``PR_SET_PDEATHSIG``), and then kills its group;
  the doctor's janitor (:mod:`vllm_doctor.stages.tempdirs`) kills it too.
- **Nothing left on disk.** The job's directory (request, result, log) comes from
  :func:`vllm_doctor.stages.tempdirs.make` and goes with the job, at the deadline, on SIGTERM/SIGHUP and,
  through the janitor, when the doctor is SIGKILLed; whatever the child needs on disk goes inside
  it (``$VLLM_DOCTOR_SCRATCH_DIR``).
- **Bounded memory.** A watchdog thread sums the resident memory of the child's whole process
  group (``/proc``) a few times a second and kills the group when it passes the limit
  (:func:`default_memory_limit`: ``VLLM_DOCTOR_MAX_MEMORY`` or 75 % of the machine's memory).
  An address-space rlimit is not used: torch and vLLM reserve far more virtual memory than
  they touch, and die under one.
- **Progress lines.** The child's ``progress(msg)`` prints ``PROGRESS_PREFIX + msg``; the parent
  hands those lines to its callback and keeps everything else in a log file (whose tail goes
  into error messages).

A job starts at once; :meth:`ChildJob.result` waits (idempotent), so two children can run side
by side (the weights pass runs while the import pass runs).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from vllm_doctor.constants import MAX_MEMORY_ENV, PARENT_PID_ENV, SCRATCH_DIR_ENV
from vllm_doctor.facts import wire
from vllm_doctor.files import write_json_atomic
from vllm_doctor.procfs import PAGE_SIZE, PROC, stat_fields
from vllm_doctor.stages import tempdirs
from vllm_doctor.units import fmt_bytes, parse_bytes

PROGRESS_PREFIX = "@@vllm-doctor@@ "
Progress = Callable[[str], None]

# TASK -> "module:function"; the function takes (request, progress) and returns the JSON result
TASKS = {
    "import": "vllm_doctor.probes.import_probe:child_task",
    "weights": "vllm_doctor.stages.weights_trace:child_task",
    "engine": "vllm_doctor.stages.engine:child_task",
    "parity_vllm": "vllm_doctor.stages.parity:vllm_task",
    "parity_hf": "vllm_doctor.stages.parity:hf_task",
    "selftest": "vllm_doctor.stages.child:selftest_task",  # the helper's own tests
}

# environment every child starts with unless the caller set it
CHILD_ENV_DEFAULTS = {
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",  # the doctor never downloads
}
MEMORY_POLL_S = 0.2
RPC_BASE_ENV = "VLLM_RPC_BASE_PATH"  # vLLM's directory for its ZeroMQ ipc:// sockets

# drop the current directory from sys.path before anything is imported, then run the task
_BOOTSTRAP = (
    "import sys\n"
    "if sys.path and sys.path[0] in ('', '.') and not getattr(sys.flags, 'safe_path', False):\n"
    "    del sys.path[0]\n"
    "from vllm_doctor.stages.child import child_main\n"
    "sys.exit(child_main(sys.argv[1:]))\n"
)


@dataclass
class ChildResult:
    ok: bool  # the child wrote a result
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why there is no result: time-out, crash, unreadable output
    timed_out: bool = False
    returncode: int | None = None
    log_tail: str = ""
    log_path: str | None = None
    seconds: float = 0.0


# ---- the parent side -----------------------------------------------------------------------


def parse_limit(text: str) -> int | None:
    """A memory limit: bytes (``8G``, ``512M``, ``1073741824``); ``0``/``none``/``off`` -> None (no limit)."""
    if text.strip().lower() in ("0", "none", "off", "unlimited"):
        return None
    value = parse_bytes(text)
    return value if value > 0 else None


def machine_memory() -> int | None:
    """MemTotal of /proc/meminfo in bytes (None off Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_memory_limit() -> int | None:
    """``VLLM_DOCTOR_MAX_MEMORY`` if set (a bad value is ignored: the CLI checks its own flag),
    else three quarters of the machine's memory; None where neither is known."""
    env = os.environ.get(MAX_MEMORY_ENV)
    if env:
        try:
            return parse_limit(env)
        except ValueError:
            pass
    total = machine_memory()
    return int(total * 0.75) if total else None


def group_rss(pgid: int) -> int:
    """Resident bytes of every process whose process group or session is ``pgid`` (Linux /proc)."""
    total = 0
    try:
        entries = os.listdir(PROC)
    except OSError:
        return 0
    for name in entries:
        fields = stat_fields(name) if name.isdigit() else None
        try:
            if fields and (int(fields[2]) == pgid or int(fields[3]) == pgid):
                total += int(fields[21]) * PAGE_SIZE
        except (IndexError, ValueError):
            continue
    return total


_live: weakref.WeakSet[ChildJob] = weakref.WeakSet()
_handlers_installed = False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group (also once the child itself has exited)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    tempdirs.forget_group(proc.pid)
    if proc.poll() is None:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def kill_all() -> None:
    """Kill every child the doctor still has (exit handler, signal handler, tests)."""
    for job in list(_live):
        job.kill()


def _install_handlers() -> None:
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(kill_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_signal)


def _on_signal(signum: int, _frame: Any) -> None:
    kill_all()
    tempdirs.remove_all()  # the re-raised signal ends the process without atexit
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class ChildJob:
    """A running child; ``result()`` waits for it (at most until the deadline) and is idempotent."""

    def __init__(
        self,
        task: str,
        request: dict[str, Any],
        *,
        timeout: float,
        what: str,
        progress: Progress | None = None,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        memory_limit: int | str | None = "default",
    ) -> None:
        """``memory_limit``: bytes for the whole process group, None for none, "default" for
        :func:`default_memory_limit`."""
        if task not in TASKS:
            raise ValueError(f"unknown child task {task!r}")
        self.what = what  # "the import pass", for messages
        self.timeout = timeout
        self.start = time.monotonic()
        # first, before _install_handlers: tempdirs' exit handler must run after kill_all (LIFO)
        self._tmp = tempdirs.make(f"vllm-doctor-{task}-")
        self._out = Path(self._tmp) / "result.json"
        request_path = Path(self._tmp) / "request.json"
        request_path.write_text(json.dumps(request), encoding="utf-8")
        self.log_path = Path(log_path) if log_path is not None else Path(self._tmp) / "child.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        child_env = dict(os.environ if env is None else env)
        for key, value in CHILD_ENV_DEFAULTS.items():
            child_env.setdefault(key, value)
        # every Python process below the child (vLLM's own `python -m vllm...` inspection
        # subprocess too) leaves the current directory off sys.path: a `vllm.py` lying in a
        # downloaded model directory is never imported (Python >= 3.11)
        child_env["PYTHONSAFEPATH"] = "1"
        child_env[SCRATCH_DIR_ENV] = self._tmp  # what the child writes goes with the job's directory
        # vLLM's ZeroMQ sockets too (one per engine channel, in the temp directory by default): an
        # engine killed at its deadline left them in /tmp for good; a socket's path has 107 bytes
        if RPC_BASE_ENV not in child_env and len(self._tmp) + len("/") + 36 <= 107:  # + a uuid4
            child_env[RPC_BASE_ENV] = self._tmp
        if threading.current_thread() is threading.main_thread():
            # the kernel's parent-death signal follows the spawning thread: only from the main one
            child_env[PARENT_PID_ENV] = str(os.getpid())
        else:
            child_env.pop(PARENT_PID_ENV, None)
        _install_handlers()
        self._log: IO[bytes] = open(self.log_path, "wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, task, str(request_path), str(self._out)],
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        tempdirs.watch_group(self._proc.pid)
        self._progress = progress
        self._reader = threading.Thread(target=self._read, name=f"vllm-doctor-{task}-log", daemon=True)
        self._reader.start()
        self._result: ChildResult | None = None
        self._killed = False
        self.memory_limit = default_memory_limit() if memory_limit == "default" else memory_limit
        self.memory_peak = 0
        self._over_memory = False
        if isinstance(self.memory_limit, int) and os.path.isdir("/proc"):
            threading.Thread(target=self._watch_memory, name=f"vllm-doctor-{task}-memory", daemon=True).start()
        _live.add(self)
        self._finalizer = weakref.finalize(self, _cleanup, self._proc, self._tmp)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        prefix = PROGRESS_PREFIX.encode()
        for line in self._proc.stdout:
            try:
                self._log.write(line)
                self._log.flush()
            except (OSError, ValueError):
                pass
            if line.startswith(prefix) and self._progress is not None:
                try:
                    self._progress(line[len(prefix) :].decode("utf-8", "replace").rstrip())
                except Exception:
                    pass

    def _watch_memory(self) -> None:
        limit = self.memory_limit
        assert isinstance(limit, int)
        while self._proc.poll() is None:
            rss = group_rss(self._proc.pid)
            self.memory_peak = max(self.memory_peak, rss)
            if rss > limit:
                self._over_memory = True
                _kill_group(self._proc)
                return
            time.sleep(MEMORY_POLL_S)

    def done(self) -> bool:
        return self._result is not None or self._proc.poll() is not None

    def kill(self) -> None:
        self._killed = True
        _kill_group(self._proc)

    def result(self) -> ChildResult:
        if self._result is not None:
            return self._result
        remaining = max(0.0, self.timeout - (time.monotonic() - self.start))
        timed_out = False
        try:
            self._proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
        except KeyboardInterrupt:
            self.kill()
            raise
        _kill_group(self._proc)  # the time-out, or what the child left running
        self._reader.join(timeout=10)
        try:
            self._log.close()
        except OSError:
            pass
        res = ChildResult(
            ok=False,
            timed_out=timed_out,
            returncode=self._proc.returncode,
            log_path=str(self.log_path),
            seconds=time.monotonic() - self.start,
        )
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4000))
                res.log_tail = fh.read().decode("utf-8", "replace")
        except OSError:
            pass
        if self._over_memory:
            res.error = (
                f"{self.what} was stopped: its processes held {fmt_bytes(self.memory_peak)} of memory, over the "
                f"limit of {fmt_bytes(self.memory_limit)} (--max-memory, or {MAX_MEMORY_ENV})"
            )
        elif timed_out:
            res.error = f"{self.what} did not finish within {self.timeout:.0f} s"
        elif self._out.is_file():
            try:
                res.data = json.loads(self._out.read_text(encoding="utf-8"))
                res.ok = True
            except (OSError, ValueError) as exc:
                res.error = f"unreadable output of {self.what}: {exc}"
        elif self._killed:
            res.error = f"{self.what} was stopped"
        else:
            res.error = f"{self.what} {exit_text(self._proc.returncode)} and wrote no result"
        if res.ok and isinstance(res.data.get(INTERNAL_ERROR), dict):
            err = wire.read(InternalError, res.data[INTERNAL_ERROR])
            res.ok = False
            res.error = f"{self.what} failed inside vllm-doctor: {err.type}: {err.message}"
            res.log_tail = (res.log_tail + "\n" + err.traceback)[-4000:]
        self._result = res
        _live.discard(self)
        self._finalizer()
        return res


def _cleanup(proc: subprocess.Popen[bytes], tmp: str) -> None:
    _kill_group(proc)
    tempdirs.remove(tmp)


def exit_text(returncode: int | None) -> str:
    """How a process ended, for a sentence: "exited with code 3", or the signal that killed it
    ("was killed by SIGILL (illegal instruction)": a native crash in the model's or vLLM's kernels,
    SIGKILL from the kernel's out-of-memory killer), which a negative exit code only hints at."""
    if returncode is None or returncode >= 0:
        return f"exited with code {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"was killed by signal {number}"
    what = signal.strsignal(number) or ""
    return f"was killed by {name}" + (f" ({what[0].lower() + what[1:]})" if what else "")


def run_child(task: str, request: dict[str, Any], *, timeout: float, what: str, **kwargs: Any) -> ChildResult:
    """Start a child and wait for it."""
    return ChildJob(task, request, timeout=timeout, what=what, **kwargs).result()


# ---- the child side ------------------------------------------------------------------------

INTERNAL_ERROR = "vllm_doctor_internal_error"


@dataclass(frozen=True)
class InternalError:
    """A child's answer when the doctor's own code failed in it (its ``INTERNAL_ERROR`` entry)."""

    type: str | None = None  # the exception's class
    message: str | None = None
    traceback: str = ""


def progress(msg: str) -> None:
    """A progress line for the parent's callback (child side)."""
    print(PROGRESS_PREFIX + msg, flush=True)


def _die_with_parent() -> None:
    """Linux: when the doctor dies, even by SIGKILL, the kernel sends this child SIGTERM, and the
    child takes its whole process group down (best effort: vLLM may install its own handler)."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if not parent or not sys.platform.startswith("linux"):
        return

    def take_group_down(_signum: int, _frame: Any) -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(signal.SIGTERM, take_group_down)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except Exception:
        return
    if str(os.getppid()) != parent:  # the doctor died before prctl took effect
        take_group_down(signal.SIGTERM, None)


def child_main(argv: list[str]) -> int:
    """``python -c <bootstrap> TASK REQUEST OUT``: run the task, write its JSON result, exit."""
    _die_with_parent()
    task, request_path, out_path = argv
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    module_name, _, func_name = TASKS[task].partition(":")
    try:
        import importlib

        func = getattr(importlib.import_module(module_name), func_name)
        result = func(request, progress)
    except BaseException as exc:  # the doctor's own failure: still one JSON answer
        import traceback

        result = {
            INTERNAL_ERROR: {
                "type": type(exc).__name__,
                "message": str(exc)[:2000],
                "traceback": traceback.format_exc()[-6000:],
            }
        }
    write_json_atomic(out_path, result, exact_strings=True)  # the parent reads the same strings back
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's distributed teardown and atexit hooks can take seconds; the answer is written and
    # the parent kills whatever this process leaves behind
    os._exit(0)


@dataclass(frozen=True)
class SelftestRequest:
    """What the helper's tests ask the ``selftest`` task to do."""

    progress: list[str] = field(default_factory=list)  # lines to say through the progress channel
    print_line: str = field(default="", metadata=wire.rules(key="print"))  # printed to stdout
    grandchildren: int = 0  # processes to spawn (each sleeps)
    pid_file: str = ""  # where to write the child's and the grandchildren's pids
    allocate_mib: int = 0  # memory to touch, 1 MiB at a time
    allocate_pause: float = 0.0  # seconds between two MiB
    sleep: float = 0
    raise_message: str = field(default="", metadata=wire.rules(key="raise"))  # fail with this RuntimeError
    die_of: int = 0  # a signal the child sends itself (as a native crash in vLLM's kernels would kill it)
    echo: Any = None  # sent back as it came


def selftest_task(request: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """What the helper's tests run: report sys.path, say progress, spawn, sleep or fail."""
    asked = wire.read(SelftestRequest, request)
    for line in asked.progress:
        progress(line)
    if asked.print_line:
        print(asked.print_line, flush=True)
    pids = []
    for _ in range(asked.grandchildren):
        pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid)
    if asked.pid_file:
        # atomically: a test waits for the file to exist, then reads it
        write_json_atomic(asked.pid_file, {"child": os.getpid(), "grandchildren": pids})
    hog = []
    for _ in range(asked.allocate_mib):  # touch memory 1 MiB at a time
        hog.append(bytearray(2**20))
        time.sleep(asked.allocate_pause)
    time.sleep(asked.sleep)
    if asked.raise_message:
        raise RuntimeError(asked.raise_message)
    if asked.die_of:
        signal.signal(asked.die_of, signal.SIG_DFL)
        os.kill(os.getpid(), asked.die_of)
        time.sleep(60)  # a signal whose default is not to end the process: the test's timeout says so
    return {
        "sys_path": sys.path,
        "cwd": os.getcwd(),
        "echo": asked.echo,
        "scratch": os.environ.get(SCRATCH_DIR_ENV),
        "rpc_base": os.environ.get(RPC_BASE_ENV),
    }
