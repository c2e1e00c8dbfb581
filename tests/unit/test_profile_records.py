"""The engine profile's records: report.json keeps its keys (an old report reads back whole and
still renders in ``view`` and the HTML), docs/report-schema.json is the one the records declare,
and the steps timed per layer are set against the others (the doctor's own cost, on the step clock).

tests/data/reports/profile_before_records.json: ``vllm-doctor profile`` of the example model
(2 prompts x 16 in / 4 out, CPU, eager) written by the doctor before the records existed (paths
replaced).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.tui import drive, text_of
from vllm_doctor.analysis.engine import phase_summary, summarize
from vllm_doctor.analysis.records import EngineAnatomy, EngineProfile, PhaseSummary, read_report
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.steps import StepTable
from vllm_doctor.report.html import render_html
from vllm_doctor.report.profile import render_profile, timing_cost_text
from vllm_doctor.report.schema import COMMAND, schema_text
from vllm_doctor.tui import report_sections as sec
from vllm_doctor.tui.report_view import ViewApp

ROOT = Path(__file__).resolve().parents[2]
BEFORE = ROOT / "tests" / "data" / "reports" / "profile_before_records.json"
REPORTS = sorted((ROOT / "tests" / "fixtures" / "reports").glob("*.json"))


def test_the_schema_file_is_the_one_the_records_declare() -> None:
    on_disk = (ROOT / "docs" / "report-schema.json").read_text(encoding="utf-8")
    assert on_disk == schema_text(), f"docs/report-schema.json is stale: run `{COMMAND}`"
    schema = json.loads(on_disk)
    phase = schema["$defs"]["EngineProfile"]["properties"]["phases"]["additionalProperties"]
    assert phase["properties"]["timed_step_s_median"]["description"].startswith("median step time of the steps timed")
    assert schema["properties"]["profiles"]["properties"]["engine"] == {"$ref": "#/$defs/EngineProfile"}
    assert "class" in schema["$defs"]["EngineAnatomy"]["properties"]["model"]["properties"]


def _diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Where ``new`` lacks or changes something of ``old`` (new keys are allowed)."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [path]
        return [p for k, v in old.items() for p in ([f"{path}.{k}"] if k not in new else _diff(v, new[k], f"{path}.{k}"))]
    if isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            return [path]
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in _diff(a, b, f"{path}[{i}]")]
    return [] if old == new else [path]


@pytest.mark.parametrize("path", [BEFORE, *REPORTS], ids=lambda p: p.name)
def test_a_report_written_before_reads_into_the_records_and_back_to_the_same_json(path: Path) -> None:
    data = json.loads(path.read_text())
    engine, anatomy = data.get("profiles", {}).get("engine"), data.get("facts", {}).get("engine")
    if engine is not None:
        assert _diff(engine, EngineProfile.of(engine).to_json()) == []
    if anatomy is not None:
        assert _diff(anatomy, EngineAnatomy.of(anatomy).to_json()) == []


@pytest.mark.parametrize("path", [BEFORE, *REPORTS], ids=lambda p: p.name)
def test_a_reports_facts_read_into_their_records_and_back_lose_nothing(path: Path) -> None:
    """Every facts section a report ever wrote (static: plugins, import pass, resolved, weights;
    engine: anatomy, perf) reads into its record and is written back without losing a key."""
    from vllm_doctor.analysis.records import LISTS, SECTIONS, read_report

    data = json.loads(path.read_text())
    report = read_report({**data, "findings": []})  # (findings: any doctor version's; the view reads those)
    assert _diff(data.get("facts", {}), report.to_dict()["facts"]) == []
    for (section, key), record in SECTIONS.items():
        if section == "facts" and data.get("facts", {}).get(key):
            assert isinstance(report.facts[key], record), key
    for (_section, key), record in LISTS.items():
        assert all(isinstance(v, record) for v in report.facts.get(key) or []), key


def test_a_static_checks_plugins_and_import_pass_are_records() -> None:
    from vllm_doctor.analysis.records import ImportSummary, PluginFound, read_report

    report = read_report({**json.loads((ROOT / "tests/fixtures/reports/check_engine.json").read_text()), "findings": []})
    plugins, imported = report.facts["plugins"], report.facts["import_pass"]
    assert plugins and all(isinstance(p, PluginFound) for p in plugins)
    assert any(r.arch and r.target for p in plugins for r in p.registrations)
    assert isinstance(imported, ImportSummary) and imported.vllm_version and imported.plugins[0].loaded
    assert all(c.target for c in imported.classes.values()) and imported.classes
    assert ImportSummary(error="vLLM did not import").to_json() == {
        "timings": {}, "plugins": [], "classes": {}, "error": "vLLM did not import"}


@pytest.mark.parametrize("path", [BEFORE, *(p for p in REPORTS if p.name != "older_minimal.json")], ids=lambda p: p.name)
def test_reports_validate_against_the_generated_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(path.read_text()), json.loads((ROOT / "docs" / "report-schema.json").read_text()))


def test_an_old_report_still_renders_in_view_and_the_html() -> None:
    report = json.loads(BEFORE.read_text())

    async def script(pilot: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {"anatomy": text_of(pilot.app, "#anatomy-text")}
        await pilot.press("2")
        table = pilot.app.screen.query_one("#phases-table")
        seen["phases"] = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        await pilot.press("4")
        seen["layers"] = text_of(pilot.app, "#layers-summary")
        return seen

    seen = drive(ViewApp(BEFORE), (160, 48), script)
    assert "TinyDoctorForCausalLM [plugin]" in seen["anatomy"]
    # the forward beside "its steps' mean": n/a where the old report has no such step time
    assert seen["phases"][1][:3] == ["decode", "3", "6"] and seen["phases"][1][7:9] == ["23.90 ms", "n/a"]
    assert "timed modules cover" in seen["layers"]
    read = read_report(report)
    html = render_html(read)
    assert "<td>decode</td><td>3</td><td>6</td>" in html and "TinyDoctorForCausalLM" in html
    assert render_html(report) == html  # the public edge takes report.json's JSON as well
    assert html.count("<svg") == 5  # anatomy, steps, layers, KV usage, memory
    text = render_profile(read.profiles["engine"], read.profiles["workload"])
    assert "forward 23.90 ms (92% of its steps)" in text and "timing cost" not in text


def _steps(timed: int, untimed: int, interleaved: bool = False) -> StepTable:
    """Decode steps on the device clock: the ones timed per layer take 17.6 ms, the others 13.9
    (``interleaved``: timed and untimed in turn, as many of each, each timed step beside an untimed one)."""
    order = [True, False] * timed if interleaved else [True] * timed + [False] * untimed
    rows = [
        {"index": i, "t": 0.02 * i, "phase": "decode", "decode_tokens": 1, "total_tokens": 1, "decode_reqs": 1,
         "step_s": 0.0176 if on else 0.0139, "forward_s": 0.015 if on else None, "layers_timed": on}
        for i, on in enumerate(order)
    ]  # fmt: skip
    return StepTable.of({"steps": rows, "clock": "cuda_events"})


def test_steps_timed_per_layer_are_set_against_the_others_and_the_forward_beside_its_steps() -> None:
    decode = phase_summary(_steps(5, 6))["decode"]
    assert (decode.timed_steps, decode.timed_step_s_median, decode.untimed_step_s_median) == (5, 0.0176, 0.0139)
    assert decode.timing_cost == pytest.approx(0.0176 / 0.0139 - 1)
    # the forward was timed on the 5 sampled steps: its step time is theirs, not every step's mean
    assert (decode.forward_steps, decode.forward_steps_step_s_mean) == (5, pytest.approx(0.0176))
    assert decode.step_s_mean == pytest.approx((5 * 0.0176 + 6 * 0.0139) / 11)
    only_timed = phase_summary(_steps(3, 0))["decode"]
    assert only_timed.untimed_step_s_median is None and only_timed.timing_cost is None
    assert PhaseSummary.of({"steps": 2}).timed_step_s_median is None  # an older report's phase


def test_the_timing_cost_against_untimed_neighbours_leaves_out_the_runs_warm_up_and_drift() -> None:
    """Eight slow warm-up steps, all timed, then every 4th step timed along a run whose steps
    grow 0.5 % a step: the medians blame the doctor for the warm-up; the neighbours see its 5 %
    (the layers' boundaries) and 20 % (also inside the layers, every 4th timed step)."""
    rows, timed_seen = [], 0
    for i in range(96):
        on = i < 8 or i % 4 == 2
        base = 0.050 if i < 8 else 0.010 * 1.005**i
        detail = on and timed_seen % 4 == 0
        timed_seen += on
        cost = (1.20 if detail else 1.05) if on and i >= 8 else 1.0
        rows.append({"index": i, "phase": "decode", "decode_tokens": 1, "total_tokens": 1, "decode_reqs": 1,
                     "step_s": base * cost, "layers_timed": on, "layers_detail": detail})  # fmt: skip
    decode = phase_summary(StepTable.of({"steps": rows, "clock": "cuda_events"}))["decode"]
    assert decode.timing_cost is not None and decode.timing_cost > 0.15  # the warm-up and the drift
    assert decode.neighbour_pairs == 23  # step 7 and the 22 timed steps after the warm-up
    assert decode.timed_vs_neighbours == pytest.approx(0.05, abs=0.01)
    assert decode.detail_vs_neighbours == pytest.approx(0.20, abs=0.01)
    text = timing_cost_text("decode", decode)
    assert "against their untimed neighbours +5.0 % (23 step(s); those also timed inside their layers +20.0 %)" in text


def test_no_percentage_of_the_timing_cost_from_too_few_steps() -> None:
    """One timed step beside one untimed step (a prefill of one step and its neighbour): no
    "+5267.7 %" from a single pair, the text says there are too few steps to tell."""
    prefill = phase_summary(_steps(1, 1))["decode"]
    assert prefill.too_few_to_tell and prefill.timing_cost is None
    assert prefill.timed_vs_neighbours is None and prefill.neighbour_pairs == 1
    text = timing_cost_text("prefill", prefill)
    assert text.startswith("prefill: 1 step(s) timed per layer, 1 not: too few steps to tell") and "%" not in text
    # enough of each kind, too few pairs side by side: the medians, and no neighbours' percentage
    spread = phase_summary(_steps(5, 6))["decode"]
    assert spread.neighbour_pairs == 1 and spread.timed_vs_neighbours is None
    assert "(1 timed step(s) next to an untimed one: too few to tell them apart)" in timing_cost_text("decode", spread)


def test_the_text_the_html_and_view_name_the_per_layer_timings_cost() -> None:
    w = WorkerFacts(rank=0, parts={"profile": {"profiling": True, "clock": "cuda_events", "layers_on": True,
                                               "steps": _steps(6, 6, interleaved=True).rows()}})  # fmt: skip
    profile = summarize(EngineFacts(workers=[w]))
    line = ("decode: steps timed per layer 17.60 ms median vs 13.90 ms untimed (+27 %); against their untimed "
            "neighbours +26.6 % (6 step(s)): the doctor's per-layer timing")
    text = render_profile(profile)
    assert f"  timing cost   {line}" in text.splitlines()
    assert "forward 15.00 ms of 17.60 ms steps (85%)" in text
    data = {"target": "/m", "findings": [], "profiles": {"engine": profile.to_json()}}
    report = read_report(data)
    html = render_html(report)
    assert line.replace("'", "&#x27;") in html and "<td>15.00 ms</td><td>17.60 ms</td>" in html
    assert line in sec.steps_summary(report, sec.engine_profile(report))
    row = sec.phase_rows(sec.engine_profile(report))[0]
    assert row[sec.PHASE_COLUMNS.index("forward mean")] == "15.00 ms"
    assert row[sec.PHASE_COLUMNS.index("its steps' mean")] == "17.60 ms"
    # report.json carries both medians per phase
    decode = data["profiles"]["engine"]["phases"]["decode"]
    assert (decode["timed_step_s_median"], decode["untimed_step_s_median"]) == (0.0176, 0.0139)
