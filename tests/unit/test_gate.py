"""The worker's doctor gate (engine/gate.py): a step's bookkeeping and a doctor call never run at
once, with real threads, the real wrappers and the real profiler (vLLM's methods are functions
that wait on an event)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.gate import StepGate
from vllm_doctor.engine.profiler import ForwardProfiler
from vllm_doctor.engine.session import WorkerSession, worker_lock

WAIT = 10.0  # what a thread that must finish gets (never reached unless the gate is broken)
STILL = 0.2  # how long a thread that must wait is watched still waiting


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


class Caller:
    """A doctor call on a thread of its own: it comes in (:meth:`StepGate.acquire`), says so,
    and releases the gate once told to (a lock is released by the thread that took it)."""

    def __init__(self, gate: StepGate, timeout: float = WAIT) -> None:
        self.gate, self.got, self.go = gate, [], threading.Event()
        self.thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self.thread.start()

    def _run(self, timeout: float) -> None:
        got = self.gate.acquire(timeout=timeout)
        self.got.append(got)
        if got:
            self.go.wait(WAIT)
            self.gate.release()

    def is_in(self, wait: float = WAIT) -> bool:
        for _ in range(int(wait / 0.01)):
            if self.got:
                return self.got == [True]
            self.thread.join(0.01)
        return False

    def leave(self) -> None:
        self.go.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


class Stepper:
    """Steps on a thread of their own (the worker's): enters when told, leaves when told."""

    def __init__(self, gate: StepGate) -> None:
        self.gate, self.locked, self.go = gate, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        locked = self.gate.enter_step()
        self.locked.append(locked)
        self.go.wait(WAIT)
        self.gate.leave_step(locked)

    def leave(self) -> None:
        self.go.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def test_a_call_waits_for_the_step_in_progress_and_gets_in_when_it_leaves() -> None:
    gate = StepGate()
    assert gate.enter_step() is False  # no call in: the step side takes no lock
    caller = Caller(gate)
    assert not caller.is_in(STILL) and gate.waiting == 1
    gate.leave_step(False)
    assert caller.is_in() and gate.depth == 0
    caller.leave()
    assert gate.waiting == 0


def test_a_step_that_begins_while_a_call_is_in_waits_for_it() -> None:
    gate = StepGate()
    caller = Caller(gate)
    assert caller.is_in()
    stepper = Stepper(gate)
    stepper.thread.join(STILL)
    assert stepper.locked == []
    caller.leave()
    stepper.thread.join(STILL)
    assert stepper.locked == [True]  # it took the lock: no call starts until it leaves
    second = Caller(gate)
    assert not second.is_in(STILL)
    stepper.leave()
    assert second.is_in()
    second.leave()
    assert gate.depth == 0 and gate.waiting == 0


def test_a_call_gives_up_after_its_timeout_and_leaves_the_gate_as_it_was() -> None:
    gate = StepGate()
    gate.enter_step()
    assert gate.acquire(timeout=0.05) is False
    assert gate.acquire(blocking=False) is False
    assert gate.waiting == 0
    gate.leave_step(False)
    assert gate.enter_step() is False  # the call that gave up left nothing behind for the step
    gate.leave_step(False)
    with gate:
        assert gate.waiting == 1
    assert gate.waiting == 0


def test_a_nested_step_does_not_let_a_call_in_before_the_outer_step_leaves() -> None:
    gate = StepGate()
    outer = gate.enter_step()
    inner = gate.enter_step()
    assert gate.depth == 2 and not outer and not inner
    caller = Caller(gate)
    assert not caller.is_in(STILL)
    gate.leave_step(inner)
    assert not caller.is_in(STILL)
    gate.leave_step(outer)
    assert caller.is_in()
    caller.leave()


def test_calls_reenter_on_their_own_thread() -> None:
    gate = StepGate()
    with gate, gate:
        assert gate.waiting == 2
    assert gate.waiting == 0


@pytest.fixture()
def fast_switching() -> Iterator[None]:
    """Threads switch every microsecond: the step and call sides interleave between any two of
    their bytecodes (CPython's default is every 5 ms)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_steps_and_calls_never_overlap_under_fast_thread_switching(fast_switching: None) -> None:
    gate = StepGate()
    inside: list[str] = []
    overlaps: list[list[str]] = []
    stop = threading.Event()

    def steps() -> None:
        while not stop.is_set():
            locked = gate.enter_step()
            inside.append("step")
            for _ in range(20):  # a stretch of bytecodes the other side may switch into
                if len(inside) > 1:
                    overlaps.append(list(inside))
            inside.remove("step")
            gate.leave_step(locked)

    def calls() -> int:
        n = 0
        for _ in range(300):
            assert gate.acquire(timeout=WAIT)
            inside.append("call")
            for _ in range(20):
                if len(inside) > 1:
                    overlaps.append(list(inside))
            inside.remove("call")
            gate.release()
            n += 1
        return n

    stepper = threading.Thread(target=steps, daemon=True)
    stepper.start()
    caller, done = in_thread(calls)
    caller.join(60)
    stop.set()
    stepper.join(WAIT)
    assert done == [300] and overlaps == []
    assert gate.depth == 0 and gate.waiting == 0


def wrapped_session() -> tuple[WorkerSession, Any, Any]:
    """The real wrappers and profiler (the wall clock) on a worker without vLLM."""
    worker = SimpleNamespace()
    session = WorkerSession(worker)
    prof = ForwardProfiler(WallClock(), [])
    prof.own = session.own_s
    session.profiler = prof
    return session, worker, prof


def scheduler_output() -> Any:
    empty = SimpleNamespace(req_ids=[], num_computed_tokens=[], new_block_ids=[], resumed_req_ids=set())
    new = [SimpleNamespace(req_id="a", prompt_token_ids=[1, 2, 3], block_ids=([1],), num_computed_tokens=0)]
    return SimpleNamespace(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=empty,
        num_scheduled_tokens={"a": 3},
        total_num_scheduled_tokens=3,
        scheduled_spec_decode_tokens={},
        finished_req_ids=set(),
    )


def test_the_wrappers_hold_a_doctor_call_out_of_vllms_step_and_wait_for_one_that_is_in() -> None:
    session, worker, prof = wrapped_session()
    in_vllm, go_on = threading.Event(), threading.Event()

    def vllm_execute(so: Any) -> None:
        in_vllm.set()
        assert go_on.wait(WAIT)

    execute = session._execute_wrapper(vllm_execute)
    sample = session._sample_wrapper(lambda grammar: "output")
    gate = worker_lock(worker)

    # a call that comes while vLLM's execute_model runs waits for the step's bookkeeping to end
    stepper, _ = in_thread(lambda: execute(scheduler_output()))
    assert in_vllm.wait(WAIT)
    caller = Caller(gate)
    assert not caller.is_in(STILL)
    go_on.set()
    stepper.join(WAIT)
    assert caller.is_in() and prof.current is not None  # in between the two wrappers: the step is open
    # the step's sample_tokens, begun while the call is in, waits for it
    sampler, out = in_thread(lambda: sample(None))
    sampler.join(STILL)
    assert sampler.is_alive() and out == [] and prof.current is not None
    caller.leave()
    sampler.join(WAIT)
    assert out == ["output"] and prof.current is None
    assert gate.depth == 0 and gate.waiting == 0 and gate.acquire(blocking=False)
    gate.release()


def test_a_step_that_raises_leaves_the_gate_open() -> None:
    session, worker, _ = wrapped_session()

    def vllm_execute(so: Any) -> None:
        raise RuntimeError("vLLM's own error")

    execute = session._execute_wrapper(vllm_execute)
    with pytest.raises(RuntimeError, match="vLLM's own error"):
        execute(scheduler_output())
    gate = worker_lock(worker)
    assert gate.depth == 0 and gate.acquire(blocking=False)
    gate.release()


def test_the_engines_start_up_runs_are_not_steps() -> None:
    """vLLM's V2 runner runs its memory profile and warm-up through ``execute_model`` with
    ``dummy_run=True`` and a made-up SchedulerOutput: a reader that attached while the engine
    started (the /metrics exporter does) records them as no step, and vLLM's call goes through."""
    session, _, prof = wrapped_session()
    seen: list[Any] = []

    def vllm_execute(so: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return None

    execute = session._execute_wrapper(vllm_execute)
    sample = session._sample_wrapper(lambda grammar: "output")
    assert execute(scheduler_output(), dummy_run=True, is_profile=True) is None
    assert seen == [{"dummy_run": True, "is_profile": True}]
    assert prof.step_index == 0 and prof.current is None and session.own_s["wrappers"] == 0.0
    execute(scheduler_output())
    assert sample(None) == "output"
    assert prof.step_index == 1 and prof.current is None
