"""The short path of a decode step (the session's wrappers open and finish it themselves): the
same records as begin_step's path, step for step.

Most steps of a serving engine are decode steps neither due for a sample nor on the device
clock; the wrapper opens those from a few attribute reads of the SchedulerOutput and leaves the
rest to begin_step. Here the real wrappers run each sequence twice, with the short path and with
it refused, and the two runs' records (counts, which steps were sampled, which were on the device
clock and their times on it) must be equal, while readers open windows and change the cadence in
the middle, as they do on a server.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.unit.test_step_clock import _Events
from tests.unit.test_step_tracker_equivalence import _steps
from vllm_doctor.constants import STEP_COUNT_FIELDS
from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.profiler import ForwardProfiler
from vllm_doctor.engine.session import WorkerSession
from vllm_doctor.facts.steps import StepTable

COMPARED = ("index", *STEP_COUNT_FIELDS, "step_clock", "sampled")


def _run(
    sequence: list[Any], short: bool, events: dict[int, Any], clock: Any = _Events
) -> tuple[list[tuple[Any, ...]], set[int]]:
    """The records of ``sequence`` through the session's wrappers (``events``: step index ->
    what a reader does before it), and the indices of the steps begin_step opened (the others
    took the short path)."""
    session = WorkerSession(SimpleNamespace())
    prof = ForwardProfiler(clock(), [], sample_every=8, own_budget=0.0)
    prof.own = session.own_s
    session.profiler = prof
    prof.hold_short_path(not short)  # (as the session holds it off while a probe waits)
    general: set[int] = set()
    begin_step = prof.begin_step

    def counted(so: Any, *quick: Any) -> Any:
        step = begin_step(so, *quick)
        if step is not None:
            general.add(prof.step_index - 1)
        return step

    prof.begin_step = counted  # type: ignore[method-assign]
    execute = session._execute_wrapper(lambda so: None)
    sample = session._sample_wrapper(lambda grammar: "output")
    for i, so in enumerate(sequence):
        if i in events:
            events[i](prof)
        execute(so)
        sample(None)
    prof.resolve(block=True)
    rows = StepTable.of(prof.snapshot()).rows()
    # the device clock's times: _Events' marks count up, so a step's time is the number of marks
    # between its start and end (the same in both runs only where the same steps took marks; the
    # wall clock's and the host's are this machine's), and which steps have an idle time before them
    return [
        (
            *(r[k] for k in COMPARED),
            r["step_s"] if r["step_clock"] == "cuda_events" else None,
            r["idle_before_s"] is None,
        )
        for r in rows
    ], general


READERS: dict[int, Any] = {
    150: lambda prof: prof.open_window("panel"),  # a reader attaches: each phase's next step on the clock
    230: lambda prof: prof.want_sample_every("panel", 16),  # and asks for its cadence
    420: lambda prof: prof.want_sample_every("attach", 6),  # another reader's, finer
    560: lambda prof: prof.close_window("attach"),  # back to the panel's
    700: lambda prof: prof.want_step_clock("panel", "every"),  # every step on the device clock
    760: lambda prof: prof.want_step_clock("panel", "sampled"),
}


@pytest.mark.parametrize("clock", [_Events, WallClock])  # a GPU's device clock; the CPU build's wall clock
@pytest.mark.parametrize("seed", range(6))
def test_the_short_decode_path_leaves_the_records_begin_step_leaves(seed: int, clock: Any) -> None:
    # long decode stretches (a served engine's: arrivals and finishes now and then, speculative
    # tokens rarely), and the general sequence's churn in between
    sequence = _steps(seed, n_steps=900, finish=0.004, preempt=0.001, arrivals=(0,) * 30 + (1, 3), spec_rate=0.002)
    sequence += _steps(seed + 100, n_steps=100)
    # and a served engine's arrivals: short prompts, each whole in its first step (a third of the
    # steps mixed: the short path's mixed steps)
    sequence += _steps(seed + 200, n_steps=600, finish=0.01, preempt=0.0, arrivals=(0, 0, 1, 2), spec_rate=0.0,
                       chunked=False)  # fmt: skip
    short, general = _run(sequence, True, READERS, clock)
    full, every = _run(sequence, False, READERS, clock)
    assert len(short) == len(full) == len(every) == sum(1 for so in sequence if so.total_num_scheduled_tokens)
    assert short == full
    taken = [r for r in short if r[0] not in general]  # the short path carried its share of the steps
    assert len(taken) > len(short) // 8
    prefill, decode = COMPARED.index("prefill_tokens"), COMPARED.index("decode_tokens")
    assert sum(1 for r in taken if r[prefill] and r[decode]) > 5  # mixed steps among them (arrivals)
    assert sum(r[COMPARED.index("sampled")] for r in short) > 40  # the cadences' samples are there


def test_a_step_due_for_a_sample_or_the_device_clock_never_takes_the_short_path() -> None:
    """On a plain decode run the short path carries every step but the phase's first 8 (the
    warm-up samples), the samples, each sample's next step (on the clock) and every
    STEP_CLOCK_STRIDE-th: the step after one on the clock takes its end mark on the short path."""
    sequence = _steps(0, n_steps=400, finish=0.0, preempt=0.0, arrivals=(0,), spec_rate=0.0)
    sequence = [so for so in sequence if so.total_num_scheduled_tokens]
    rows, general = _run(sequence, True, {})
    taken = len(rows) - len(general)
    on_clock = [r[COMPARED.index("step_clock")] != "host" for r in rows]
    sampled = [r[COMPARED.index("sampled")] for r in rows]
    assert all(sampled[:8])
    # a sample every 8th step after the warm-up (8, 16, ...), each followed by one on the clock
    assert [i for i, s in enumerate(sampled) if s] == list(range(8)) + list(range(8, len(rows), 8))
    assert all(on_clock[i] for i in range(9, len(rows), 8))
    # the short path: the steps neither sampled nor on the device clock
    assert taken == sum(1 for c, s in zip(on_clock, sampled, strict=True) if not (c or s))
    assert taken > len(rows) // 2


@pytest.mark.parametrize("reason", ["fault", "probe"])
def test_a_fault_or_a_waiting_probe_takes_the_next_step_off_the_short_path(reason: str) -> None:
    """The short path checks neither a test's fault nor a waiting probe: the session holds it off
    (hold_short_path) from the moment either comes, though the profiler had opened it for the
    steps up to its next due sample."""
    sequence = _steps(1, n_steps=120, finish=0.0, preempt=0.0, arrivals=(0,), spec_rate=0.0)
    sequence = [so for so in sequence if so.total_num_scheduled_tokens]
    session = WorkerSession(SimpleNamespace())
    prof = ForwardProfiler(_Events(), [], sample_every=1000, own_budget=0.0)
    prof.own = session.own_s
    session.profiler = prof
    seen: list[int] = []
    begin_step = prof.begin_step

    def counted(so: Any, *quick: Any) -> Any:
        seen.append(prof.step_index)
        return begin_step(so, *quick)

    prof.begin_step = counted  # type: ignore[method-assign]
    execute = session._execute_wrapper(lambda so: None)
    sample = session._sample_wrapper(lambda grammar: "output")
    for so in sequence[:100]:
        execute(so)
        sample(None)
    assert seen[-1] < prof.step_index - 2 and prof._phase_steps[0] < prof._fast_until  # on the short path, as the next
    if reason == "fault":  # (tests/fixtures/faults.py's inject_fault)
        session.faults.add("steps")
    else:  # (arm_probe's plan, without a model to hook)
        session.probe_plan = ["decode"]
    session.hold_short_path()
    index = prof.step_index
    execute(sequence[100])
    sample(None)
    if reason == "fault":
        assert "steps" in session.disabled and session.crashes[-1]["type"] == "InjectedFault"
        assert prof.step_index == index  # no step counted once the bookkeeping is off
    else:
        assert seen[-1] == index and not session.probe_plan  # begin_step's path, where the probe took its step


class _LateEvents(_Events):
    """Marks that complete only once ``done`` is set (a sample's events still on the device)."""

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    def ready(self, mark: Any) -> bool:
        return self.done


def test_under_a_budget_a_sample_is_resolved_at_the_first_step_end_after_its_events_completed() -> None:
    """Under the doctor's budget a finished sample is resolved as soon as its events have completed
    (its cost is the doctor's own before the budget decides on the next due step): the steps that
    follow it while it waits end on finish_plain's path, which resolves it, never on the
    sample_tokens wrapper's short end, which does not."""
    sequence = _steps(2, n_steps=60, finish=0.0, preempt=0.0, arrivals=(0,), spec_rate=0.0)
    sequence = [so for so in sequence if so.total_num_scheduled_tokens]
    clock = _LateEvents()
    session = WorkerSession(SimpleNamespace())
    prof = ForwardProfiler(clock, [], sample_every=1000, own_budget=0.5)
    prof.own = session.own_s
    session.profiler = prof
    execute = session._execute_wrapper(lambda so: None)
    sample = session._sample_wrapper(lambda grammar: "output")
    for so in sequence[:40]:  # the warm-up samples, their events never complete
        execute(so)
        sample(None)
    assert prof.pending  # the samples wait for their events
    clock.done = True
    execute(sequence[40])
    sample(None)
    assert not prof.pending  # resolved at this step's end


def _so(new: dict[str, tuple[int, int]], running: list[str], computed: dict[str, int], sched: dict[str, int]) -> Any:
    """A SchedulerOutput as plain data: ``new`` id -> (prompt length, tokens scheduled), then the
    running requests (``sched``: their tokens this step, ``computed``: before it)."""
    new_reqs = [
        SimpleNamespace(req_id=r, prompt_token_ids=[0] * plen, block_ids=([i + 1],), num_computed_tokens=0)
        for i, (r, (plen, _)) in enumerate(new.items())
    ]
    cached = SimpleNamespace(
        req_ids=list(running), num_computed_tokens=[computed[r] for r in running],
        new_block_ids=[None] * len(running), resumed_req_ids=set(),
    )  # fmt: skip
    scheduled = {**{r: n for r, (_, n) in new.items()}, **{r: sched.get(r, 1) for r in running}}
    return SimpleNamespace(
        scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached, num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()), scheduled_spec_decode_tokens={},
        finished_req_ids=set(), preempted_req_ids=set(),
    )  # fmt: skip


def test_an_arrival_whose_prompt_goes_on_takes_its_steps_off_the_short_path() -> None:
    """A mixed step on the short path whose new request's prompt does not end in it leaves that
    request in its prompt: the next step, where it is scheduled its last prompt token beside the
    others' one token each, adds up as a decode step's total, and is one only on begin_step's
    path (a prefill token), not on the short decode path's."""
    seq: list[Any] = []
    running: list[str] = []
    computed: dict[str, int] = {}
    for i in range(60):  # arrivals with a 3-token prompt each on every other step (mixed steps)
        new = {f"s{i}": (3, 3)} if i % 2 == 0 else {}
        seq.append(_so(new, running, computed, {}))
        for r in running:
            computed[r] += 1
        for r in new:
            running.append(r)
            computed[r] = 3
    seq.append(_so({"long": (17, 16)}, running, computed, {}))  # its prompt's first 16 tokens
    for r in running:
        computed[r] += 1
    running.append("long")
    computed["long"] = 16
    seq.append(_so({}, running, computed, {}))  # its 17th and last prompt token, 1 token as the others
    short, general = _run(seq, True, {})
    full, _ = _run(seq, False, {})
    assert short == full
    prefill = COMPARED.index("prefill_tokens")
    assert [r[prefill] for r in short[-2:]] == [16, 1]
    p_reqs, d_tokens = COMPARED.index("prefill_reqs"), COMPARED.index("decode_tokens")
    mixed_short = [r for r in short if r[0] not in general and r[prefill] and r[d_tokens]]
    assert mixed_short and all(r[p_reqs] == 1 for r in mixed_short)  # the arrivals' steps before it took the short path
