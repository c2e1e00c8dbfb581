"""The parts of ``top`` that keep it cheap: bucketed history charts, the kept-alive scrape,
and the engine-process lookup that runs again only when the processes are gone."""

from __future__ import annotations

import dataclasses
import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from rich.text import Text

from vllm_doctor.live.record import ReplaySource
from vllm_doctor.live.sources import EnginePids, LiveSource, ModelSummary, Scraper
from vllm_doctor.tui.panels import (
    PANELS,
    buckets,
    history_key,
    history_panel,
    latency_panel,
    model_panel,
    tall_chart,
)
from vllm_doctor.tui.top_app import split_lines

DATA = Path(__file__).resolve().parent.parent / "data" / "top"


def test_history_columns_change_only_when_a_bucket_is_complete() -> None:
    values = [float(i) for i in range(1, 13)]  # refreshes 1..12
    restarts = [False] * 12
    cols = buckets(values, restarts, seq=12, bucket=5, columns=10)
    assert cols == [(3.0, False), (8.0, False)]  # 1-5 and 6-10; 11-12 still filling
    later = buckets([*values, 13.0, 14.0], [*restarts, False, False], seq=14, bucket=5, columns=10)
    assert later == cols  # two more refreshes: the same picture, nothing to redraw
    full = buckets([*values, 13.0, 14.0, 15.0], [False] * 15, seq=15, bucket=5, columns=10)
    assert full[-1] == (13.0, False)
    assert buckets(values, restarts, seq=12, bucket=5, columns=1) == [(8.0, False)]  # the newest first


def _rich_lines(text: Text) -> list[Text]:
    lines = list(text.split("\n", allow_blank=True))
    return lines[:-1] if lines and not lines[-1].plain else lines


@pytest.mark.parametrize("recording", ["loaded.jsonl.gz", "h200.jsonl.gz", "restart.jsonl.gz"])
def test_panels_split_into_the_same_lines_as_rich_splits_them(recording: str) -> None:
    source = ReplaySource(DATA / recording)
    checked = 0
    for _ in range(len(source.records)):
        frame = source.poll()
        for key, (_, draw) in PANELS.items():
            for width in (36, 49, 154):
                texts = [draw(frame, width)]
                if key == "latency":
                    texts.append(latency_panel(frame, width, detail=True))
                for text in texts:
                    assert split_lines(text) == _rich_lines(text)
                    checked += 1
    assert checked > 100
    # spans that overlap or cross lines go through rich and give the same lines
    odd = Text("ab\ncd\n")
    odd.stylize("red", 1, 4)
    odd.stylize("bold", 0, 5)
    assert split_lines(odd) == _rich_lines(odd) and len(split_lines(odd)) == 2
    crossing = Text("ab\ncd\n\nef", spans=[])
    crossing.stylize("red", 1, 4)
    crossing.stylize("bold", 7, 9)
    assert split_lines(crossing) == _rich_lines(crossing)


def test_the_history_panel_is_drawn_again_only_when_its_key_changes() -> None:
    source = ReplaySource(DATA / "loaded.jsonl.gz")
    frames = [source.poll() for _ in range(len(source.records))]
    keys = [history_key(f, 154) for f in frames]
    assert len(set(map(repr, keys))) < len(frames) / 3  # a new picture once a bucket is complete
    for a, b, key_a, key_b in zip(frames, frames[1:], keys, keys[1:], strict=False):
        if key_a == key_b:
            assert history_panel(a, 154) == history_panel(b, 154)


def test_a_bucket_with_a_gap_or_a_restart_says_so() -> None:
    cols = buckets([None] * 5 + [1.0, None, 3.0, None, None], [False] * 7 + [True, False, False], 10, 5, 4)
    assert cols == [(None, False), (2.0, True)]
    lines = tall_chart(cols, 4, 2, scale=None)
    assert [line.plain for line in lines] == ["   │", "   │"]
    assert any("red" in str(span.style) for span in lines[0].spans)


def test_tall_chart_bars_are_eighths_of_rows_on_the_scale_given() -> None:
    cols = [(1.0, False), (0.5, False), (0.0, False), (0.25, False)]
    assert [line.plain for line in tall_chart(cols, 4, 2, scale=1.0)] == ["█   ", "██ ▄"]
    assert [line.plain for line in tall_chart([(0.002, False)], 3, 2, scale=1.0)] == ["   ", "   "]


class _Metrics(http.server.BaseHTTPRequestHandler):
    gets: ClassVar[list[float]] = []
    protocol_version = "HTTP/1.1"  # keep-alive
    connections: ClassVar[set[int]] = set()

    def do_GET(self) -> None:
        type(self).connections.add(id(self.connection))
        type(self).gets.append(time.time())
        body = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[http.server.ThreadingHTTPServer]:
    _Metrics.connections = set()
    _Metrics.gets = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_scrape_keeps_one_connection_and_reconnects_after_a_close(metrics_server) -> None:
    url = f"http://127.0.0.1:{metrics_server.server_address[1]}"
    scrape = Scraper(url)
    for _ in range(5):
        text, error = scrape(2.0)
        assert error == "" and "vllm:num_requests_running 1.0" in (text or "")
    assert len(_Metrics.connections) == 1
    scrape._conn.sock.close()  # type: ignore[union-attr]  # the server side went away
    text, error = scrape(2.0)
    assert error == "" and text
    assert Scraper(url + "/prefix")(2.0) == (None, "/metrics answered HTTP 404")
    scrape.close()


def test_the_first_scrape_starts_with_the_source_and_the_first_poll_uses_it(metrics_server) -> None:
    url = f"http://127.0.0.1:{metrics_server.server_address[1]}"
    source = LiveSource(url, prefetch=True)
    deadline = time.monotonic() + 10
    while not _Metrics.gets and time.monotonic() < deadline:  # nobody polled yet
        time.sleep(0.01)
    assert len(_Metrics.gets) == 1
    first = source.poll()
    assert len(_Metrics.gets) == 1 and first.metrics.ok and first.metrics.values["running"] == 1.0
    assert first.t >= _Metrics.gets[0]  # the frame carries the time of that scrape
    second = source.poll()
    assert len(_Metrics.gets) == 2 and second.seq == 2 and second.t >= first.t
    source.close()
    unreachable = LiveSource("http://127.0.0.1:9", prefetch=True)
    frame = unreachable.poll()
    assert not frame.metrics.ok and frame.metrics.error.startswith("cannot reach")
    unreachable.close()


class _Slow(http.server.BaseHTTPRequestHandler):
    delay_s: ClassVar[float] = 0.0

    def do_GET(self) -> None:
        time.sleep(type(self).delay_s)
        body = b"vllm:num_requests_running 1.0\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_answers_late_is_named_as_late_and_a_longer_timeout_waits_for_it() -> None:
    """A loaded server is reachable but slow: the error says how long the scrape waited, and
    `top --once` waits as long as Prometheus would (ONCE_SCRAPE_TIMEOUT_S), not the live view's 2 s."""
    from vllm_doctor.cli.top import ONCE_SCRAPE_TIMEOUT_S

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _Slow.delay_s = 1.0
        assert Scraper(url)(0.2) == (None, f"cannot reach {url}: no answer within 0.2 s")
        text, error = Scraper(url)(5.0)
        assert error == "" and text == "vllm:num_requests_running 1.0\n"
        assert ONCE_SCRAPE_TIMEOUT_S >= 10.0  # Prometheus's default scrape_timeout
    finally:
        _Slow.delay_s = 0.0
        server.shutdown()
        server.server_close()


def test_an_unreachable_server_is_one_error_line() -> None:
    text, error = Scraper("http://127.0.0.1:9")(1.0)
    assert text is None and error.startswith("cannot reach http://127.0.0.1:9")


def test_engine_processes_are_looked_up_again_only_when_gone() -> None:
    """The policy, on a real process: its /proc start time says it is alive; once it is gone the
    lookup runs at once; while nothing is found it backs off 2, 4, 8 ... s."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pids = EnginePids("http://127.0.0.1:1", None, every_s=3600)
        answers = [[(child.pid, "API server")]]
        calls: list[int] = []

        def lookup() -> list[tuple[int, str]]:
            calls.append(1)
            return answers[-1]

        pids._lookup = lookup  # type: ignore[method-assign]  # discover() needs a vLLM server's tree
        assert pids() == [(child.pid, "API server")] and len(calls) == 1
        for _ in range(3):
            assert pids() == [(child.pid, "API server")]
        assert len(calls) == 1  # alive: no lookup
        child.kill()
        child.wait()
        answers.append([])
        assert pids() == [] and len(calls) == 2  # gone: looked up at once
        assert pids() == [] and len(calls) == 2  # nothing found: waits
        pids._at -= 2.5
        assert pids() == [] and len(calls) == 3
        pids._at -= 2.5
        assert pids() == [] and len(calls) == 3  # the wait doubled to 4 s
        pids._at -= 2.0
        assert pids() == [] and len(calls) == 4
    finally:
        child.kill()
        child.wait()


def test_the_model_panel_says_which_window_its_numbers_are_from() -> None:
    frame = ReplaySource(DATA / "loaded.jsonl.gz").poll()
    model = {"available": True, "model_class": "pkg.TinyForCausalLM", "steps": 40, "window_s": 5.0, "as_of": 1.0,
             "phases": {"decode": {"steps": 40, "forward_s_mean": 0.002, "step_s_p50": 0.003}}, "findings": []}
    live = model_panel(dataclasses.replace(frame, model=ModelSummary.of(model)), 60).plain
    assert live.splitlines()[0] == "TinyForCausalLM  last 5 s" and "decode" in live
    quiet = model_panel(dataclasses.replace(frame, model=ModelSummary.of({**model, "quiet_s": 12.0})), 60).plain
    assert quiet.splitlines()[0] == "TinyForCausalLM  idle; last steps 12 s ago (5 s)"
    assert "   40 steps" in quiet  # the last window that ran steps stays on screen


def test_the_model_panel_says_what_the_doctor_took_of_the_worker() -> None:
    frame = ReplaySource(DATA / "loaded.jsonl.gz").poll()
    model = {"available": True, "model_class": "pkg.TinyForCausalLM", "steps": 40, "window_s": 5.0, "as_of": 1.0,
             "phases": {}, "findings": [],
             "doctor": {"per_step_s": 1.4e-05, "share": 0.004, "rpc_s": 0.0021, "window_s": 5.0, "worker_share": 0.0052}}
    lines = model_panel(dataclasses.replace(frame, model=ModelSummary.of(model)), 70).plain.splitlines()
    assert "doctor 0.52 % of the worker, 14.0 µs/step, calls 2.10 ms" in lines
    # the model panel at 160x48 has 51 columns: the calls' time is left out, nothing is cut
    narrow = model_panel(dataclasses.replace(frame, model=ModelSummary.of(model)), 51).plain.splitlines()
    assert "doctor 0.52 % of the worker, 14.0 µs/step" in narrow
    older = {k: v for k, v in model.items() if k != "doctor"}  # a recording from before: no line, no error
    assert not any(line.startswith("doctor ") for line in model_panel(dataclasses.replace(frame, model=ModelSummary.of(older)), 70).plain.splitlines())
