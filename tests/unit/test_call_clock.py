"""The calls a reader's thread serves are the doctor's cost on that thread's CPU clock, not its
wall clock (engine/session.py ``call_clock``, engine/channel.py ``_request``).

A reader of the private channel is served on a thread beside the engine's. While that thread
waits for the GIL (the engine's thread runs Python, and gives the GIL up only every switch
interval) the engine goes on: the wait is not the doctor's. On a GPU every CUDA event read lets
the GIL go, and taking it back waits again (on the H100 the served panel's steady reads took
0.25-3.2 ms of the thread's CPU against 1.1-3.4 ms by the wall). Here the profiler's clock waits
at each read with the GIL let go, as a CUDA read waits for the device or for the GIL back (a wait
of its own: a spinning thread in the engine's place left the waits to the OS's scheduling, and
under make test's load the collect once took the GIL back at once); the real channel server,
session and profiler answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.channel_worker import Worker, run_steps
from tests.unit.test_channel_windows import _ask, _connect
from vllm_doctor.engine.channel import ChannelServer
from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.profiler import ForwardProfiler
from vllm_doctor.engine.session import WorkerSession, session_for


class WaitingReads(WallClock):
    """A wall clock whose reads wait with the GIL let go, as a CUDA event's ``elapsed_time`` does
    (and then waits to take the GIL back while the engine's thread runs): a wait of its own here,
    so the test does not depend on how the OS schedules the threads of a loaded machine."""

    def seconds(self, start: Any, end: Any) -> float:
        time.sleep(READ_WAIT_S)
        return super().seconds(start, end)


READ_WAIT_S = 0.002


@pytest.fixture
def sampled_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The install starts a profiler on no modules (the real one needs a model) that samples every
    step on :class:`WaitingReads`."""

    def install(self: WorkerSession, layers: bool = True, trace_steps: int = 0, sample_every: int = 1,
                reader: Any = None, step_clock: str | None = None) -> dict[str, Any]:  # fmt: skip
        if self.profiler is None:
            self.profiler = ForwardProfiler(WaitingReads(), [], sample_every=1)
            self.profiler.own = self.own_s
            self.profiler.calls_s = self.calls_s
        self.open_window(reader, 1, "sampled")
        return {"profiling": True}

    monkeypatch.setattr(WorkerSession, "install", install)


@pytest.fixture
def channel(tmp_path: Path, sampled_install: None) -> Iterator[tuple[Worker, ChannelServer]]:
    """A worker without vLLM, its private channel's real server started on it."""
    worker = Worker()
    server = ChannelServer(worker, base=str(tmp_path))
    server.start()
    yield worker, server
    server.close()


def test_a_readers_call_counts_its_threads_cpu_not_its_waits(channel: tuple[Worker, ChannelServer]) -> None:
    worker, server = channel
    with _connect(server) as conn:
        assert _ask(conn, "doctor_install", {"layers": False})["ok"]
        run_steps(worker, 40, first=True)  # 40 samples: the last ones' marks are read at the collect
        pending = len(session_for(worker).profiler.pending)  # type: ignore[union-attr]
        assert pending >= 4
        t = time.perf_counter()
        first = _ask(conn, "doctor_collect", {"timeline": False, "reset": True})["data"]
        waited = time.perf_counter() - t
        assert first["step_arrays"]["n"] == 40
        # the rest of the request (its reply's encoding and sending) is the doctor's too, added
        # once the reply is sent
        session = session_for(worker)
        deadline = time.monotonic() + 10
        while session.side_s == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert session.side_s > 0
        # a call's time is in the window after it (it ends after its reply's data is made)
        data = _ask(conn, "doctor_collect", {"timeline": False})["data"]
    cpu, wall = data["doctor_rpc_s"], data["doctor_rpc_wall_s"]
    # the collect waited at each of its reads: its wall time is mostly waits, its thread's CPU
    # (the request around it included) a small part of it
    assert pending * READ_WAIT_S <= wall <= waited, (pending, wall, waited)
    assert session.side_s <= cpu < 0.5 * wall, (session.side_s, cpu, wall)


def test_a_call_on_the_engines_own_thread_counts_its_wall_time() -> None:
    """vLLM's collective_rpc runs the call on the engine's thread: the steps wait for all of it."""
    worker = Worker()
    session = session_for(worker)
    session.profiler = ForwardProfiler(WaitingReads(), [], sample_every=1)
    session.profiler.own = session.own_s
    session.open_window(None, 1, "sampled")
    run_steps(worker, 5, first=True)
    original = session.profiler.snapshot

    def slow_snapshot(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)  # a wait on the engine's thread: the step after it waits as long
        return original(*args, **kwargs)

    session.profiler.snapshot = slow_snapshot  # type: ignore[method-assign]
    worker.doctor_collect({"timeline": False})
    data = worker.doctor_collect({"timeline": False})["data"]  # the first call's time is in this window
    assert data["doctor_rpc_s"] >= 0.05 and data["doctor_rpc_wall_s"] >= 0.05
    assert session.side_s == 0.0
