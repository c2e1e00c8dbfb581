"""``vllm-doctor view REPORT.json``: any report the doctor wrote, browsable in the terminal.

``ReportScreen(report)`` is a Textual screen over a report's JSON (the live app may push it), whose
sections and findings it reads into their records once (``report_sections.viewed`` and
``viewed_findings``);
``ViewApp(path)`` opens a file and shows that screen. Panes: findings (with each check's
explanation), engine anatomy, steps (prefill / decode, every step), per-layer time (sortable),
memory breakdown, KV cache. Keys: 1-6 panes, o layer order, ? help, q quit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.pilot import Pilot
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Sparkline, Static, TabbedContent, TabPane

from vllm_doctor.files import write_text_atomic
from vllm_doctor.tui import report_sections as sec
from vllm_doctor.tui.findings import FindingsPane
from vllm_doctor.tui.report_load import load_report

PANES = (
    ("findings", "Findings"),
    ("anatomy", "Anatomy"),
    ("steps", "Steps"),
    ("layers", "Layers"),
    ("memory", "Memory"),
    ("kv", "KV cache"),
)

HELP = """\
vllm-doctor view: keys
  1-6 / Tab     panes: findings, anatomy, steps, layers, memory, KV cache
  up/down       move in a table (findings: the details follow the highlighted row)
  o             layers: next order (total, prefill, decode, name, forward order); or click a column
  ?             this help        q  quit (closes the report when another view opened it)

where each number comes from (the report's JSON)
  Findings      findings[]: outcome, severity, code, subject, message, hint, evidence; the text below
                a finding is `vllm-doctor rule CODE` (the check's catalogue entry)
  Anatomy       facts.engine (which process holds the front end, engine core, workers, model, KV);
                facts (static checks: config.json, registry, plugins); environment; timings
  Steps         profiles.engine.phases: per phase, steps, tokens, mean batch, step time mean/p50/p90
                (step = the worker's execute_model + sample_tokens), forward mean; tok/s = tokens / sum
                of step times. profiles.engine.steps: every recorded step (CUDA events on GPU,
                wall clock on CPU; forward/logits only on sampled steps)
  Layers        profiles.engine.layers.modules: per module, calls and time in prefill / decode steps;
                share = total / layers.forward_total_s (the timed forwards)
  Memory        profiles.engine.memory: per worker, weights / KV cache / peak activations / CUDA
                graphs / other, of a total from NVML, torch's allocator or VmRSS (named on the line)
  KV cache      facts.engine.kv_cache (blocks, layout, bytes of the real tensors);
                profiles.engine.kv_usage: blocks in use after each step / the cache's blocks
"""


class HelpScreen(ModalScreen[None]):
    """The keys, and for each pane the part of the report its numbers come from."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 110; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "app.pop_screen", "close help"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP, id="help-text", markup=False)


class ReportScreen(Screen[None]):
    """One doctor report (``Report.to_dict()`` of any version): findings, anatomy, steps, layers, memory, KV."""

    # FindingsPane goes side by side at 120+ columns (Screen declares this as an instance attribute)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012
    DEFAULT_CSS = """
    ReportScreen #report-header { height: 1; background: $primary-darken-2; color: $text; padding: 0 1; }
    ReportScreen TabbedContent { height: 1fr; }
    ReportScreen TabPane { padding: 0; height: 1fr; }
    ReportScreen .section-note { padding: 0 1; height: auto; }
    ReportScreen #phases-table { height: auto; max-height: 6; }
    ReportScreen #steps-table, ReportScreen #layers-table { height: 1fr; }
    ReportScreen #kv-usage { height: 3; margin: 0 1; }
    ReportScreen VerticalScroll > Static { padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(str(i), f"show_pane('{pane}')", title, show=False) for i, (pane, title) in enumerate(PANES, 1)),
        Binding("o", "sort_layers", "layer order"),
        Binding("question_mark", "help", "help"),
        Binding("q", "close", "quit"),
        Binding("escape", "back", "back", show=False),
    ]

    def __init__(self, report: dict[str, Any], *, quit_app: bool = False) -> None:
        """``quit_app``: q quits the app (``vllm-doctor view``); otherwise q / escape return to the opener."""
        super().__init__()
        self.report = sec.viewed(report)  # its sections as records, read once
        self.findings = sec.viewed_findings(report)  # any doctor version's findings
        self.quit_app = quit_app
        self.profile = sec.engine_profile(self.report)
        self.layer_sort = sec.LAYER_SORTS[0]

    def compose(self) -> ComposeResult:
        yield Static(sec.header_line(self.report, self.findings), id="report-header", markup=False)
        with TabbedContent(initial="findings"):
            for i, (pane, title) in enumerate(PANES, 1):
                with TabPane(f"{i} {title}", id=pane):
                    yield from getattr(self, f"_compose_{pane}")()
        yield Footer()

    def _compose_findings(self) -> ComposeResult:
        yield FindingsPane(self.findings, id="findings-pane")

    @staticmethod
    def _text(text: str, widget_id: str) -> ComposeResult:
        with VerticalScroll():
            yield Static(text, id=widget_id, markup=False)

    def _compose_anatomy(self) -> ComposeResult:
        yield from self._text(sec.anatomy_text(self.report), "anatomy-text")

    def _compose_steps(self) -> ComposeResult:
        if not sec.phase_rows(self.profile):
            yield from self._text(sec.missing(self.report, "steps"), "steps-text")
            return
        with Vertical():
            yield Static(sec.steps_summary(self.report, self.profile), classes="section-note", markup=False)
            yield DataTable(id="phases-table", cursor_type="row")
            yield DataTable(id="steps-table", cursor_type="row", zebra_stripes=True)

    def _compose_layers(self) -> ComposeResult:
        if not sec.layer_rows(self.profile):
            yield from self._text(sec.missing(self.report, "per-layer time"), "layers-text")
            return
        with Vertical():
            yield Static(id="layers-summary", classes="section-note", markup=False)
            yield DataTable(id="layers-table", cursor_type="row", zebra_stripes=True)

    def _compose_memory(self) -> ComposeResult:
        yield from self._text(sec.memory_text(self.report), "memory-text")

    def _compose_kv(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(sec.kv_text(self.report), id="kv-text", markup=False)
            series = sec.kv_usage_series(self.report)
            if len(series) > 1:
                yield Static("usage per step (scaled from its lowest to its highest value):", classes="section-note")
                yield Sparkline(series, id="kv-usage")
            yield Static(sec.kv_findings_text(self.findings), id="kv-findings", markup=False)

    def on_mount(self) -> None:
        for table_id, columns, rows in (
            ("#phases-table", sec.PHASE_COLUMNS, sec.phase_rows(self.profile)),
            ("#steps-table", sec.STEP_COLUMNS, sec.step_rows(self.profile)),
        ):
            for table in self.query(table_id).results(DataTable):
                table.add_columns(*columns)
                table.add_rows(rows)
        for table in self.query("#layers-table").results(DataTable):
            for column in sec.LAYER_COLUMNS:
                table.add_column(column, key=column)
            self._fill_layers()
        self._focus_pane("findings")

    def _fill_layers(self) -> None:
        self.query_one("#layers-summary", Static).update(sec.layers_summary(self.profile, self.layer_sort))
        table = self.query_one("#layers-table", DataTable)
        table.clear()
        table.add_rows(sec.layer_rows(self.profile, self.layer_sort))

    def action_show_pane(self, pane: str) -> None:
        self.query_one(TabbedContent).active = pane
        self._focus_pane(pane)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id:
            self._focus_pane(event.pane.id)

    def _focus_pane(self, pane: str) -> None:
        """Arrow keys move in the pane's main table (or scroll its text), not along the tabs."""
        if self.query_one(TabbedContent).active != pane:  # a late event of another pane: focusing would switch
            return
        main = self.query(f"#{pane} DataTable, #{pane} VerticalScroll")
        if pane == "steps":
            main = self.query("#steps-table") or main
        if main:
            main.last().focus() if pane == "steps" else main.first().focus()

    def action_sort_layers(self) -> None:
        if not self.query("#layers-table"):
            self.notify("no per-layer table in this report")
            return
        self.layer_sort = sec.LAYER_SORTS[(sec.LAYER_SORTS.index(self.layer_sort) + 1) % len(sec.LAYER_SORTS)]
        self._fill_layers()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if event.data_table.id != "layers-table":
            return
        by_column = {"module": "name", "prefill": "prefill", "decode": "decode", "total": "total", "share": "total"}
        self.layer_sort = by_column.get(str(event.column_key.value), "forward order")
        self._fill_layers()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def action_close(self) -> None:
        if self.quit_app:
            self.app.exit()
        else:
            self.dismiss()

    def action_back(self) -> None:
        if not self.quit_app:
            self.dismiss()


class ViewApp(App[None]):
    """``vllm-doctor view PATH``. The report is read (and refused with a DoctorInputError) in ``__init__``,
    before anything is drawn."""

    TITLE = "vllm-doctor view"
    ENABLE_COMMAND_PALETTE = False

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.report = load_report(self.path)

    def on_mount(self) -> None:
        self.push_screen(ReportScreen(self.report, quit_app=True))


async def capture(pilot: Pilot[Any], pane: str = "findings", title: str | None = None) -> str:
    """Show ``pane`` of the app's ReportScreen, let it settle, and return the screen as SVG."""
    await pilot.pause()  # the app pushes its ReportScreen on mount
    screen = pilot.app.screen
    if isinstance(screen, ReportScreen):
        screen.action_show_pane(pane)
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()
    return pilot.app.export_screenshot(title=title)


def screenshot(app: ViewApp, path: str | Path, size: tuple[int, int], pane: str = "findings") -> None:
    """Run ``app`` headless at ``size``, show ``pane``, write the screen as SVG (atomically) and exit."""
    shot: list[str] = []

    async def take(pilot: Pilot[Any]) -> None:
        shot.append(await capture(pilot, pane, title=f"vllm-doctor view {app.path.name}"))
        pilot.app.exit()

    app.animation_level = "none"
    app.run(headless=True, size=size, auto_pilot=take)
    write_text_atomic(Path(path), shot[0])
