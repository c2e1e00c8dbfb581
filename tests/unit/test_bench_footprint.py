"""bench/bench_footprint.py's figures from a served run's windows (plain data; nothing here starts vLLM):
the doctor's share of the worker with the calls it served and without them, and what an attach of
the CLI's default duration costs at a run's rates."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Any:
    sys.path.insert(0, str(REPO / "bench"))
    import bench_footprint  # type: ignore[import-not-found]

    return bench_footprint


def _window(own_s: float, rpc_s: float, window_s: float, steps: int) -> dict[str, Any]:
    return {"own_s": own_s, "rpc_s": rpc_s, "rpc_wall_s": rpc_s, "window_s": window_s, "steps": steps}


def test_steps_share_leaves_the_calls_out(bench: Any) -> None:
    # two attaches of 12 s: 30 ms of the doctor's steps each, 36 and 34 ms of calls
    figures = bench.window_figures([_window(0.030, 0.036, 12.0, 1500), _window(0.030, 0.034, 12.0, 1500)])
    assert figures["steps_share"] == pytest.approx(0.060 / 24.0)
    assert figures["worker_share"] == pytest.approx(0.130 / 24.0)
    assert figures["per_step_us"] == pytest.approx(20.0)
    assert figures["calls_ms_per_read"] == pytest.approx(35.0)


def test_an_attach_pays_its_calls_once(bench: Any) -> None:
    from vllm_doctor.cli.attach import DURATION_S

    assert bench.ATTACH_DEFAULT_S == DURATION_S
    # the H100 run of 2026-12-07: steps 0.317 %, 35.5 ms of calls an attach
    assert bench.attach_share(0.00317, 0.0355, 12.0) == pytest.approx(0.00613, abs=1e-5)
    assert bench.attach_share(0.00317, 0.0355, 30.0) == pytest.approx(0.00435, abs=1e-5)


def test_the_attach_line_is_printed_for_attach_only(bench: Any, capsys: pytest.CaptureFixture[str]) -> None:
    summary: dict[str, Any] = {
        "device": "a GPU", "vllm_version": "0.26.0", "runner": "v2", "mode": "default", "reader": "attach",
        "reader_interval_s": 0.0, "sample_every": 8, "step_clock": "sampled", "clients": 128, "rounds": 6,
        "seconds": 12.0, "failed_requests": 0, "steps": 9000, "own_by_part_us_per_step": {"counts": 13.0},
        "steps_share": 0.00317, "calls_ms_per_read": 35.5, "phases": {},
    }  # fmt: skip
    bench.print_summary(summary)
    out = capsys.readouterr().out
    assert "attach: its steps 0.32% of the worker, its calls 35.5 ms an attach (12 s here)" in out
    assert f"default {bench.ATTACH_DEFAULT_S:g} s: 0.44%" in out
    bench.print_summary({**summary, "reader": "panel"})
    assert "attach:" not in capsys.readouterr().out
