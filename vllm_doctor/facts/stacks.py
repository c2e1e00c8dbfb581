"""Python stacks of a process, as py-spy dumps them (``py-spy dump --json``), in the doctor's types.

Frames are innermost first, as py-spy lists them. Parsing is pure, so recorded dumps drive the
summariser's tests exactly as live ones do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_doctor.facts import wire

__all__ = ["Frame", "ProcessDump", "ThreadStack", "threads_from_pyspy"]


@dataclass(frozen=True)
class Frame:
    name: str  # "EngineCoreProc.run_busy_loop"
    filename: str  # the full path in the target process
    short: str  # "vllm/v1/engine/core.py": the path from its package root, or the file name
    line: int

    @property
    def where(self) -> str:
        return f"{self.short}:{self.line}"

    @property
    def native(self) -> bool:
        """A C/C++ frame (py-spy --native): a shared object or binary, not a Python source file."""
        return not self.filename.endswith((".py", ".pyw")) and not self.filename.startswith("<")


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int
    os_thread_id: int | None
    name: str | None  # "MainThread"
    active: bool  # on a CPU when sampled (py-spy's heuristic), not waiting
    owns_gil: bool
    frames: tuple[Frame, ...]  # innermost first

    def python_frames(self) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if not f.native)

    def signature(self) -> tuple[tuple[str, str, int], ...]:
        """What must be equal for two samples to count as "did not move" (Python frames: native
        frames of a waiting thread jitter between poll and futex calls)."""
        return tuple((f.name, f.short, f.line) for f in self.python_frames())


@dataclass
class ProcessDump:
    """One process's stacks at one moment, or why there are none."""

    pid: int
    threads: list[ThreadStack] = field(default_factory=list)
    error: str | None = None  # the doctor's one-line reason (py-spy refused, process gone, ...)
    hint: str | None = None  # the fix
    native: bool = False

    def main_thread(self) -> ThreadStack | None:
        """The thread whose OS id is the pid (the main thread), else the one named MainThread."""
        for thread in self.threads:
            if thread.os_thread_id == self.pid:
                return thread
        for thread in self.threads:
            if thread.name == "MainThread":
                return thread
        return self.threads[0] if self.threads else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _PySpyFrame:
    """A frame as ``py-spy dump --json`` writes it."""

    name: str = ""
    filename: str = ""
    short_filename: str = ""
    line: int = 0


@dataclass(frozen=True)
class _PySpyThread:
    """A thread as ``py-spy dump --json`` writes it."""

    thread_id: int = 0
    os_thread_id: int | None = None
    thread_name: str | None = None
    active: bool = False
    owns_gil: bool = False
    frames: list[_PySpyFrame] = field(default_factory=list)


def _frame(raw: _PySpyFrame) -> Frame:
    short = raw.short_filename or raw.filename.rsplit("/", 1)[-1]
    return Frame(name=raw.name or "?", filename=raw.filename, short=short, line=raw.line)


def threads_from_pyspy(data: Any) -> list[ThreadStack]:
    """``py-spy dump --json`` output (a list of threads) -> ThreadStacks; raises ValueError if malformed."""
    if not isinstance(data, list):
        raise ValueError(f"py-spy JSON is not a list of threads: {type(data).__name__}")
    threads = []
    for raw in data:
        if not isinstance(raw, dict) or not isinstance(raw.get("frames"), list):
            raise ValueError("py-spy JSON thread without frames")
        thread = wire.read(_PySpyThread, raw)
        threads.append(
            ThreadStack(
                thread_id=thread.thread_id,
                os_thread_id=thread.os_thread_id,
                name=thread.thread_name,
                active=thread.active,
                owns_gil=thread.owns_gil,
                frames=tuple(_frame(f) for f in thread.frames),
            )
        )
    return threads
