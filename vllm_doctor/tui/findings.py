"""FindingsPane: the findings of a report (or a live run) as a table, and the highlighted one in full.

The details are the CLI's own rendering (``report.text.finding_lines``), the evidence, and the
check's explanation exactly as ``vllm-doctor rule CODE`` prints it (``report.rule.render_rule``).
Reusable: ``FindingsPane(findings)`` and ``update_findings(findings)`` take :class:`ShownFinding`
records: ``ShownFinding.of(finding)`` for the doctor's own, ``ShownFinding.read(json)`` for a
report.json's entry written by any version of the doctor.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import DataTable, Static

from vllm_doctor.checks import CATALOGUE
from vllm_doctor.report.rule import render_rule
from vllm_doctor.report.text import finding_lines
from vllm_doctor.tui.report_sections import ShownFinding, shown
from vllm_doctor.units import clip

__all__ = ["FindingsPane", "ShownFinding", "finding_detail", "ordered", "shown"]

PROBLEMS = ("crash", "fail", "warn")
MARKS = {"fail": "FAIL", "warn": "WARN", "crash": "CRASH", "pass": "ok", "skip": "skip", "not_applicable": "n/a"}
STYLES = {
    "fail": "bold red",
    "crash": "bold red",
    "warn": "bold yellow",
    "pass": "green",
    "skip": "dim",
    "not_applicable": "dim",
}
SEVERITY_ORDER = {"error": 0, "warn": 1, "info": 2}
OUTCOME_ORDER = {"crash": 0, "fail": 1, "warn": 2, "skip": 3, "pass": 4, "not_applicable": 5}
EVIDENCE_LINES = 60


def ordered(findings: Iterable[ShownFinding]) -> list[ShownFinding]:
    """Problems first (crash, fail, warn; errors before warnings), then skips, passes, n/a; stable by code."""
    return sorted(
        findings,
        key=lambda f: (OUTCOME_ORDER.get(f.outcome, 6), SEVERITY_ORDER.get(f.severity, 3), f.code),
    )


def rule_text(code: str) -> str:
    entry = CATALOGUE.get(code)
    if entry is None:
        return f"{code}: not in this doctor's catalogue (the report may come from another version of vllm-doctor)"
    return render_rule(entry.meta)


def finding_detail(f: ShownFinding) -> str:
    """The finding as the CLI prints it (all of it), its evidence, then its check's explanation."""
    if f.finding is not None:
        lines = finding_lines(f.finding, verbose=True)
    else:  # a finding of another doctor version: show what is there
        lines = [f"{f.outcome} {f.code} [{f.severity}]", f"      {f.message}"]
        lines += [f"      at: {f.subject}"] if f.subject else []
        lines += [f"      fix: {f.hint}"] if f.hint else []
    evidence = {k: v for k, v in f.evidence.items() if k != "traceback"}
    if evidence:
        dumped = json.dumps(evidence, indent=2, default=str).splitlines()
        more = len(dumped) - EVIDENCE_LINES
        lines += ["", "evidence"] + ["  " + line for line in dumped[:EVIDENCE_LINES]]
        lines += [f"  ... {more} more line(s) in the report's JSON"] if more > 0 else []
    return "\n".join(lines) + "\n\n" + rule_text(f.code)


class FindingsPane(Widget):
    """The findings table (problems first) and, below or beside it, the highlighted finding in full."""

    # stacked on a narrow terminal; side by side where the screen has the "-wide" breakpoint class
    SCOPED_CSS = False
    DEFAULT_CSS = """
    FindingsPane { layout: vertical; height: 1fr; }
    FindingsPane > DataTable { height: 2fr; min-height: 4; }
    FindingsPane > #finding-detail-scroll { height: 3fr; border-top: solid $primary-darken-2; }
    .-wide FindingsPane { layout: horizontal; }
    .-wide FindingsPane > DataTable { height: 1fr; width: 3fr; }
    .-wide FindingsPane > #finding-detail-scroll {
        height: 1fr; width: 2fr; border-top: none; border-left: solid $primary-darken-2;
    }
    """

    def __init__(self, findings: Sequence[ShownFinding], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.findings = ordered(findings)

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="findings-table", cursor_type="row", zebra_stripes=True)
        yield table
        with VerticalScroll(id="finding-detail-scroll"):
            yield Static(id="finding-detail", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#findings-table", DataTable)
        table.add_columns("", "severity", "code", "name", "message", "subject")
        self.update_findings(self.findings)

    def update_findings(self, findings: Sequence[ShownFinding]) -> None:
        """Show another list of findings (a live view refreshes them); the highlighted code stays highlighted."""
        table = self.query_one("#findings-table", DataTable)
        keep = self.selected.code if self.findings and table.row_count else None
        self.findings = ordered(findings)
        table.clear()
        for i, f in enumerate(self.findings):
            meta = CATALOGUE.get(f.code)
            table.add_row(
                Text(MARKS.get(f.outcome, f.outcome), style=STYLES.get(f.outcome, "")),
                f.severity,
                f.code,
                meta.meta.name if meta else "",
                clip(f.message.splitlines()[0] if f.message else "", 120),
                clip(f.subject, 48),
                key=str(i),
            )
        codes = [f.code for f in self.findings]
        if keep in codes:
            table.move_cursor(row=codes.index(keep))
        self._show(table.cursor_row)

    @property
    def selected(self) -> ShownFinding:
        row = self.query_one("#findings-table", DataTable).cursor_row
        return self.findings[min(max(row, 0), len(self.findings) - 1)]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._show(event.cursor_row)

    def _show(self, row: int) -> None:
        detail = self.query_one("#finding-detail", Static)
        if not self.findings:
            detail.update("no findings in this report")
            return
        detail.update(finding_detail(self.findings[min(max(row, 0), len(self.findings) - 1)]))
        self.query_one("#finding-detail-scroll", VerticalScroll).scroll_home(animate=False)
