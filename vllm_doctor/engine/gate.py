"""The worker's doctor gate: a step's bookkeeping and a doctor call never run at once.

The doctor's ``execute_model`` / ``sample_tokens`` wrappers run on the worker's thread, around
vLLM's own methods; a doctor call into the worker (a reader's collect on the private channel's
thread, a ``collective_rpc``) reads and changes the same session. Before, both sides took one
``RLock``. On the step's path that lock was the dearest thing the wrappers did: between two
calls vLLM's own Python pushes the lock's code and data out of the CPU's caches, and a cold
acquire and release cost 3-5 µs, twice a step (``bench/bench_step_path.py --cold``), where the
doctor's whole budget on an 8B decode step is about 45 µs.

So the two sides are not symmetric. The step side (:meth:`StepGate.enter_step`, inlined in the
wrappers) writes :attr:`StepGate.depth` and reads :attr:`StepGate.waiting`: two attribute
accesses, no lock, while no doctor call is in. The call side (:meth:`StepGate.acquire`, or
``with gate:``) takes the lock, which orders the calls among themselves, counts itself in
``waiting``, and then waits for the step in progress, if any, to leave (the step side wakes it:
:attr:`StepGate.left`). A step that begins while a call is in finds ``waiting`` set and takes
the lock itself: it waits for the call to end, and no call starts until it leaves.

Why that excludes both at once: each side writes its own field and then reads the other's (the
step: ``depth`` then ``waiting``; the call: ``waiting`` then ``depth``). CPython runs one
thread's bytecode at a time and an attribute's write is seen by the next read on any thread, so
in any order the two threads' four accesses interleave, at least one side reads the other's
write and backs off (Dekker's argument). Only the worker's thread writes ``depth``, and only a
holder of the lock writes ``waiting``.

Steps nest (a runner's ``execute_model`` may call its own ``sample_tokens``): ``depth`` counts,
and only the outermost step looks at ``waiting``. A call on the worker's own thread in the middle
of a step would wait for itself: none does (the doctor's worker calls run between steps); the
timeout bounds it where one would.
"""

from __future__ import annotations

import threading
import time

GATE_TIMEOUT_S = 60.0  # a step longer than this is a hung engine: the call gives up


class StepGate:
    """The step side is inlined in the wrappers (session.py); :meth:`enter_step` /
    :meth:`leave_step` are the same for code that drives a profiler's steps itself."""

    __slots__ = ("depth", "left", "lock", "waiting")

    def __init__(self) -> None:
        self.depth = 0  # steps in progress on the worker's thread (nested ones counted)
        self.waiting = 0  # doctor calls that hold the lock: in, or waiting for the step to leave
        self.lock = threading.RLock()  # orders the calls; a step takes it while a call is in
        self.left = threading.Event()  # set by a step that leaves while a call waits

    # -- the step side ----------------------------------------------------------------------
    def enter_step(self) -> bool:
        """A step begins; True when it took the lock (a call was in: it waited for it)."""
        d = self.depth
        self.depth = d + 1
        if self.waiting and not d:
            self.depth = d
            self.lock.acquire()
            return True
        return False

    def leave_step(self, locked: bool) -> None:
        """The step that :meth:`enter_step` began (``locked``: what it returned) ends."""
        if locked:
            self.lock.release()
            return
        self.depth -= 1
        if self.waiting:
            self.left.set()

    # -- the call side ----------------------------------------------------------------------
    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """A doctor call comes in: after the calls before it, once no step is in progress.
        False (nothing held) if that took longer than ``timeout`` seconds (-1: no limit)."""
        deadline = None if not blocking or timeout is None or timeout < 0 else time.monotonic() + timeout
        if not (self.lock.acquire(True, timeout) if deadline is not None else self.lock.acquire(blocking)):
            return False
        self.waiting += 1
        left = self.left
        while True:
            left.clear()
            if not self.depth:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if (remaining is not None and remaining <= 0) or not blocking:
                self.release()
                return False
            left.wait(remaining)

    def release(self) -> None:
        self.waiting -= 1
        self.lock.release()

    def __enter__(self) -> StepGate:
        if not self.acquire(timeout=GATE_TIMEOUT_S):
            raise TimeoutError(f"the worker's step did not end within {GATE_TIMEOUT_S:.0f} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
