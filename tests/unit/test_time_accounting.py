"""Every time names its clock, and the steps' sum is checked against the workload's wall time."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vllm_doctor.analysis.engine import idle_between_steps, phase_summary, time_accounting
from vllm_doctor.analysis.records import EngineProfile, TimeAccounting, WorkloadRun
from vllm_doctor.facts.steps import StepTable
from vllm_doctor.live.sources import model_summary
from vllm_doctor.model import Report
from vllm_doctor.report.html import phases_table
from vllm_doctor.report.profile import accounting_text, render_profile
from vllm_doctor.tui.panels import model_panel
from vllm_doctor.units import clock_name


# the H200 run of bench/bench_clock.py (Llama-3-8B shape, default mode): 1 prefill + 255 decode steps
def accounting(profile: dict[str, Any], workload: dict[str, Any] | None) -> TimeAccounting | None:
    """time_accounting of a profile and a workload as report.json holds them (their records)."""
    return time_accounting(EngineProfile.of(profile), WorkloadRun.of(workload) if workload is not None else None)


H200 = {"prefill": {"steps": 1, "step_s_mean": 0.36522}, "decode": {"steps": 255, "step_s_mean": 0.00745}}


def test_steps_that_fit_in_the_wall_time_leave_the_rest_to_the_engines_host() -> None:
    acc = accounting({"clock": "cuda_events", "phases": H200}, {"wall_s": 2.358})
    assert acc is not None and not acc.above_wall
    assert abs(acc.steps_s - (0.36522 + 255 * 0.00745)) < 1e-9 and 0.9 < acc.share < 1.0
    text = accounting_text(acc)
    assert text.startswith("steps add up to 2.26 s on the device clock = 96% of the workload's 2.36 s wall time")
    assert "ran outside any step" in text


def test_the_devices_idle_time_between_steps_accounts_for_the_rest_of_the_wall_time() -> None:
    """The H200's eager multiprocess run (bench/bench_clock.py): the steps on the device clock are
    89 % of the wall time; what is left is the device idle between steps (measured on the same
    clock, from one step's end event to the next one's start event) and the time before the first
    step and after the last."""
    steps = [{"phase": "prefill", "prefill_tokens": 9, "total_tokens": 9, "step_s": 0.3, "idle_before_s": None}]
    steps += [{"phase": "decode", "decode_tokens": 1, "total_tokens": 1, "step_s": 0.0156, "idle_before_s": 0.0021}
              for _ in range(255)]
    table = StepTable.of({"steps": steps, "clock": "cuda_events"})
    idle = idle_between_steps(table)
    assert idle is not None and idle.gaps == 255 and idle.clock == "cuda_events"
    assert idle.total_s == pytest.approx(255 * 0.0021) and idle.p50_s == pytest.approx(0.0021)
    assert phase_summary(table)["decode"].idle_before_s_mean == pytest.approx(0.0021)
    assert phase_summary(table)["prefill"].idle_before_s_mean is None  # the first step's began before the table
    profile = {"clock": "cuda_events", "phases": phase_summary(table), "idle_between_steps": idle}
    acc = accounting(profile, {"wall_s": 4.977})
    assert acc is not None and acc.share == pytest.approx((0.3 + 255 * 0.0156) / 4.977)
    assert acc.between_steps_s == pytest.approx(0.5355) and acc.edges_s == pytest.approx(
        4.977 - 0.3 - 255 * 0.0156 - 0.5355
    )
    assert acc.accounted_share == pytest.approx((0.3 + 255 * 0.0156 + 0.5355) / 4.977)
    text = accounting_text(acc)
    assert text.startswith("steps add up to 4.28 s on the device clock = 86% of the workload's 4.98 s wall time")
    assert "between steps the device stood idle 535.50 ms (11%, 2.10 ms a step on the device clock" in text
    assert text.endswith("before the first step and after the last (requests in, outputs out)")
    # a gap longer than what the steps leave is capped (the table's first gap is never counted)
    capped = accounting(profile | {"idle_between_steps": dataclasses.replace(idle, total_s=9.0)}, {"wall_s": 4.977})
    assert capped is not None and capped.edges_s == 0.0


def test_steps_longer_than_the_workload_are_a_doctor_bug() -> None:
    """The old host-time-as-step clock could not have failed this way; a device clock that double
    counts (overlapping steps) would: the check says so instead of printing the number."""
    acc = accounting({"clock": "cuda_events", "phases": H200}, {"wall_s": 1.5})
    assert acc is not None and acc.above_wall
    assert "DOCTOR BUG" in accounting_text(acc)
    assert accounting({"phases": H200}, None) is None and accounting({"phases": {}}, {"wall_s": 1}) is None


def test_the_forward_share_is_of_the_steps_it_was_timed_on() -> None:
    """Forward times exist on sampled steps only: a sample's forward is compared with that
    sample's step, not with the mean of every step (eager samples carry more instrumentation)."""
    steps = [{"phase": "decode", "decode_tokens": 1, "total_tokens": 1, "decode_reqs": 1, "step_s": s, "forward_s": f}
             for s, f in ((0.030, 0.027), (0.010, None), (0.010, None), (0.030, 0.027))]
    decode = phase_summary(StepTable.of({"steps": steps}))["decode"]
    assert decode.forward_s_mean is not None and decode.forward_s_mean > decode.step_s_mean  # what confused readers
    assert decode.forward_share is not None and abs(decode.forward_share - 0.9) < 1e-9
    # the forward is set beside the step time of the same steps: the two sampled ones
    assert (decode.forward_steps, decode.forward_steps_step_s_mean) == (2, pytest.approx(0.030))


def test_reports_and_top_name_the_clock() -> None:
    profile = {"clock": "cuda_events", "layers_on": True, "steps": [{}],
               "phases": {"decode": {"steps": 255, "tokens": 32640, "mean_batch": 128.0, "step_s_mean": 0.00745,
                                     "step_s_p50": 0.0074, "step_s_p90": 0.0076, "forward_s_mean": 0.0072,
                                     "forward_share": 0.97, "tokens_per_s": 17181.0}},
               "time_accounting": accounting({"clock": "cuda_events", "phases": H200}, {"wall_s": 2.358})}
    text = render_profile(EngineProfile.of(profile))
    assert text.splitlines()[0] == "forward profile: times on the device clock (CUDA events), per-layer on"
    assert "forward 7.20 ms (97% of its steps)" in text and "  time          steps add up to" in text
    assert "device clock (CUDA events)" in phases_table(EngineProfile.of(profile), None)
    assert clock_name("wall_clock") == "wall clock (the CPU is the device)"
    model = model_summary(Report("t", profiles={"engine": EngineProfile.of({**profile, "available": True})}))
    assert model.clock == "cuda_events"
    panel = model_panel(type("F", (), {"model": model})(), 60).plain  # type: ignore[arg-type]
    assert "times on the device clock (CUDA events)" in panel and "p50 step 7.40 ms" in panel


def test_the_edges_are_measured_on_the_hosts_clock_when_both_sides_carry_their_times() -> None:
    """The workload's start (the driver's perf_counter) and the steps' host span (the worker's):
    the time before the first step and after the last is measured, not what the steps leave, so the
    sum of the four can be checked against the wall time (the H200 LLaVA-7B-shaped run: 0.41 s
    before the first step, the image processor's)."""
    steps = [{"phase": "prefill", "prefill_tokens": 9, "total_tokens": 9, "step_s": 0.3, "idle_before_s": None,
              "t": 0.0}]
    steps += [{"phase": "decode", "decode_tokens": 1, "total_tokens": 1, "step_s": 0.0156, "idle_before_s": 0.0021,
               "t": 0.3021 + i * 0.0177} for i in range(255)]  # fmt: skip
    table = StepTable.of({"steps": steps, "clock": "cuda_events"})
    from vllm_doctor.analysis.engine import host_span

    span = host_span(table)
    assert span is not None and span[1] - span[0] == pytest.approx(0.3021 + 254 * 0.0177 + 0.0156)
    span = [100.0 + span[0], 100.0 + span[1]]  # the rows count from the profile's origin; any origin will do
    profile = {"clock": "cuda_events", "phases": phase_summary(table), "idle_between_steps": idle_between_steps(table),
               "host_span_s": span}  # fmt: skip
    wall = 0.4 + (span[1] - span[0]) + 0.02
    acc = accounting(profile, {"wall_s": wall, "host_start_s": span[0] - 0.4})
    assert acc is not None and acc.before_first_s == pytest.approx(0.4) and acc.after_last_s == pytest.approx(0.02)
    assert acc.edges_s == pytest.approx(0.42) and acc.measured_share == pytest.approx(1.0, abs=1e-3)
    text = accounting_text(acc)
    assert "400.00 ms before the first step (requests in: tokenizing, a multimodal processor)" in text
    assert "20.00 ms after the last (outputs out), each measured on the host's clock: 100.0% of the wall time" in text
    # a worker on another host (its monotonic clock is not the driver's): not measured, the rest as before
    far = accounting(profile, {"wall_s": wall, "host_start_s": span[0] + 50.0})
    assert far is not None and far.measured_share is None and far.before_first_s is None
    assert far.edges_s == pytest.approx(wall - far.steps_s - far.between_steps_s)  # type: ignore[operator]


def test_tops_model_panel_shows_the_encoders_time_where_a_phase_ran_it() -> None:
    """The H200 LLaVA-7B-shaped port's default-mode run: the prefill step ran the vision tower
    and projector for 225.74 ms of its 687.50 ms; decode never does (no line for it)."""
    phases = {
        "prefill": {"steps": 1, "step_s_mean": 0.6875, "encoder_steps": 1, "encoder_s": 0.22574, "encoder_step_s": 0.6875},
        "decode": {"steps": 127, "step_s_mean": 0.01469},
    }
    engine = EngineProfile.of({"clock": "cuda_events", "phases": phases, "available": True})
    model = model_summary(Report("t", profiles={"engine": engine}))
    lines = model_panel(type("F", (), {"model": model})(), 60).plain.splitlines()  # type: ignore[arg-type]
    assert [x for x in lines if x.startswith("encoder ")] == ["encoder prefill 225.74 ms in 1 step(s) = 33 %"]
    narrow = model_panel(type("F", (), {"model": model})(), 40).plain.splitlines()  # type: ignore[arg-type]
    assert [x for x in narrow if x.startswith("encoder ")] == ["encoder prefill 225.74 ms in 1 step(s)"]
