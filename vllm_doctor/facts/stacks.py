"""Python stacks of a process, as py-spy dumps them (``py-spy dump --json``), in the doctor's types.

Frames are innermost first, as py-spy lists them. Parsing is pure, so recorded dumps drive the
summariser's tests exactly as live ones do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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


def _frame(raw: dict[str, Any]) -> Frame:
    filename = str(raw.get("filename") or "")
    short = str(raw.get("short_filename") or filename.rsplit("/", 1)[-1])
    return Frame(name=str(raw.get("name") or "?"), filename=filename, short=short, line=int(raw.get("line") or 0))


def threads_from_pyspy(data: Any) -> list[ThreadStack]:
    """``py-spy dump --json`` output (a list of threads) -> ThreadStacks; raises ValueError if malformed."""
    if not isinstance(data, list):
        raise ValueError(f"py-spy JSON is not a list of threads: {type(data).__name__}")
    threads = []
    for raw in data:
        if not isinstance(raw, dict) or not isinstance(raw.get("frames"), list):
            raise ValueError("py-spy JSON thread without frames")
        threads.append(
            ThreadStack(
                thread_id=int(raw.get("thread_id") or 0),
                os_thread_id=int(raw["os_thread_id"]) if raw.get("os_thread_id") is not None else None,
                name=raw.get("thread_name"),
                active=bool(raw.get("active")),
                owns_gil=bool(raw.get("owns_gil")),
                frames=tuple(_frame(f) for f in raw["frames"] if isinstance(f, dict)),
            )
        )
    return threads
