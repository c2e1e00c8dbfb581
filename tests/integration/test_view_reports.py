"""``vllm-doctor view`` on reports the real doctor writes in this session: ``profile`` of the example
model (eager, on its engine's recorded reply: tests/fixtures/engine_replies.py, case
``ok-eager-deep``), and ``check --json`` of a broken example. Each pane is compared
with the report's own numbers, so a change of the report's shape that the view does not follow
fails here (the committed-report tests are tests/unit/test_view.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable

from tests.conftest import run_doctor, variant_env
from tests.fixtures import engine_replies
from tests.fixtures.tui import drive, text_of
from vllm_doctor.checks import CATALOGUE
from vllm_doctor.report.rule import render_rule
from vllm_doctor.tui.report_view import ViewApp
from vllm_doctor.units import fmt_bytes

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]


@pytest.fixture(scope="session")
def profile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # eager: each module timed (the layers pane)
    run = engine_replies.replay("ok-eager-deep", tmp_path_factory.mktemp("view-profile"))
    assert run.rc == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run.out


@pytest.fixture(scope="session")
def broken_report(examples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = "registered-under-model-type"
    proc = run_doctor(["check", str(examples_dir / name / "model"), "--json", "-q"], variant_env(examples_dir, name))
    assert proc.returncode == 1, proc.stderr
    path = tmp_path_factory.mktemp("view-check") / "r.json"
    path.write_text(proc.stdout)
    return path


def rows(app: Any, selector: str) -> list[list[str]]:
    table = app.screen.query_one(selector, DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def test_every_pane_of_a_real_profile_shows_the_reports_numbers(profile_dir: Path) -> None:
    report = json.loads((profile_dir / "report.json").read_text())
    engine = report["profiles"]["engine"]

    async def script(pilot: Any) -> dict[str, Any]:
        app = pilot.app
        seen: dict[str, Any] = {"findings": rows(app, "#findings-table"), "detail": text_of(app, "#finding-detail")}
        for key, name in (("3", "steps"), ("4", "layers")):
            await pilot.press(key)
            seen[name] = rows(app, f"#{name}-table")
        seen["phases"] = rows(app, "#phases-table")
        seen.update({s: text_of(app, f"#{s}-text") for s in ("anatomy", "memory", "kv")})
        return seen

    seen = drive(ViewApp(profile_dir), (160, 48), script)  # the --out directory opens too
    assert sorted(r[2] for r in seen["findings"]) == sorted(f["code"] for f in report["findings"])
    first = seen["findings"][0][2]
    assert render_rule(CATALOGUE[first].meta) in seen["detail"]
    assert [r[0] for r in seen["steps"]] == [str(s["index"]) for s in engine["steps"]]
    assert [r[0] for r in seen["phases"]] == list(engine["phases"])
    slowest = max(engine["layers"]["modules"], key=lambda m: m["total_s"])
    assert seen["layers"][0][0] == slowest["name"] and len(seen["layers"]) == len(engine["layers"]["modules"])
    anatomy = report["facts"]["engine"]
    assert f"engine core   pid {anatomy['front_end']['pid']}" in seen["anatomy"]
    memory = engine["memory"][0]
    assert f"{fmt_bytes(memory['total'])} in all, from {memory['total_source']}" in seen["memory"]
    kv = anatomy["kv_cache"]
    assert f"blocks        {kv['num_blocks']} x {kv['block_size']} tokens" in seen["kv"]
    assert f"{fmt_bytes(kv['storage_bytes'])}" in seen["kv"]


def test_a_real_broken_check_report_lists_its_failures_first_with_their_explanations(broken_report: Path) -> None:
    report = json.loads(broken_report.read_text())
    failing = sorted(f["code"] for f in report["findings"] if f["outcome"] == "fail")

    async def script(pilot: Any) -> list[Any]:
        table = rows(pilot.app, "#findings-table")
        details = []
        for _ in failing:
            details.append(text_of(pilot.app, "#finding-detail"))
            await pilot.press("down")
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        return [table, details, text_of(pilot.app, "#steps-text")]

    table, details, steps = drive(ViewApp(broken_report), (160, 48), script)
    assert failing == ["VD101", "VD103"]
    assert [r[2] for r in table[: len(failing)]] == failing and all(r[0] == "FAIL" for r in table[:2])
    for code, detail in zip(failing, details, strict=True):
        assert detail.startswith(f"FAIL  {code} ") and render_rule(CATALOGUE[code].meta) in detail
    assert "steps: not in this report (no engine ran for it" in steps


def test_view_screenshot_of_the_real_profile(profile_dir: Path, tmp_path: Path) -> None:
    shot = tmp_path / "layers.svg"
    proc = run_doctor(["view", str(profile_dir / "report.json"), "--screenshot", str(shot), "--pane", "layers"])
    assert proc.returncode == 0, proc.stderr
    assert "model.layers.0" in shot.read_text() and f"wrote {shot}" in proc.stderr
