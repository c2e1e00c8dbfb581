"""``top`` against bad ``/metrics`` answers (a tiny loopback HTTP server) and small terminals.

No vLLM here: the server serves text the test chooses (garbage, a cut answer, HTTP 500, a
real-looking answer), so every case is exact and fast. The real-server cases (kill, restart)
are in tests/engine/test_top_served.py.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_live_metrics import exposition
from vllm_doctor.live.devices import DevicesFrame
from vllm_doctor.live.sources import Frame, LiveSource
from vllm_doctor.tui.panels import devices_panel
from vllm_doctor.tui.top_app import Panel, StatusBar, TopApp


class MetricsServer:
    def __init__(self) -> None:
        self.body = exposition()
        self.status = 200
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = owner.body.encode()
                self.send_response(owner.status)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metrics_server() -> Iterator[MetricsServer]:
    server = MetricsServer()
    yield server
    server.close()


def test_garbage_then_good_then_cut_then_http_error(metrics_server: MetricsServer) -> None:
    source = LiveSource(metrics_server.url, interval_s=0.2)
    metrics_server.body = "\x00\x01 this is not prometheus {{{\n"
    garbage = source.poll().metrics
    assert garbage.stale and "no vLLM metrics" in garbage.error and garbage.age_s is None
    metrics_server.body = exposition(gen=100)
    good = source.poll().metrics
    assert good.ok and good.values["generation_tokens"] == 100
    full = exposition(gen=150)
    metrics_server.body = full[: full.index("vllm:generation_tokens_total") + 20]  # cut mid-answer
    cut = source.poll().metrics
    assert cut.ok and cut.parse_errors == 1 and "generation_tokens" not in cut.values
    assert cut.rates["gen_tps"] is None and cut.restarts == 0  # a missing counter is no restart
    metrics_server.status = 500
    err = source.poll().metrics
    assert err.stale and "HTTP 500" in err.error and err.values == cut.values


def test_the_app_shows_stale_with_the_age_and_greys_the_numbers(metrics_server: MetricsServer) -> None:
    async def scenario() -> None:
        app = TopApp(LiveSource(metrics_server.url, interval_s=0.2))
        async with app.run_test(size=(80, 24)) as pilot:
            while app.frame is None or not app.frame.metrics.ok:
                await pilot.pause(0.1)
            assert "LIVE" in app.query_one(StatusBar).plain
            metrics_server.body = "garbage\n"
            while not app.frame.metrics.stale:
                await pilot.pause(0.1)
            await pilot.pause(0.1)
            status = app.query_one(StatusBar).plain
            assert "STALE" in status and "no vLLM metrics" in status
            assert app.query_one("#engine", Panel).has_class("stale")
            # 80x24: the four engine panels, by priority; the other two behind z
            assert app.query_one("#devices").display is False and app.query_one("#kv").display is True
            await pilot.press("q")

    asyncio.run(scenario())


def _frame_with_devices(devices: dict) -> Frame:
    from vllm_doctor.live.derive import Deriver

    return Frame(seq=1, t=0.0, url="u", interval_s=1.0, metrics=Deriver().update(0.0, exposition()),
                 devices=DevicesFrame.of(devices))  # a recording's JSON of the devices


def test_no_nvml_shows_the_reason_and_the_engine_processes() -> None:
    text = devices_panel(_frame_with_devices({
        "nvml_available": False, "nvml_reason": "NVML Shared Library Not Found", "gpus": [],
        "processes": [{"pid": 4242, "role": "EngineCore", "cpu_pct": 97.5, "rss": 3 * 2**30, "threads": 41}],
    }), 60).plain
    assert "no NVML: NVML Shared Library Not Found" in text
    assert "4242 EngineCore" in text and "98" in text and "3.00 GiB" in text and "41" in text


def test_a_gpu_is_drawn_with_every_number() -> None:
    gpu = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1", "util_gpu_pct": 87.0, "util_mem_pct": 40.0,
           "mem_used": 100 * 2**30, "mem_total": 141 * 2**30, "power_w": 512.0, "power_limit_w": 700.0,
           "temp_c": 61.0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
           "processes": [{"pid": 77, "used_memory": 90 * 2**30, "name": "python"}]}
    text = devices_panel(_frame_with_devices({"nvml_available": True, "nvml_reason": "", "gpus": [gpu],
                                              "processes": []}), 60).plain
    for part in ("GPU0", "NVIDIA H200", "util 87%", "100.00 GiB/141.00 GiB", "512/700 W", "61°C", "sm 1980 MHz",
                 "pid 77", "90.00 GiB"):
        assert part in text, (part, text)


def test_screenshot_runs_the_app_without_a_terminal(metrics_server: MetricsServer, tmp_path: Path) -> None:
    from tests.conftest import run_doctor

    shot = tmp_path / "top.svg"
    proc = run_doctor(["top", "--url", metrics_server.url, "--screenshot", str(shot), "--duration", "2", "--no-model",
                       "--no-devices"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    svg = shot.read_text()
    assert svg.startswith("<svg") and "LIVE" in svg and "generation" in svg


def test_an_unwritable_recording_is_an_input_error(metrics_server: MetricsServer, tmp_path: Path) -> None:
    from tests.conftest import run_doctor

    proc = run_doctor(["top", "--url", metrics_server.url, "--record", str(tmp_path / "no" / "such" / "dir.gz"), "--no-model"])
    assert proc.returncode == 2 and "cannot write the recording" in proc.stderr and "Traceback" not in proc.stderr
