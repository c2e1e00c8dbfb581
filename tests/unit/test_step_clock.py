"""Which steps are on which clock (issue 44 item 2): the sampled step clock on a GPU puts the
device clock on the sampled steps and the step after each, the other steps carry their host
span; the phase means count those at the mean of the unsampled steps on the clock, and the
report, top's model panel and /metrics say on how many steps the clock ran. The profiler's side
(which steps get events) is in test_engine_units.py; here the numbers and the words, and the
option's checks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_doctor.analysis.engine import clock_mean, phase_summary
from vllm_doctor.analysis.records import PhaseSummary
from vllm_doctor.channel import ChannelError, validate
from vllm_doctor.constants import STEP_CLOCK_ENV, STEP_CLOCK_STRIDE
from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.profiler import COUNT_BATCH, ForwardProfiler, OpenStep
from vllm_doctor.engine.session import step_clock_of
from vllm_doctor.facts.steps import StepTable
from vllm_doctor.live.exporter import ExportState
from vllm_doctor.live.sources import ModelSummary
from vllm_doctor.report.profile import step_clock_text
from vllm_doctor.tui.panels import clock_line


def test_a_phase_mean_counts_the_unsampled_steps_at_the_mean_of_those_on_the_clock() -> None:
    # 2 samples (10, 12 ms), 2 unsampled steps on the clock (4, 6 ms), 4 on the host's (1 ms spans)
    step_s = [0.010, 0.004, 0.001, 0.001, 0.012, 0.006, 0.001, 0.001]
    on_clock = [True, True, False, False, True, True, False, False]
    sampled = [True, False, False, False, True, False, False, False]
    mean, clock_steps, untimed, host = clock_mean(step_s, on_clock, sampled)
    # the samples as measured, the 6 unsampled steps at 5 ms: (22 + 6 * 5) / 8
    assert mean == pytest.approx((0.022 + 6 * 0.005) / 8)
    assert (clock_steps, untimed) == (4, 2) and host == pytest.approx(0.001)
    # every step on the clock (the CPU's wall clock, the every-step clock): the plain mean
    assert clock_mean([0.01, 0.02], [True, True], [True, False]) == (pytest.approx(0.015), 2, 1, None)
    # no step on the clock: the host's spans are all there is
    assert clock_mean([0.002, 0.004], [False, False], [False, False]) == (pytest.approx(0.003), 0, 0, 0.003)
    # only samples on the clock: their mean stands for every step
    assert clock_mean([0.01, 0.001], [True, False], [True, False])[:3] == (pytest.approx(0.01), 1, 0)


def _decode_table(step_s: list[float], on_clock: list[bool], sampled: list[bool]) -> StepTable:
    n = len(step_s)
    cols: dict[str, list[Any]] = {
        "index": list(range(n)),
        "host_start": [float(i) for i in range(n)],
        "prefill_tokens": [0] * n,
        "decode_tokens": [4] * n,
        "prefill_reqs": [0] * n,
        "decode_reqs": [4] * n,
        "total_tokens": [4] * n,
        "kv_blocks_used": [1] * n,
        "preempted_reqs": [0] * n,
        "resumed_reqs": [0] * n,
        "step_s": step_s,
        "device_timed": on_clock,
        "forward_s": [s * 0.8 if m else None for s, m in zip(step_s, sampled, strict=True)],
        "logits_s": [None] * n,
        "host_execute_s": [0.001] * n,
        "host_sample_s": [0.0005] * n,
        "sampled": sampled,
        "layers_timed": sampled,
        "layers_detail": sampled,
        "idle_before_s": [None] * n,
        "encoder_s": [None] * n,
    }
    return StepTable(cols, "cuda_events")


def test_the_phase_summary_and_the_reports_say_which_steps_are_on_the_device_clock() -> None:
    pattern = ([0.012, 0.010] + [0.002] * 6, [True, True] + [False] * 6, [True] + [False] * 7)
    table = _decode_table(pattern[0] * 4, pattern[1] * 4, pattern[2] * 4)
    decode = phase_summary(table)["decode"]
    assert (decode.steps, decode.clock_steps, decode.clock_untimed_steps, decode.host_steps) == (32, 8, 4, 24)
    assert decode.step_s_mean == pytest.approx((4 * 0.012 + 28 * 0.010) / 32)
    assert decode.host_step_s_mean == pytest.approx(0.002)
    assert decode.step_s_p50 in (0.010, 0.012)  # over the steps on the clock only (most are 2 ms host spans)
    assert decode.tokens_per_s == pytest.approx(128 / (32 * decode.step_s_mean))
    # the per-layer timing's cost: the timed steps against their untimed neighbours on the clock
    assert decode.untimed_step_s_median == pytest.approx(0.010) and decode.untimed_steps == 4
    text = step_clock_text("decode", decode, "cuda_events")
    assert text.startswith(
        "decode: device clock (CUDA events) on 8 of 32 steps (4 sampled, 4 unsampled (the step after a sample, "
        "every 32nd step, a window's first): the mean counts the other 24 at those 4's)"
    )
    assert "host spans on 24" in text
    # every step on the clock: nothing to say
    every = phase_summary(_decode_table([0.01] * 8, [True] * 8, [True] + [False] * 7))["decode"]
    assert every.clock_steps == 8 and every.host_steps == 0 and step_clock_text("decode", every, "cuda_events") == ""
    # a report from before the sampled clock reads as every step on it
    assert PhaseSummary.of({"steps": 5, "step_s_mean": 0.01}).host_steps == 0


def test_top_and_metrics_say_on_how_many_steps_the_clock_ran() -> None:
    phases = {
        "decode": PhaseSummary(steps=90, tokens=360, step_s_mean=0.01, clock_steps=20, clock_untimed_steps=10),
        "prefill": PhaseSummary(steps=10, tokens=100, step_s_mean=0.02),  # before: all on the clock
    }
    model = ModelSummary(available=True, clock="cuda_events", steps=100, phases=phases)
    assert clock_line(model) == "times on the device clock (CUDA events), 30 of 100 steps (the rest at their mean)"
    assert clock_line(ModelSummary(available=True, clock="wall_clock", phases={"decode": PhaseSummary(steps=3)})) == (
        "times on the wall clock (the CPU is the device)"
    )
    state = ExportState()
    state.add(model)
    assert state.counters[("clock_steps_total", "decode")] == 20
    assert state.counters[("clock_steps_total", "prefill")] == 10
    assert state.counters[("step_seconds_total", "decode")] == pytest.approx(0.9)


def test_a_readers_new_window_holds_a_device_clock_step_of_each_phase_it_runs() -> None:
    """After a reader's window begins (its reset), the next unsampled step of each phase is on the
    device clock, not only every 32nd: a window of a few steps of a phase (a served panel's second
    with a prefill or two) holds one, and its mean is a device-clock mean, not enqueue time."""
    prof = ForwardProfiler(_Events(), [], sample_every=1 << 20, own_budget=0.0)  # type: ignore[arg-type]
    prof.open_window("panel")
    rids = ["a", "b"]

    def run(first: int, n: int) -> None:
        for i in range(first, first + n):
            prof.begin_step(_decode_step(rids, i == 0))
            prof.after_execute(0.001, output_is_final=False)
            prof.after_sample(0.0005)

    run(0, 41)  # the prefill, then decode's steps 0-39 (32 on the clock as every 32nd)
    prof.snapshot(reset=True, timeline=False, reader="panel")
    run(41, 5)  # decode's steps 40-44: none a 32nd, none after a sample
    rows = StepTable.of(prof.snapshot(reset=True, reader="panel")).rows()
    assert [r["step_clock"] for r in rows] == ["cuda_events"] + ["host"] * 4
    run(46, 3)  # decode's steps 45-47, after the second reset
    decode = phase_summary(StepTable.of(prof.snapshot(timeline=False, reader="panel")))["decode"]
    assert (decode.steps, decode.clock_steps, decode.clock_untimed_steps) == (3, 1, 1)


def test_the_step_clock_option_is_checked_where_it_enters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STEP_CLOCK_ENV, raising=False)
    assert step_clock_of(None) == "sampled" and step_clock_of("every") == "every"
    monkeypatch.setenv(STEP_CLOCK_ENV, " Every ")
    assert step_clock_of(None) == "every" and step_clock_of("sampled") == "sampled"
    monkeypatch.setenv(STEP_CLOCK_ENV, "sometimes")
    with pytest.raises(ValueError, match="VLLM_DOCTOR_STEP_CLOCK='sometimes': the step clock is one of sampled, every"):
        step_clock_of(None)
    with pytest.raises(ValueError, match="step_clock='never'"):
        step_clock_of("never")
    request = {"v": 1, "method": "doctor_install", "options": {"step_clock": "every"}}
    assert validate(request) == ("doctor_install", {"step_clock": "every"})
    with pytest.raises(ChannelError, match="step_clock must be one of sampled, every"):
        validate({**request, "options": {"step_clock": 1}})


def _decode_step(rids: list[str], first: bool) -> Any:
    new = [SimpleNamespace(req_id=r, prompt_token_ids=[1, 2], block_ids=([i + 1],), num_computed_tokens=0)
           for i, r in enumerate(rids)] if first else []  # fmt: skip
    cached = SimpleNamespace(
        req_ids=[] if first else list(rids),
        num_computed_tokens=[] if first else [2] * len(rids),
        new_block_ids=[] if first else [None] * len(rids),
        resumed_req_ids=set(),
    )
    sched = dict.fromkeys(rids, 2 if first else 1)
    return SimpleNamespace(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=sched,
        total_num_scheduled_tokens=sum(sched.values()), scheduled_spec_decode_tokens={},
        finished_req_ids=set(), preempted_req_ids=set(),
    )  # fmt: skip


def test_unsampled_steps_are_counted_in_batches_and_the_counting_is_the_doctors_own_time() -> None:
    """An unsampled step keeps its SchedulerOutput as captured; the counts come in a batch (every
    COUNT_BATCH steps, before a sampled step, at a collection), each step a record once counted and
    finished; the counting's time goes to own["counts"]."""
    prof = ForwardProfiler(WallClock(), [], sample_every=1 << 20)
    rids = ["a", "b", "c"]
    for i in range(SAMPLE := 10 + 5):  # the prefill, 8 warm-up decode steps and the next are samples, then 5 plain
        step = prof.begin_step(_decode_step(rids, i == 0))
        assert isinstance(step, OpenStep) == (i < 10)
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    assert len(prof.to_count) == 5 and not prof.steps  # samples resolve in batches
    assert all(step[2] is None and step[9] is not None for step in prof.to_count)  # finished, not counted yet
    for _ in range(COUNT_BATCH - 5):
        prof.begin_step(_decode_step(rids, False))
        prof.after_sample(0.0005)
    # the batch was counted as its last step began: that one became a record as it finished
    assert not prof.to_count and len(prof.steps) == COUNT_BATCH
    assert prof.own["counts"] > 0
    rows = StepTable.of(prof.snapshot()).rows()
    assert len(rows) == SAMPLE + COUNT_BATCH - 5 and [r["index"] for r in rows] == list(range(len(rows)))
    assert all((r["decode_tokens"], r["decode_reqs"], r["kv_blocks_used"]) == (3, 3, 3) for r in rows[1:])
    assert rows[0]["prefill_tokens"] == 6


class _Mark:
    def __init__(self, t: float) -> None:
        self.t = t


class _Events:
    """CUDA-event-like marks (a counter's ticks, all completed) for the profiler's GPU path."""

    kind, domain, one_stream = "cuda_events", "device", True

    def __init__(self) -> None:
        self.now = 0.0

    def mark(self, refresh: bool = False) -> _Mark:
        self.now += 1.0
        return _Mark(self.now)  # an object, hashed by identity as an event is

    @staticmethod
    def capturing() -> bool:
        return False

    def ready(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        return None

    def seconds(self, start: Any, end: Any) -> float:
        return float(end.t - start.t)


def test_a_summary_window_carries_each_steps_clock() -> None:
    """top's panel and the /metrics exporter read windows without the timeline (the summary
    columns): those carry each step's clock and whether it was sampled, so their phase means
    count the host-clock steps at the mean of those on the clock (a window without them read
    every step as on the clock, or none)."""
    prof = ForwardProfiler(_Events(), [], sample_every=4, own_budget=0.0)  # type: ignore[arg-type]
    rids = ["a", "b"]
    for i in range(40):
        prof.begin_step(_decode_step(rids, i == 0))
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    window = prof.snapshot(timeline=False)
    assert {"device_timed", "sampled"} <= set(window["step_arrays"]["columns"])
    decode = phase_summary(StepTable.of(window))["decode"]
    # the phase's decode steps 0-7 sampled, then every 4th (8, 12, ..., 36): 16 samples, each of the
    # last 8 followed by its neighbour on the clock (decode's 32nd step, every STEP_CLOCK_STRIDE-th
    # of the phase, is a sample already)
    assert STEP_CLOCK_STRIDE == 32
    assert (decode.steps, decode.clock_steps, decode.clock_untimed_steps) == (39, 16 + 8, 8)
    assert decode.host_step_s_mean is not None and decode.step_s_mean > 0


def test_the_command_lines_step_clock_reaches_the_engines_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``profile --step-clock every``: the engine stage (replaced here) gets it as its options'
    ``step_clock`` (its child attaches with it), and the process environment is left as it was;
    ``attach --step-clock`` takes sampled or every, anything else is a usage error."""
    import os

    import vllm_doctor.cli.profile
    import vllm_doctor.stages.engine
    from vllm_doctor.cli import build_parser, main
    from vllm_doctor.model import Report

    seen: list[tuple[str | None, str | None]] = []

    def stage(model: str, options: Any, static: Any = None, **_: Any) -> Report:
        seen.append((options.step_clock, os.environ.get(STEP_CLOCK_ENV)))
        report = Report(target=model)
        report.facts["engine_failure"] = "not started: the test reads the environment only"
        return report

    monkeypatch.setattr(vllm_doctor.stages.engine, "diagnose_engine", stage)
    monkeypatch.setattr(vllm_doctor.cli.profile, "write_reports", lambda out, report: [])
    monkeypatch.setenv(STEP_CLOCK_ENV, "sampled")
    assert main(["profile", "/m", "--out", str(tmp_path), "-q", "--step-clock", "every"]) == 1  # engine_failure
    assert seen == [("every", "sampled")]
    assert build_parser().parse_args(["attach", "--step-clock", "every"]).step_clock == "every"
    assert build_parser().parse_args(["attach"]).step_clock is None  # the workers' environment decides
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["attach", "--step-clock", "sometimes"])
    assert exit_info.value.code == 2
    assert "--step-clock: invalid choice: 'sometimes'" in capsys.readouterr().err


def test_every_strideth_step_of_a_phase_is_on_the_device_clock_where_no_sample_is() -> None:
    """The sampled step clock also puts an event pair on every STEP_CLOCK_STRIDE-th step of each
    phase: a window of a phase with few samples (the own budget) still has device-clock steps."""
    prof = ForwardProfiler(_Events(), [], sample_every=1 << 20, own_budget=0.0)  # type: ignore[arg-type]
    rids = ["a", "b"]
    for i in range(101):  # the prefill, then decode's steps 0-99
        prof.begin_step(_decode_step(rids, i == 0))
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    rows = StepTable.of(prof.snapshot()).rows()
    on_clock_unsampled = [r["index"] - 1 for r in rows if r["step_clock"] == "cuda_events" and not r["sampled"]]
    # decode's warm-up (0-7) and its 8th step are samples; the step after the last of them (9) is on
    # the clock as its neighbour, and decode's 32nd, 64th and 96th steps as every 32nd
    assert on_clock_unsampled == [9, 32, 64, 96]
    decode = phase_summary(StepTable.of(prof.snapshot(timeline=False)))["decode"]
    assert (decode.clock_steps, decode.clock_untimed_steps) == (9 + 4, 4)
