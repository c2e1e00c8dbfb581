"""``vllm-doctor profile`` of the working example, eager, on its engine's recorded reply
(tests/fixtures/engine_replies.py, case ``ok-eager-deep``: recorded on a real single-process
engine by ``tools/record_engine_replies.py``; the engine tier checks that vLLM still answers so,
tests/engine/test_engine_replies_drift.py): the report, the trace and the HTML report the command
writes from it, the steps timed per layer against the others. The HTML report is opened in headless
Chromium when Debian's ``chromium`` is installed (rendered DOM, screenshot, Chromium's own network
log); without it, only its structure is checked here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import Run
from vllm_doctor.model import Report

CHART_LABELS = (
    "engine anatomy", "step time, prefill vs decode", "forward time per decoder layer, stacked by kind",
    "KV cache usage over the run", "memory breakdown rank 0",
)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    run = engine_replies.replay("ok-eager-deep", tmp_path_factory.mktemp("profile"))
    return run.out, run


def test_profile_writes_report_trace_and_html(profiled: tuple[Path, Any]) -> None:
    out, proc = profiled
    assert proc.rc == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "vllm-doctor: profile: " in proc.stderr  # progress lines on stderr
    assert "engine anatomy" in proc.stdout and "[plugin]" in proc.stdout
    data = json.loads((out / "report.json").read_text())
    report = Report.from_dict(data)  # the one schema
    engine = report.profiles["engine"]
    assert [s["phase"] for s in engine["steps"]] == ["prefill"] + ["decode"] * 23
    assert engine["steps"][0]["prefill_tokens"] == 3 * 24
    assert report.profiles["workload"]["generated_tokens"] == 72
    assert report.environment["vllm"] and report.environment["torch"]  # the versions the report was made with
    assert {"attention", "mlp", "norm", "embedding", "logits"} <= set(engine["layers"]["by_kind"])
    assert report.by_code("VD401")[0].outcome.value == "pass"
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert sum(e.get("cat") in ("prefill", "decode") for e in trace) == 24
    assert any(e.get("cat") == "layer" and e["name"] == "model.layers.1.self_attn" for e in trace)
    assert report.profiles["torch_profiler"]["files"], "vLLM's torch profiler wrote no trace"
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_profile_eager_sets_the_steps_timed_per_layer_against_the_others(profiled: tuple[Path, Any]) -> None:
    """23 decode steps: the first 8 and every 8th after them are timed per layer (10), the other 13
    not; of the timed ones every 4th (the first included) also inside the layers. The report gives
    both medians and the neighbour comparison per phase, and the text says what the timing cost."""
    out, proc = profiled
    engine = json.loads((out / "report.json").read_text())["profiles"]["engine"]
    decode_steps = [s for s in engine["steps"] if s["phase"] == "decode"]
    assert [s["layers_timed"] for s in decode_steps] == [True] * 9 + [False] * 7 + [True] + [False] * 6
    assert [i for i, s in enumerate(decode_steps) if s["layers_detail"]] == [0, 4, 8]
    decode = engine["phases"]["decode"]
    assert (decode["timed_steps"], decode["neighbour_pairs"]) == (10, 2)
    assert decode["timed_step_s_median"] > 0 and decode["untimed_step_s_median"] > 0
    # two pairs side by side: too few for a percentage against the neighbours (MIN_STEPS_TO_TELL)
    assert decode["timed_vs_neighbours"] is None and decode["detail_vs_neighbours"] is None
    assert "  timing cost   decode: steps timed per layer " in proc.stdout
    assert "(2 timed step(s) next to an untimed one: too few to tell them apart)" in proc.stdout
    # an inner module was timed on the detailed steps only, its decoder layer on every timed one
    modules = {m["name"]: m for m in engine["layers"]["modules"]}
    assert (modules["model.layers.1"]["decode_steps"], modules["model.layers.1.self_attn"]["decode_steps"]) == (10, 3)
    attn = modules["model.layers.1.self_attn"]
    # the tables take the doctor's timing marks out of each module's measured time (eager mode), given readings
    (cost,) = [c for c in engine["layers"]["doctor_cost"] if c["bucket"] == "decode"]
    # steps 8 (detailed: the 9th timed) and 16 (at the boundaries only) have untimed neighbours
    assert (cost["boundary_steps"], cost["detail_steps"], cost["pairs"], cost["detail_pairs"]) == (7, 3, 1, 1)
    # one reading per grain: too few to estimate a mark's cost (three needed), shown as measured
    assert cost.get("per_mark_s") is None and cost.get("detail_per_mark_s") is None and not cost.get("corrected_s")
    layer = modules["model.layers.1"]
    # scaled to every timed decode step by its layer's time on them over the layer's on the detailed ones
    by_layer = (layer["decode_s"] - layer.get("decode_cost_s", 0.0)) / (
        layer["decode_detail_s"] - layer.get("decode_detail_cost_s", 0.0)
    )
    left = attn["decode_s"] - attn.get("decode_cost_s", 0.0)
    assert attn["total_s"] == pytest.approx(attn["prefill_s"] - attn.get("prefill_cost_s", 0.0) + left * by_layer)
    assert "  per layer     per-layer figures less the doctor's timing marks: " in proc.stdout
    assert "decode as measured (2 timed step(s) next to an untimed one: too few to estimate" in proc.stdout


def test_html_report_is_self_contained(profiled: tuple[Path, Any]) -> None:
    html = (profiled[0] / "report.html").read_text()
    for label in CHART_LABELS:
        assert f'aria-label="{label}"' in html
    lowered = html.lower()
    assert "<script" not in lowered and "http://" not in lowered.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in lowered and "src=" not in lowered and "@import" not in lowered
    assert "model.layers" in html or "layer 0" in html


def _page_requests(netlog: Path) -> list[str]:
    """URLs the PAGE asked for (Chromium's own background traffic has initiator 'not an origin')."""
    data = json.loads(netlog.read_text())
    start = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in data["events"]
            if e.get("type") == start and "url" in e.get("params", {}) and e["params"].get("initiator") != "not an origin"]


def _chromium(page: Path, tmp: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
                           *flags, page.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="Debian's chromium is not installed")
def test_html_report_renders_in_headless_chromium_without_network(profiled: tuple[Path, Any], tmp_path: Path) -> None:
    page = profiled[0] / "report.html"
    dom = _chromium(page, tmp_path, "--dump-dom").stdout
    for label in CHART_LABELS:
        assert f'aria-label="{label}"' in dom
    assert dom.count("<rect") > 20
    shot = tmp_path / "shot.png"
    _chromium(page, tmp_path, "--window-size=1200,2600", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 20_000
    # positive control: the same page plus one remote image IS seen in the network log
    canary = tmp_path / "canary.html"
    canary.write_text(page.read_text().replace("</body>", '<img src="http://127.0.0.1:9/canary.png"></body>'))
    _chromium(canary, tmp_path, f"--log-net-log={tmp_path / 'canary.json'}", "--dump-dom")
    assert _page_requests(tmp_path / "canary.json") == ["http://127.0.0.1:9/canary.png"]
    _chromium(page, tmp_path, f"--log-net-log={tmp_path / 'net.json'}", "--dump-dom")
    assert _page_requests(tmp_path / "net.json") == []
