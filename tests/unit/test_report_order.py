"""A report lists its findings the most severe first (issue 47 item 11): the terminal's text,
the JSON (then by code, stable) and the exit code's list."""

from __future__ import annotations

from vllm_doctor.model import Finding, Outcome, Report, Severity
from vllm_doctor.report.text import render


def _report() -> Report:
    return Report(
        target="/m",
        findings=[
            Finding("VD103", Outcome.WARN, Severity.INFO, "info problem"),
            Finding("VD104", Outcome.WARN, Severity.WARN, "a warning"),
            Finding("VD102", Outcome.PASS, Severity.ERROR, "fine"),
            Finding("VD205", Outcome.FAIL, Severity.ERROR, "an error", subject="b"),
            Finding("VD205", Outcome.FAIL, Severity.ERROR, "an error", subject="a"),
            Finding("VD101", Outcome.WARN, Severity.WARN, "an earlier warning"),
        ],
    )


def test_the_text_report_prints_errors_before_warnings_before_info() -> None:
    text = render(_report())
    heads = [line.split()[1] for line in text.splitlines() if line.startswith(("FAIL", "WARN"))]
    assert heads == ["VD205", "VD205", "VD101", "VD104", "VD103"]
    assert text.index("[error]") < text.index("[warn]") < text.index("[info]")


def test_the_json_is_ordered_by_severity_then_code_then_subject_and_stable() -> None:
    data = _report().to_dict()
    order = [(f["code"], f["subject"]) for f in data["findings"]]
    assert order == [("VD205", "a"), ("VD205", "b"), ("VD101", ""), ("VD104", ""), ("VD103", ""), ("VD102", "")]
    assert Report.from_dict(data).to_dict() == data


def test_merged_reports_and_the_exit_codes_list_keep_that_order() -> None:
    engine = Report(target="/m", findings=[Finding("VD501", Outcome.FAIL, Severity.ERROR, "no start")])
    merged = _report().merge(engine)
    assert [f.code for f in merged.findings[:3]] == ["VD205", "VD205", "VD501"]
    assert [f.code for f in merged.problems(Severity.WARN)] == ["VD205", "VD205", "VD501", "VD101", "VD104"]
