"""``vllm-doctor view`` on committed reports: Pilot-driven panes and keys, SVG snapshots, bad input.

tests/fixtures/reports/: ``profile_tiny.json`` (``vllm-doctor profile`` of the example model,
paths replaced, the per-step trace dropped), ``check_broken.json`` (``check --json`` of the
registered-under-model-type example), ``older_minimal.json`` (a report with most sections
missing and a code this doctor does not know), ``attach_served.json`` (``attach`` of a served
engine with traffic), ``check_engine.json`` (``check --engine --json``). The same panes on freshly made reports:
tests/integration/test_view_reports.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static, TabbedContent

from tests.conftest import run_doctor
from tests.fixtures.tui import assert_matches_snapshot, drive, text_of
from vllm_doctor.checks import CATALOGUE
from vllm_doctor.cli import main
from vllm_doctor.report.rule import render_rule
from vllm_doctor.tui.findings import FindingsPane, shown
from vllm_doctor.tui.report_load import why_not_a_report
from vllm_doctor.tui.report_view import HelpScreen, ReportScreen, ViewApp, capture

REPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "reports"
PROFILE, BROKEN, OLDER = REPORTS / "profile_tiny.json", REPORTS / "check_broken.json", REPORTS / "older_minimal.json"
# also attach_served.json (`attach` of a served engine) and check_engine.json (`check --engine --json`)


PANES = ("anatomy", "steps", "layers", "memory", "kv", "findings")


def table_column(app: Any, selector: str, column: int) -> list[str]:
    table = app.screen.query_one(selector, DataTable)
    return [str(table.get_row_at(i)[column]) for i in range(table.row_count)]


def test_findings_problems_first_and_the_highlighted_one_explained() -> None:
    app = ViewApp(BROKEN)

    async def script(pilot: Any) -> tuple[list[str], str, str]:
        codes = table_column(pilot.app, "#findings-table", 2)
        first = text_of(pilot.app, "#finding-detail")
        await pilot.press("down")
        return codes, first, text_of(pilot.app, "#finding-detail")

    codes, first, second = drive(app, (80, 24), script)
    report = json.loads(BROKEN.read_text())
    assert len(codes) == len(report["findings"])
    assert codes[:2] == ["VD101", "VD103"]  # the two failures, before 29 passes / skips / n/a
    assert first.startswith("FAIL  VD101 architecture-not-registered [error]")
    assert render_rule(CATALOGUE["VD101"].meta) in first  # exactly `vllm-doctor rule VD101`
    assert second.startswith("FAIL  VD103 registered-under-wrong-name [error]")
    vd103 = next(f for f in report["findings"] if f["code"] == "VD103")
    assert f"fix: {vd103['hint']}" in second and render_rule(CATALOGUE["VD103"].meta) in second


def test_number_keys_switch_panes_and_each_pane_shows_its_section() -> None:
    app = ViewApp(PROFILE)
    report = json.loads(PROFILE.read_text())
    engine = report["profiles"]["engine"]

    async def script(pilot: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key in "234561":
            await pilot.press(key)
            seen.setdefault("active", []).append(pilot.app.screen.query_one(TabbedContent).active)
        seen["anatomy_text"] = text_of(pilot.app, "#anatomy-text")
        seen["phases"] = table_column(pilot.app, "#phases-table", 0)
        seen["steps"] = table_column(pilot.app, "#steps-table", 1)
        seen["memory"] = text_of(pilot.app, "#memory-text")
        seen["kv"] = text_of(pilot.app, "#kv-text")
        return seen

    seen = drive(app, (160, 48), script)
    assert seen["active"] == list(PANES)
    assert "engine core   pid" in seen["anatomy_text"] and "TinyDoctorForCausalLM [plugin]" in seen["anatomy_text"]
    assert seen["phases"] == ["prefill", "decode"]
    assert seen["steps"] == [s["phase"] for s in engine["steps"]]
    assert "rank 0 (cpu): 735.25 MiB in all, from worker process resident memory (VmRSS)" in seen["memory"]
    assert "kv cache            64.00 MiB" in seen["memory"] and "NVML: unavailable" in seen["memory"]
    assert "blocks        1024 x 128 tokens = 131072 tokens" in seen["kv"]


def test_layers_sort_by_total_then_prefill_then_name_and_by_column_click() -> None:
    app = ViewApp(PROFILE)
    modules = json.loads(PROFILE.read_text())["profiles"]["engine"]["layers"]["modules"]

    async def script(pilot: Any) -> list[list[str]]:
        await pilot.press("4")
        orders = [table_column(pilot.app, "#layers-table", 0)]
        for _ in range(3):  # prefill, decode, name
            await pilot.press("o")
            orders.append(table_column(pilot.app, "#layers-table", 0))
        table = pilot.app.screen.query_one("#layers-table", DataTable)
        table.post_message(DataTable.HeaderSelected(table, table.columns["total"].key, 7, table.columns["total"].label))
        await pilot.pause()
        orders.append(table_column(pilot.app, "#layers-table", 0))
        orders.append([text_of(pilot.app, "#layers-summary")])
        return orders

    by_total, by_prefill, by_decode, by_name, clicked, summary = drive(app, (80, 24), script)
    assert by_total == [m["name"] for m in sorted(modules, key=lambda m: -m["total_s"])]
    assert by_prefill == [m["name"] for m in sorted(modules, key=lambda m: -m["prefill_s"])]
    assert by_decode == [m["name"] for m in sorted(modules, key=lambda m: -m["decode_s"])]
    assert by_name == sorted(m["name"] for m in modules)
    assert clicked == by_total and "sorted by total" in summary[0]


def test_a_static_check_report_says_what_is_not_in_it() -> None:
    app = ViewApp(BROKEN)

    async def script(pilot: Any) -> list[str]:
        return [text_of(pilot.app, s) for s in ("#steps-text", "#layers-text", "#memory-text", "#kv-text", "#anatomy-text")]

    steps, layers, memory, kv, anatomy = drive(app, (80, 24), script)
    for text in (steps, layers, memory, kv):
        assert "not in this report (no engine ran for it; `vllm-doctor check DIR --engine`" in text
    assert "resolves to" not in anatomy and "plugin        tiny_doctor (tiny-doctor-registered-under-model-type)" in anatomy


@pytest.mark.parametrize(
    ("name", "anatomy_line"),
    [("attach_served.json", "front end     API server at http://127.0.0.1:18734 (vLLM 0.32.0), serving"),
     ("check_engine.json", "engine core   pid 3956 (in the front end's process)")],
)  # fmt: skip
def test_attach_and_check_engine_reports_fill_every_pane(name: str, anatomy_line: str) -> None:
    report = json.loads((REPORTS / name).read_text())

    async def script(pilot: Any) -> list[Any]:
        texts = [text_of(pilot.app, s) for s in ("#anatomy-text", "#memory-text", "#kv-text")]
        return [*texts, table_column(pilot.app, "#steps-table", 0), table_column(pilot.app, "#layers-table", 0)]

    anatomy, memory, kv, steps, layers = drive(ViewApp(REPORTS / name), (100, 30), script)
    engine = report["profiles"]["engine"]
    assert anatomy_line in anatomy and "not in this report" not in memory + kv
    assert steps == [str(s["index"]) for s in engine["steps"]] and len(layers) == len(engine["layers"]["modules"])


def test_an_older_report_with_missing_sections_and_an_unknown_code_opens() -> None:
    app = ViewApp(OLDER)

    async def script(pilot: Any) -> list[str]:
        out = [text_of(pilot.app, "#finding-detail")]
        await pilot.press("down")
        out.append(text_of(pilot.app, "#finding-detail"))
        out += [text_of(pilot.app, s) for s in ("#steps-text", "#memory-text", "#kv-findings")]
        out.append(str(pilot.app.screen.query_one("#report-header").content))
        return out

    vd101, vd777, steps, memory, kv_findings, header = drive(app, (80, 24), script)
    assert vd101.startswith("FAIL  VD101") and render_rule(CATALOGUE["VD101"].meta) in vd101
    assert "VD777: not in this doctor's catalogue" in vd777 and vd777.startswith("retired VD777 [warn]")
    assert "steps: not in this report" in steps and "memory breakdown: not in this report" in memory
    assert "KV findings (VD501, VD502, VD504): not in this report" in kv_findings
    # counted from its findings (it has no summary), the retired outcome as written
    assert header.startswith("1 fail, 1 retired  |  /models/from-an-older-doctor  |  vLLM ?")


def test_resize_to_80x24_stacks_the_findings_and_160x48_puts_them_side_by_side() -> None:
    app = ViewApp(PROFILE)

    async def script(pilot: Any) -> list[tuple[Any, ...]]:
        out = []
        for size in ((160, 48), (80, 24)):
            await pilot.resize_terminal(*size)
            await pilot.pause()
            table = pilot.app.screen.query_one("#findings-table").region
            detail = pilot.app.screen.query_one("#finding-detail-scroll", VerticalScroll).region
            out.append((pilot.app.screen.has_class("-wide"), table, detail, pilot.app.screen.region))
        return out

    (wide, t_wide, d_wide, _), (narrow_wide, t_narrow, d_narrow, s_narrow) = drive(app, (120, 40), script)
    assert wide and d_wide.x >= t_wide.right and d_wide.y == t_wide.y  # beside
    assert not narrow_wide and d_narrow.y >= t_narrow.bottom and t_narrow.width <= 80  # below
    assert t_narrow.height >= 4 and d_narrow.height >= 4 and s_narrow.size == (80, 24)


def test_help_opens_and_closes_and_q_quits() -> None:
    app = ViewApp(PROFILE)

    async def script(pilot: Any) -> list[Any]:
        await pilot.press("question_mark")
        shown = isinstance(pilot.app.screen, HelpScreen), text_of(pilot.app, "#help-text")
        await pilot.press("escape")
        back = isinstance(pilot.app.screen, ReportScreen)
        await pilot.press("q")
        await pilot.pause()
        return [*shown, back, pilot.app.is_running]

    is_help, help_text, back, running = drive(app, (80, 24), script)
    assert is_help and back and not running
    assert "profiles.engine.layers.modules" in help_text and "`vllm-doctor rule CODE`" in help_text


def test_another_app_pushes_the_report_screen_and_q_returns_to_it() -> None:
    report = json.loads(PROFILE.read_text())

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield Static("the live view", id="host")

    async def script(pilot: Any) -> list[Any]:
        pilot.app.push_screen(ReportScreen(report))
        await pilot.pause()
        opened = isinstance(pilot.app.screen, ReportScreen), text_of(pilot.app, "#finding-detail")[:5]
        await pilot.press("q")
        await pilot.pause()
        return [*opened, pilot.app.is_running, str(pilot.app.screen.query_one("#host", Static).content)]

    is_report, detail, running, host = drive(Host(), (80, 24), script)
    assert is_report and detail == "ok   " and running and host == "the live view"


def test_findings_pane_refreshes_and_keeps_the_highlighted_code() -> None:
    report = json.loads(BROKEN.read_text())

    async def script(pilot: Any) -> tuple[str, str, int]:
        pane = pilot.app.screen.query_one(FindingsPane)
        await pilot.press("down")  # VD103
        pane.update_findings(shown(f for f in report["findings"] if f["code"] != "VD101"))
        await pilot.pause()
        return pane.selected.code, text_of(pilot.app, "#finding-detail"), pilot.app.screen.query_one(DataTable).row_count

    code, detail, rows = drive(ViewApp(BROKEN), (80, 24), script)
    assert code == "VD103" and detail.startswith("FAIL  VD103") and rows == len(report["findings"]) - 1


@pytest.mark.parametrize(
    ("report", "pane", "size"),
    [(BROKEN, "findings", (80, 24)), (PROFILE, "findings", (160, 48)), (PROFILE, "layers", (80, 24)),
     (PROFILE, "memory", (160, 48))],
    ids=["check-findings-80x24", "profile-findings-160x48", "profile-layers-80x24", "profile-memory-160x48"],
)  # fmt: skip
def test_screen_snapshots(report: Path, pane: str, size: tuple[int, int]) -> None:
    svg = drive(ViewApp(report), size, lambda pilot: capture(pilot, pane, title=f"vllm-doctor view {report.name}"))
    assert_matches_snapshot(svg, f"view-{report.stem}-{pane}-{size[0]}x{size[1]}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"\xff\xfe not text", "not UTF-8 text (byte 0)"),
        (b'{"target": "x", "findings": [', "not JSON (Expecting value at line 1 column 30)"),
        (b'{"metrics": [1, 2]}', 'not a vllm-doctor report (no "target" and "findings")'),
        (b'{"tool": "vllmstat", "target": "x", "findings": []}', "not a vllm-doctor report (its \"tool\" is 'vllmstat')"),
        (b'{"target": "x", "findings": [{"outcome": "fail"}]}', "not a vllm-doctor report (findings[0] has no code)"),
        (b"[]", "not a vllm-doctor report (the top level is a JSON list, not an object)"),
    ],
    ids=["missing", "binary", "truncated-json", "other-json", "other-tool", "finding-without-code", "list"],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_bytes(content)
    assert main(["view", str(path)]) == 2  # the CLI's own entry point, in this process
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"vllm-doctor: error: {path}: {message}"
    assert err.splitlines()[1].startswith("  hint: give a report the doctor wrote") and len(err.splitlines()) == 2
    assert out == ""


def test_bad_input_from_the_console_script_has_no_traceback(tmp_path: Path) -> None:
    proc = run_doctor(["view", str(tmp_path / "nothing.json")], timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[0] == f"vllm-doctor: error: {tmp_path / 'nothing.json'}: no such file"
    assert "Traceback" not in proc.stderr


def test_view_screenshot_of_a_report_directory(tmp_path: Path) -> None:
    (tmp_path / "prof").mkdir()
    (tmp_path / "prof" / "report.json").write_text(PROFILE.read_text())
    proc = run_doctor(["view", str(tmp_path / "prof"), "--screenshot", str(tmp_path / "s.svg"), "--pane", "kv",
                       "--size", "100x30"], timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    svg = (tmp_path / "s.svg").read_text()
    assert svg.startswith("<svg") and "KV&#160;findings" in svg and "1024&#160;x&#160;128&#160;tokens" in svg


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--size", "80by24"], "--size '80by24': expected COLSxROWS, e.g. 160x48"),
     (["--size", "8x2"], "--size 8x2: columns 40-1000, rows 10-1000"),
     (["--screenshot", "{tmp}/a-file/s.svg"], "--screenshot {tmp}/a-file/s.svg: cannot write it")],
)  # fmt: skip
def test_bad_screenshot_options_are_input_errors(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("a file, not a directory")
    argv = ["view", str(PROFILE), *(a.format(tmp=tmp_path) for a in args)]
    if "--screenshot" not in args:
        argv += ["--screenshot", str(tmp_path / "unused.svg")]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"vllm-doctor: error: {message.format(tmp=tmp_path)}")
    assert not (tmp_path / "unused.svg").exists()


def test_why_not_a_report_accepts_every_committed_report() -> None:
    for path in sorted(REPORTS.glob("*.json")):
        assert why_not_a_report(json.loads(path.read_text())) == ""
