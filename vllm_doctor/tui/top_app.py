"""The ``top`` / ``replay`` app: a status bar and seven panels that draw :class:`Frame` s.

The source (live server or recording) is injected; a background thread polls it at the
interval and hands each frame to the UI thread; the widgets only draw, and only the lines
that changed. Small terminals (80x24) show the four engine panels, 100x30 the model panel
under them; 160x48 adds the devices and tall history charts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar, Self

from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, VerticalScroll
from textual.geometry import Region, Size
from textual.screen import ModalScreen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Footer, Static

from vllm_doctor.errors import DoctorInputError
from vllm_doctor.live.glossary import glossary
from vllm_doctor.live.record import Recorder
from vllm_doctor.live.sources import Frame, Source
from vllm_doctor.tui.panels import PANELS, chart_rows, history_key, history_panel, latency_panel
from vllm_doctor.units import clip

INTERVALS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
WINDOWS = (10.0, 30.0, 60.0, 300.0, 900.0)
SEEK_STEP = 10
SLOW_REPLY_S = 1.0  # a /metrics answer slower than this (and than the interval) is a SLOW badge


def behind_after(interval_s: float) -> float:
    """How old the frame on screen may get before the badge says BEHIND: two refreshes and a
    scrape's time-out (live/sources' 2 s), with a second to spare."""
    return 2 * interval_s + 3.0


class Panel(Widget):
    """One panel: a titled box that draws one part of a frame.

    Drawn through Textual's line API: each refresh compares the panel's new lines with the
    ones on screen and repaints only those that changed (a number that moved, a sparkline that
    shifted). Re-rendering whole panels was most of ``top``'s CPU.
    """

    def __init__(self, key: str) -> None:
        title, self.render_fn = PANELS[key]
        super().__init__(id=key, classes="panel")
        self.border_title = title
        self.key = key
        self._lines: list[Text] = []
        self._strips: list[Strip | None] = []  # the lines as drawn (cropped, styled); None: draw again
        self._strips_width = -1  # the width they were cropped to
        self._height = 0  # grows with the text, shrinks only on a new layout (no re-layout per frame)
        self._width = -1
        self._style: Style | None = None
        self._resolved: dict[str | Style, Style] = {}  # a span's style over the panel's style
        self._memo: object = None  # what the history panel was last drawn from
        # The panel's rows as the screen shows them (border, padding, content; Textual's line
        # filters applied). Content rows are built from the content line and the border cells
        # Textual drew for this panel, once that shortcut was checked equal to Textual's own row.
        self._rows: list[Strip | None] = []
        self._rows_size = Size(0, 0)
        # left and right cells, the padding's style, Textual's line filters, the panel's background
        self._edges: tuple[Strip, Strip, Style, list[Any], Any] | None = None
        self._content = Size(0, 0)
        self._own_rows = True  # False once a check found the shortcut unequal (then Textual draws every row)
        self._top = 0  # the rows above the content (border, padding)

    def draw(self, frame: Frame, zoomed: bool = False) -> None:
        content_width = self.content_size.width
        width = max(20, content_width or 36)
        if self.has_class("stale") != frame.metrics.stale:
            self.set_class(frame.metrics.stale, "stale")
        rows = chart_rows(self.content_size.height)
        if self.key == "history":  # its charts move once every few refreshes: most frames draw nothing
            memo = (history_key(frame, width), content_width, rows)
            if memo == self._memo:
                return
            self._memo = memo
        if self.key == "latency":
            text = latency_panel(frame, width, detail=zoomed)
        elif self.key == "history":  # as tall as the grid's last row (the panel fills it)
            text = history_panel(frame, width, rows)
        else:
            text = self.render_fn(frame, width)
        lines = split_lines(text)
        old = self._lines
        self._lines = lines
        if len(lines) > self._height or self._width != content_width:
            self._height = len(lines)
            self._width = content_width
            self._strips = [None] * self._height
            self.refresh(layout=True)
            return
        regions = []
        y = 0
        while y < self._height:  # one region per run of changed lines
            if _at(lines, y) == _at(old, y):
                y += 1
                continue
            start = y
            while y < self._height and _at(lines, y) != _at(old, y):
                self._strips[y] = None
                y += 1
            regions.append(Region(0, start, content_width, y - start))  # refresh() forgets those rows
        if regions:
            self.refresh(*regions)

    @property
    def plain(self) -> str:
        """What the panel shows, as plain text (tests, and anything that reads the screen)."""
        return "\n".join(line.plain for line in self._lines)

    def _segments(self, line: Text) -> list[Segment]:
        """The line's segments over the panel's style (its colour, greyed when stale).

        The panels' texts are built by appending, so their spans are in order and never
        overlap: one segment per span, with the styles resolved once per panel. Anything
        else goes through rich's general renderer.
        """
        base = self._style or Style()
        plain, out, pos = line.plain, [], 0
        for span in line.spans:
            if span.start < pos:
                line.style = base
                return list(line.render(self.app.console))
            if span.start > pos:
                out.append(Segment(plain[pos : span.start], base))
            style = self._resolved.get(span.style)
            if style is None:
                style = self._resolved[span.style] = base + self.app.console.get_style(span.style)
            out.append(Segment(plain[span.start : span.end], style))
            pos = span.end
        if pos < len(plain):
            out.append(Segment(plain[pos:], base))
        return out

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._style = None  # the theme or the stale class changed: every line is drawn again
        self._resolved.clear()
        self._strips = [None] * self._height
        self._forget_rows()

    def on_resize(self) -> None:
        self._width = -1
        self._memo = None
        self._forget_rows()
        frame = getattr(self.app, "frame", None)
        if self.key == "history" and frame is not None:  # its charts are as tall as the panel: draw them again
            self.call_after_refresh(self.draw, frame, self.has_class("zoomed"))

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False) -> Self:
        if repaint:
            if regions and self._rows:  # content regions: those rows are drawn again
                for region in regions:
                    for y in region.line_range:
                        if 0 <= y + self._top < len(self._rows):
                            self._rows[y + self._top] = None
            else:
                self._forget_rows()
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def _forget_rows(self) -> None:
        self._rows = []
        self._edges = None

    def render_lines(self, crop: Region) -> list[Strip]:
        """The rows in ``crop``, from the panel's own row cache.

        Textual's general path (``Widget.render_lines``) styles every changed row again (border,
        padding, tint, opacity, filters) and looks up the panel's styles for each call; that was
        half of top's drawing. Here a changed content row is the left border cells, the content
        line padded to the content width with the filters applied, and the right border cells.
        The border cells come from a row Textual drew, and the shortcut is used only after it
        gave exactly Textual's row for that row; borders, padding rows, and panels with effects
        (tint, opacity, hatch, text opacity) are always drawn by Textual.
        """
        size = self.region.size
        if size != self._rows_size or not self._rows:
            self._rows_size = size
            self._rows = [None] * size.height
            self._edges = None
            self._top = self.styles.gutter.top
            self._content = self.content_size
        rows = self._rows
        for y in crop.line_range:
            if 0 <= y < len(rows) and rows[y] is None:
                rows[y] = self._row(y, size.width)
        strips = [row or Strip.blank(size.width) for row in rows[crop.y : crop.bottom]]
        x1, x2 = crop.column_span
        if (x1, x2) != (0, size.width):
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips

    def _row(self, y: int, width: int) -> Strip:
        cy = y - self._top
        content = 0 <= cy < min(self._content.height, len(self._lines))
        if content and self._edges is not None:
            return self._own_row(cy)
        self._styles_cache.set_dirty(Region(0, y, width, 1))
        strip = Widget.render_lines(self, Region(0, y, width, 1))[0]
        if content and self._own_rows:
            try:
                self._learn_edges(strip, cy, width)
            except Exception:  # a Textual that draws rows differently: it draws every row
                self._edges = None
                self._own_rows = False
        return strip

    def _own_row(self, cy: int) -> Strip:
        left, right, pad, filters, background = self._edges  # type: ignore[misc]
        middle = self.render_line(cy).adjust_cell_length(self._content.width, pad)
        for line_filter in filters:
            middle = middle.apply_filter(line_filter, background)
        return Strip.join([left, middle, right])

    def _learn_edges(self, strip: Strip, cy: int, width: int) -> None:
        styles = self.styles
        gutter = styles.gutter
        plain = (
            styles.tint.a == 0
            and self.opacity == 1.0
            and styles.text_opacity == 1.0
            and (not styles.has_rule("hatch") or styles.hatch == "none")
            and styles.padding.left >= 1
            and gutter.left + self._content.width + gutter.right == width
        )
        if not plain:
            self._own_rows = False
            return
        left, _, right = strip.divide([gutter.left, width - gutter.right, width])
        pad = next(iter(left.crop(gutter.left - 1, gutter.left))).style or Style()
        self._edges = (left, right, pad, list(self.get_line_filters()), self.background_colors[1])
        if self._own_row(cy) != strip:  # not what Textual draws: Textual draws every row from now on
            self._edges = None
            self._own_rows = False

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, self._height)

    def render_line(self, y: int) -> Strip:
        if self._width < 0:
            self._width = self.content_size.width
        if self._style is None:
            self._style = self.rich_style
        if y >= len(self._lines):
            return Strip.blank(self._width, self._style)
        if self._strips_width != self._width:
            # a line drawn before the layout gave the panel its width was cropped to that
            # width (0 in a terminal where the first frame comes before the first layout):
            # every line is drawn again at this width, also the ones that did not change since
            self._strips = [None] * len(self._strips)
            self._strips_width = self._width
        strip = self._strips[y]
        if strip is None:
            strip = Strip(self._segments(self._lines[y]))
            if strip.cell_length > self._width:
                strip = strip.crop(0, self._width)
            self._strips[y] = strip
        return strip


def _at(lines: list[Text], y: int) -> Text | None:
    return lines[y] if y < len(lines) else None


def split_lines(text: Text) -> list[Text]:
    """``text`` as one ``Text`` per line, without the last line's newline.

    Same result as ``Text.split("\\n", allow_blank=True)`` (minus a trailing empty line) in a
    quarter of the time for the panels' texts, whose spans are in order and never overlap;
    anything else goes through rich.
    """
    plain, spans = text.plain, text.spans
    if any(a.end > b.start for a, b in pairwise(spans)):
        lines = list(text.split("\n", allow_blank=True))
        if lines and not lines[-1].plain:
            lines.pop()
        return lines
    out: list[Text] = []
    i, n, start = 0, len(spans), 0
    for piece in plain.split("\n"):
        end = start + len(piece)
        while i < n and spans[i].end <= start:
            i += 1
        own = []
        j = i
        while j < n and spans[j].start < end:
            s = spans[j]
            if s.end > s.start:
                own.append(Span(max(s.start, start) - start, min(s.end, end) - start, s.style))
            j += 1
        out.append(Text(piece, style=text.style, end="", spans=own))
        start = end + 1
    if out and not out[-1].plain:
        out.pop()  # the panel's text ends with a newline
    return out


class StatusBar(Widget):
    """The one-line status bar (LIVE / STALE / PAUSED / REC, the URL, the pace, the clock)."""

    def __init__(self) -> None:
        super().__init__(id="status")
        self.text = Text()
        self._strip: Strip | None = None

    def show(self, text: Text) -> None:
        if text != self.text:
            self.text = text
            self._strip = None
            self.refresh()

    @property
    def plain(self) -> str:
        return self.text.plain

    def render(self) -> Text:
        return self.text

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strip = None

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y > 0:
            return Strip.blank(width, self.rich_style)
        if self._strip is None:
            self.text.style = self.rich_style
            strip = Strip(self.text.render(self.app.console))
            self._strip = strip.crop(0, width) if strip.cell_length > width else strip
        return self._strip


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def __init__(self, mode: str | None = None) -> None:
        super().__init__()
        self.mode = mode  # how the server runs the model, as the model panel last read it

    def compose(self) -> ComposeResult:
        text = Text()
        text.append("Every number, its source and its formula\n\n", style="bold")
        panel = ""
        for p, number, source, formula in glossary(self.mode):
            if p != panel:
                text.append(f"{p}\n", style="bold cyan")
                panel = p
            text.append(f"  {number}: ", style="bold")
            text.append(f"{source}\n", style="green")
            text.append(f"      {formula}\n", style="dim")
        text.append("\nkeys: p pause  +/- interval (replay: speed)  w latency window  z zoom  r record  q quit\n")
        text.append("replay: ←/→ seek 10 refreshes, home/end first/last\n")
        with VerticalScroll(id="help"):
            yield Static(text)


class TopApp(App[None]):
    """``vllm-doctor top`` and ``vllm-doctor replay``."""

    CSS = """
    Screen { layout: vertical; }
    #status { height: 1; background: $boost; }
    #grid { grid-size: 3 3; grid-gutter: 0; grid-rows: auto auto 1fr; height: 1fr; }
    #history { column-span: 3; height: 100%; }
    .panel { border: round $primary; padding: 0 1; height: auto; max-height: 100%; overflow: hidden; }
    .panel.stale { color: $text-muted; border: round $warning; }
    Screen.-small #grid { grid-size: 2 2; }
    Screen.-small #devices, Screen.-small #model, Screen.-small #history { display: none; }
    Screen.-small.-medium #grid { grid-size: 2 3; grid-rows: auto auto 1fr; }
    Screen.-small.-medium #model { display: block; column-span: 2; }
    Screen.-zoom #grid { grid-size: 1 1; }
    Screen.-zoom .panel { display: none; }
    Screen.-zoom .panel.zoomed { display: block; }
    HelpScreen { align: center middle; }
    #help { width: 90%; height: 90%; border: round $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "help"),
        Binding("p", "pause", "pause"),
        Binding("plus,equals_sign", "faster", "+"),
        Binding("minus", "slower", "-"),
        Binding("w", "window", "window"),
        Binding("z", "zoom", "zoom"),
        Binding("r", "record", "record"),
        Binding("left", "seek(-1)", "seek", show=False),
        Binding("right", "seek(1)", "seek", show=False),
        Binding("home", "seek_to(0)", "first", show=False),
        Binding("end", "seek_to(-1)", "last", show=False),
        Binding("q", "quit", "quit"),
    ]

    def __init__(
        self,
        source: Source,
        *,
        record_path: str | None = None,
        record: bool = False,
        replay: bool = False,
        clock_in_status: bool = True,
    ) -> None:
        super().__init__()
        self.source = source
        self.replay = replay
        self.record_path = record_path
        self.recorder: Recorder | None = None
        self.clock_in_status = clock_in_status
        self.paused = False
        self.wall: Callable[[], float] = time.time  # the clock a live frame's age is read on
        self.zoomed: str | None = None
        self.frame: Frame | None = None
        self.frames_shown = 0
        self.first_data_at: float | None = None
        self.started_at = time.monotonic()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._panels: list[Panel] = []
        self._status: StatusBar | None = None  # drawn again only when its text changes
        if record and record_path:
            self._start_recording(record_path)

    # -- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar()
        with Grid(id="grid"):
            for key in PANELS:
                yield Panel(key)
        yield Footer()

    def on_mount(self) -> None:
        self._fit(self.size.width, self.size.height)
        self._draw_status()
        if not self.replay:  # the badge ages while no frame comes (a poll stuck on a slow server)
            self.set_interval(1.0, self._draw_status)
        self._thread = threading.Thread(target=self._poll_loop, name="vllm-doctor-top", daemon=True)
        self._thread.start()

    def on_resize(self, event: Any) -> None:
        self._fit(event.size.width, event.size.height)
        if self.frame is not None:
            self.call_after_refresh(self.show_frame, self.frame, False)

    def _fit(self, width: int, height: int) -> None:
        small = width < 120 or height < 36
        self.screen.set_class(small, "-small")
        # 100x30: the four engine panels leave 10 rows, the model panel's (across both columns)
        self.screen.set_class(small and height >= 30 and self.zoomed is None, "-medium")

    # -- the poll thread ----------------------------------------------------------------------
    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            if self.paused:
                self._wake.wait(0.25)
                self._wake.clear()
                continue
            t0 = time.monotonic()
            try:
                with self._lock:
                    frame = self.source.poll()
            except Exception as exc:  # a bug of the doctor's: say it, keep polling (the UI stays alive)
                try:
                    self.call_from_thread(
                        self.notify, f"top failed to refresh: {type(exc).__name__}: {exc}", severity="error"
                    )
                except RuntimeError:
                    break
                self._wake.wait(max(1.0, self.source.interval_s))
                continue
            if self._stop.is_set():
                break
            try:
                self.call_from_thread(self.show_frame, frame)
            except RuntimeError:  # the app is closing
                break
            self._wake.wait(max(0.02, self.source.interval_s - (time.monotonic() - t0)))
            self._wake.clear()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._stop_recording()
        self.source.close()

    # -- drawing ------------------------------------------------------------------------------
    def show_frame(self, frame: Frame, count: bool = True) -> None:
        self.frame = frame
        if count:
            self.frames_shown += 1
            if self.first_data_at is None and frame.metrics.ok:
                self.first_data_at = time.monotonic() - self.started_at
            if self.recorder is not None:
                self.recorder.write(frame)
        if not self._panels:
            self._panels = list(self.query(Panel))
        for panel in self._panels:
            panel.draw(frame, zoomed=panel.key == self.zoomed)
        self._draw_status()

    def _draw_status(self) -> None:
        status = Text()
        frame = self.frame
        if self.replay:
            info = (frame.replay if frame else None) or {}
            status.append(" REPLAY ", style="bold black on cyan")
            status.append(
                f" {info.get('index', -1) + 1}/{info.get('count', '?')} ×{getattr(self.source, 'speed', 1):g} "
            )
        if frame is None:
            status.append(" connecting ", style="bold black on yellow")
        elif frame.metrics.stale:
            age = frame.metrics.age_s
            badge = f" STALE {age:.0f} s " if age is not None else " NO DATA "
            status.append(badge, style="bold white on red")
            status.append(f" {clip(frame.metrics.error, 60)} ", style="red")
        elif not self.replay:
            status.append(*self._live_badge(frame))
        if self.paused:
            status.append(" PAUSED ", style="bold black on yellow")
        if self.recorder is not None:
            status.append(f" REC {self.recorder.frames} ", style="bold white on red")
        if frame is not None and frame.metrics.restart_now:
            status.append(" RESTART ", style="bold white on magenta")
        small = self.screen.has_class("-small")
        status.append(f" {self.source.url.split('://', 1)[-1] if small else self.source.url} ")
        interval = getattr(self.source, "recorded_interval_s", self.source.interval_s)
        window = getattr(self.source, "window_s", 0)
        pace = f"{interval:g}s/{window:g}s" if small else f"every {interval:g} s, window {window:g} s"
        status.append(pace, style="dim")
        if self.clock_in_status and frame is not None:
            status.append(f"  {datetime.fromtimestamp(frame.t).strftime('%H:%M:%S')}", style="dim")
        if small and not self.zoomed:
            status.append("  z: more panels", style="dim")
        if self._status is None:
            try:
                self._status = self.query_one(StatusBar)
            except Exception:  # a modal screen is on top; the next frame draws it
                return
        self._status.show(status)

    def _live_badge(self, frame: Frame) -> tuple[str, str]:
        """LIVE only while the frame on screen is recent and its scrape came back in time:
        BEHIND (no new frame for longer than a refresh and a scrape's timeout: the poll is stuck,
        this terminal's process starved) and SLOW (the server took longer than the interval to
        answer /metrics: the numbers are that old, the rates lower bounds) say when not."""
        interval = self.source.interval_s
        behind = self.wall() - frame.t
        if not self.paused and behind > behind_after(interval):
            return f" BEHIND {behind:.0f} s ", "bold black on yellow"
        reply = frame.metrics.reply_s
        if reply is not None and reply > max(SLOW_REPLY_S, interval):
            return f" SLOW /metrics {reply:.1f} s ", "bold black on yellow"
        return " LIVE ", "bold black on green"

    # -- keys ---------------------------------------------------------------------------------
    def action_help(self) -> None:
        model = self.frame.model if self.frame is not None else None
        self.push_screen(HelpScreen(model.mode if model else None))

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._wake.set()
        self._draw_status()

    def _step(self, faster: bool) -> None:
        with self._lock:
            if self.replay:
                speed = float(getattr(self.source, "speed", 1.0))
                seq = [s for s in SPEEDS if (s > speed if faster else s < speed)]
                self.source.speed = (min(seq) if faster else max(seq)) if seq else speed  # type: ignore[attr-defined]
            else:
                now = self.source.interval_s
                seq_i = [s for s in INTERVALS if (s < now if faster else s > now)]
                setattr(self.source, "interval_s", (max(seq_i) if faster else min(seq_i)) if seq_i else now)  # noqa: B010
        self._wake.set()
        self._draw_status()

    def action_faster(self) -> None:
        self._step(True)

    def action_slower(self) -> None:
        self._step(False)

    def action_window(self) -> None:
        with self._lock:
            now = float(getattr(self.source, "window_s", 60.0))
            bigger = [w for w in WINDOWS if w > now]
            self.source.window_s = bigger[0] if bigger else WINDOWS[0]  # type: ignore[attr-defined]
        self._draw_status()

    def action_zoom(self) -> None:
        order = list(PANELS)
        self.zoomed = (
            order[0]
            if self.zoomed is None
            else (None if order.index(self.zoomed) == len(order) - 1 else order[order.index(self.zoomed) + 1])
        )
        for panel in self.query(Panel):
            panel.set_class(panel.key == self.zoomed, "zoomed")
        self.screen.set_class(self.zoomed is not None, "-zoom")
        self._fit(self.size.width, self.size.height)
        if self.frame is not None:  # after the new layout: panels draw for their new width
            self.call_after_refresh(self.show_frame, self.frame, False)
        self._draw_status()

    def action_record(self) -> None:
        if self.replay:
            self.notify("a replay is not recorded again", severity="warning")
            return
        if self.recorder is not None:
            path = self.recorder.path
            self._stop_recording()
            self.notify(f"recording stopped: {path}")
        else:
            path_s = self.record_path or datetime.now().strftime("vllm-doctor-top-%Y%m%d-%H%M%S.jsonl.gz")
            try:
                self._start_recording(path_s)
            except DoctorInputError as exc:
                self.notify(exc.message, severity="error")
                return
            self.notify(f"recording to {path_s}")
        self._draw_status()

    def _start_recording(self, path: str) -> None:
        self.recorder = Recorder(
            Path(path),
            {
                "url": self.source.url,
                "interval_s": self.source.interval_s,
                "window_s": getattr(self.source, "window_s", 60.0),
                "started": time.time(),
            },
        )

    def _stop_recording(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None

    def action_seek(self, direction: int) -> None:
        if not self.replay:
            return
        with self._lock:
            index = int(getattr(self.source, "index", 0)) - 1 + direction * SEEK_STEP
            self.source.seek(index)  # type: ignore[attr-defined]
        self._after_seek()

    def action_seek_to(self, index: int) -> None:
        if not self.replay:
            return
        with self._lock:
            count = len(getattr(self.source, "records", []))
            self.source.seek(count - 1 if index < 0 else index)  # type: ignore[attr-defined]
        self._after_seek()

    def _after_seek(self) -> None:
        if self.paused:  # show where the seek landed; playing resumes from there
            with self._lock:
                frame = self.source.poll()
            self.show_frame(frame, count=False)
        self._wake.set()
