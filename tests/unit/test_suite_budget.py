"""tools/suite_budget.py: the summary `make test` prints at its end (issue 46, Budget), read from junit XML
files and ``SECONDS EXIT`` files written here (pure data), and the Makefile stream that writes them.

Nothing here measures a time: the seconds are the files' (tests never assert wall-clock times).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_suite_budget() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_budget", REPO / "tools" / "suite_budget.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["suite_budget"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sb = load_suite_budget()


def junit(cases: list[tuple[str, str, float, str]], xunit1: bool = True) -> str:
    """A pytest junit XML: (module path without .py[.Class], test name, seconds, outcome) per test."""
    rows = []
    for module, name, seconds, outcome in cases:
        file = f' file="{module.split(".")[0]}.py" line="3"' if xunit1 else ""
        inner = {"passed": "", "failed": '<failure message="assert 1 == 2">boom</failure>',
                 "error": '<error message="fixture">boom</error>', "skipped": '<skipped type="pytest.skip" message="no">x</skipped>'}[outcome]
        classname = module.replace("/", ".")
        rows.append(f'<testcase classname="{classname}" name="{name}"{file} time="{seconds:.3f}">{inner}</testcase>')
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="0" '
            f'failures="0" skipped="0" tests="{len(rows)}" time="99.5">' + "".join(rows) + "</testsuite></testsuites>")


def write_stream(run: Path, name: str, cases: list[tuple[str, str, float, str]] | None, time: str | None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    if cases is not None:
        (run / f"{name}.xml").write_text(junit(cases), encoding="utf-8")
    if time is not None:
        (run / f"{name}.time").write_text(time, encoding="utf-8")


def summary_lines(capsys: pytest.CaptureFixture[str], run: Path, seconds: str) -> list[str]:
    assert sb.main(["make-test", "--run", str(run), "--seconds", seconds, "--streams", "engine", "rest"]) == 0
    out = capsys.readouterr().out
    assert (run / "summary.txt").read_text(encoding="utf-8") == out
    return out.splitlines()


def slowest_rows(lines: list[str]) -> list[tuple[float, str, str]]:
    start = next(i for i, line in enumerate(lines) if line.startswith("== the 15 slowest tests of all streams"))
    rows = []
    for line in lines[start + 1 :]:
        seconds, stream, test = re.fullmatch(r"\s+([\d.]+) s  (\S+)\s+(\S+)", line).groups()  # type: ignore[union-attr]
        rows.append((float(seconds), stream, test))
    return rows


def test_the_15_slowest_tests_of_both_streams_in_one_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    engine = [("tests/engine/test_e", f"test_{i}", 100.0 + 10 * i, "passed") for i in range(10)]  # 100..190 s
    engine[3] = ("tests/engine/test_e.TestServed", "test_3[eager]", 130.0, "failed")  # a class and a parameter
    rest = [("tests/integration/test_r", f"test_{i}", 95.0 + 10 * i, "passed") for i in range(10)]  # 95..185 s
    write_stream(tmp_path, "engine", engine, "3240 1\n")
    write_stream(tmp_path, "rest", rest, "2280 0\n")

    rows = slowest_rows(summary_lines(capsys, tmp_path, "3300"))

    assert len(rows) == 15
    assert [s for s, _, _ in rows] == sorted((s for s, _, _ in rows), reverse=True)
    assert rows[:3] == [(190.0, "engine", "tests/engine/test_e.py::test_9"),
                        (185.0, "rest", "tests/integration/test_r.py::test_9"),
                        (180.0, "engine", "tests/engine/test_e.py::test_8")]
    assert (130.0, "engine", "tests/engine/test_e.py::TestServed::test_3[eager]") in rows
    # the five fastest (100, 95, 105, 110, 115 s) are left out, and nothing else
    assert min(s for s, _, _ in rows) == 120.0 and {st for _, st, _ in rows} == {"engine", "rest"}


def test_whole_run_and_each_stream_against_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_stream(tmp_path, "engine", [("tests/engine/test_e", "test_a", 60.0, "passed"), ("tests/engine/test_e", "test_b", 1.0, "failed")], "3240 1\n")
    write_stream(tmp_path, "rest", [("tests/unit/test_u", "test_a", 1.0, "passed"), ("tests/unit/test_u", "test_b", 0.0, "skipped")], "2280 0\n")

    lines = summary_lines(capsys, tmp_path, "3300")

    assert lines[1] == "  whole run: 55 min 00 s, budget 25 min: over by 30 min"
    assert lines[2] == "  engine stream: 54 min 00 s, budget 25 min: over by 29 min (exit 1; 1 passed, 1 failed)"
    assert lines[3] == "  rest stream: 38 min 00 s, budget 25 min: over by 13 min (exit 0; 1 passed, 1 skipped)"


def test_a_loaded_round_says_its_times_without_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """make test-engine-loaded: beside busy loops on purpose, so no "over by" that means nothing."""
    write_stream(tmp_path, "engine-a", [("tests/engine/test_e", "test_a", 60.0, "passed")], "2208 0\n")
    write_stream(tmp_path, "engine-b", [("tests/engine/test_f", "test_b", 9.0, "skipped")], "1604 0\n")

    assert sb.main(["make-test", "--run", str(tmp_path), "--seconds", "2208", "--streams", "engine-a", "engine-b",
                    "--loaded"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()

    assert lines[0].startswith("== a round beside two busy loops") and "no budget" in lines[0]
    assert lines[1:4] == ["  whole run: 36 min 48 s", "  engine-a stream: 36 min 48 s (exit 0; 1 passed)",
                          "  engine-b stream: 26 min 44 s (exit 0; 1 skipped)"]  # fmt: skip
    assert not any("budget 25 min" in line for line in lines)


@pytest.mark.parametrize(("seconds", "words"), [
    (0, "within (25 min to spare)"),
    (24 * 60 + 59, "within (0 min to spare)"),
    (25 * 60, "within (0 min to spare)"),
    (25 * 60 + 1, "over by 1 min"),  # a second over is a minute over
    (54 * 60, "over by 29 min"),
])
def test_within_or_over_by(seconds: int, words: str) -> None:
    assert sb.verdict(seconds, 25) == words


def test_total_prints_one_line_against_that_commands_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert sb.main(["total", ".ci/run", "4162"]) == 0
    assert sb.main(["total", ".ci/run", "2999"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        ".ci/run: 69 min 22 s, budget 50 min: over by 20 min",
        ".ci/run: 49 min 59 s, budget 50 min: within (0 min to spare)",
    ]


def test_a_crashed_stream_is_named_and_the_other_still_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine stream died: pytest left no junit XML, the Makefile still wrote its time and exit status."""
    write_stream(tmp_path, "engine", None, "610 139\n")
    write_stream(tmp_path, "rest", [("tests/unit/test_u", "test_a", 2.5, "passed")], "900 0\n")

    lines = summary_lines(capsys, tmp_path, "1000")

    assert lines[2] == "  engine stream: 10 min 10 s, budget 25 min: within (14 min to spare) (exit 139)"
    assert lines[3] == f"    no junit XML ({tmp_path / 'engine.xml'}): the stream crashed, was stopped, or did not run"
    assert slowest_rows(lines) == [(2.5, "rest", "tests/unit/test_u.py::test_a")]


def test_a_cut_xml_and_a_stream_that_never_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """make was stopped: one stream's XML cut mid-write and no .time; the other left nothing (lint failed first
    looks the same for both)."""
    tmp_path.joinpath("engine.xml").write_text(junit([("tests/engine/test_e", "test_a", 5.0, "passed")])[:150], encoding="utf-8")

    lines = summary_lines(capsys, tmp_path, "120")

    assert lines[1] == "  whole run: 2 min 00 s, budget 25 min: within (23 min to spare)"
    assert lines[2] == "  engine stream: no wall time recorded"
    assert lines[3] == "    no engine.time: the stream did not finish (its wall time is pytest's, if any)"
    assert lines[4].startswith(f"    unreadable junit XML ({tmp_path / 'engine.xml'}: ")
    assert lines[5] == "  rest stream: no wall time recorded"
    assert lines[6] == f"    did not run, or was stopped (no {tmp_path / 'rest.time'}, no {tmp_path / 'rest.xml'})"
    assert lines[-1] == "  (no test times: no stream left a readable junit XML)"


def test_without_a_time_file_the_streams_time_is_pytests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_stream(tmp_path, "rest", [("tests/unit/test_u", "test_a", 2.5, "passed")], None)
    lines = summary_lines(capsys, tmp_path, "120")
    assert lines[-4] == "  rest stream: 1 min 40 s, budget 25 min: within (23 min to spare) (1 passed)"  # the XML's 99.5 s


def test_an_xunit2_file_names_tests_by_the_files_under_the_root(tmp_path: Path) -> None:
    """Without xunit1's file attribute the dotted classname is matched against files: module, class, test."""
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_u.py").write_text("", encoding="utf-8")
    xml = junit([("tests/unit/test_u.TestK", "test_a[1]", 1.0, "passed"), ("gone/test_g", "test_b", 1.0, "passed")], xunit1=False)
    (tmp_path / "rest.xml").write_text(xml, encoding="utf-8")
    stream = sb.read_stream(tmp_path, "rest", root=tmp_path)
    assert sorted(t.test_id for t in stream.tests) == ["gone.test_g::test_b", "tests/unit/test_u.py::TestK::test_a[1]"]


def test_docs_name_the_scripts_budgets() -> None:
    """docs/development.md's Budget table gives each budget tools/suite_budget.py holds, and no other."""
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    section = text.split("\n## Budget\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) min \|", section, re.M)
    assert {what: int(minutes) for what, minutes in rows} == sb.BUDGET_MIN


def test_a_make_stream_keeps_pytests_exit_status_and_leaves_its_files(tmp_path: Path) -> None:
    """The Makefile's stream recipe: a failing pytest leaves its junit XML and ``SECONDS 1``, and make
    exits non-zero; the summary reads them (BIN outside the checkout: make installs nothing)."""
    test_file = tmp_path / "test_two.py"
    test_file.write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n", encoding="utf-8")
    run = tmp_path / "run"
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "test-stream-rest", f"BIN={Path(sys.executable).parent}",
         f"TIERS={test_file}", f"TEST_RUN={run}", "PYTEST=" + f"{sys.executable} -m pytest -q -p no:cacheprovider --rootdir={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    seconds, exit_code = (run / "rest.time").read_text(encoding="utf-8").split()
    assert exit_code == "1" and int(seconds) >= 0
    stream = sb.read_stream(run, "rest", root=tmp_path)
    assert stream.counts == {"passed": 1, "failed": 1} and stream.problems == []
    assert sorted(t.test_id.rsplit("::", 1)[1] for t in stream.tests) == ["test_bad", "test_ok"]
