"""``vllm-doctor profile`` and ``vllm-doctor check --engine`` end to end (real engines, subprocesses).

The working example (examples/make_examples.py, "ok") runs on a real single-process engine
started by the CLI's engine stage, eagerly (``--eager``): these tests need a fast engine whose
every module is timed, and the example compiles in vLLM's default mode (that mode is
tests/engine/test_engine_front_ends.py's). The HTML report is opened in headless Chromium when
Debian's ``chromium`` is installed (rendered DOM, screenshot, Chromium's own network log);
without it, only its structure is checked here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_doctor.model import Report

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]
CHART_LABELS = (
    "engine anatomy", "step time, prefill vs decode", "forward time per decoder layer, stacked by kind",
    "KV cache usage over the run", "memory breakdown rank 0",
)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("examples")
    subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "make_examples.py"), str(out), "--only", "ok"],
                   check=True, capture_output=True, timeout=300)
    return out / "ok"


def doctor(example: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env["PYTHONPATH"] = os.pathsep.join([str(example / "site"), str(REPO_ROOT)])
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def profiled(example: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("profile")
    proc = doctor(example, "profile", str(example / "model"), "--out", str(out), "--eager",
                  "--prompts", "3", "--input-len", "24", "--output-len", "24", "--deep")
    return out, proc


def test_profile_writes_report_trace_and_html(profiled: tuple[Path, Any]) -> None:
    out, proc = profiled
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "vllm-doctor: engine stage: engine up in" in proc.stderr  # progress lines on stderr
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


def test_check_engine_adds_engine_findings_and_prints_anatomy(example: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = doctor(example, "check", str(example / "model"), "--engine", "--eager", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "engine anatomy" in proc.stdout
    assert "model         tiny_doctor_model.model.TinyDoctorForCausalLM [plugin]" in proc.stdout
    assert "worker 0" in proc.stdout and "device cpu" in proc.stdout
    report = Report.from_dict(json.loads(out.read_text()))
    codes = {f.code: f.outcome.value for f in report.findings}
    assert codes["VD101"] == "pass"  # the static stage ran too
    for code in ("VD208", "VD401", "VD403", "VD404", "VD405", "VD501", "VD503", "VD504"):
        assert codes[code] == "pass", (code, report.by_code(code))
    assert codes["VD402"] == "not_applicable"
    assert report.facts["engine"]["model"]["origin"] == "plugin"


def test_check_engine_reports_kv_cache_too_small_from_vllms_own_refusal(example: Path) -> None:
    proc = doctor(example, "check", str(example / "model"), "--fast", "--engine", "--eager", "--select", "VD501",
                  "--max-model-len", "2048", "--kv-cache-memory", "300000")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAIL  VD501 kv-cache-too-small" in proc.stdout
    assert "the longest request that fits is 384 tokens" in proc.stdout
    assert "the engine did not start" in proc.stdout


def plugin_site(site: Path, package: str, source: str) -> Path:
    """A one-module plugin package declared as a `vllm.general_plugins` entry point (for PYTHONPATH)."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(source)
    info = site / f"{package}-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{package} = {package}:register\n")
    return site


BROKEN_PLUGIN = '''
def register():
    from vllm import ModelRegistry
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class BrokenForwardLlama(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if kwargs.get("input_ids") is not None and kwargs["input_ids"].numel() < 64:
                raise RuntimeError("Expected all tensors to be on the same device (doctor test)")
            return out

    ModelRegistry.register_model("BrokenForwardLlama", BrokenForwardLlama)
'''


def test_a_model_that_fails_at_run_time_is_reported_not_crashed(tmp_path: Path) -> None:
    """The engine starts (its dummy runs pass), then the user's workload raises in forward."""
    from tests.fixtures.engine_models import build_llama_dir

    plugin_site(tmp_path / "site", "broken_forward_plugin", BROKEN_PLUGIN)
    model = build_llama_dir(tmp_path / "model", ["BrokenForwardLlama"])
    proc = doctor(tmp_path, "profile", str(model), "--out", str(tmp_path / "out"), "--prompts", "2", "--input-len", "8",
                  "--output-len", "4")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the engine started, then the workload failed" in proc.stdout
    assert "Expected all tensors to be on the same device (doctor test)" in proc.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "Expected all tensors to be on the same device" in report["facts"]["engine_failure"]


FAILING_PLUGIN = '''
def register():
    from vllm import ModelRegistry
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class AlwaysFailingLlama(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            raise RuntimeError("doctor test: this forward always fails")

    ModelRegistry.register_model("AlwaysFailingLlama", AlwaysFailingLlama)
'''


def test_an_engine_that_does_not_start_is_an_error_finding_with_the_phase(tmp_path: Path) -> None:
    """vLLM's profile run calls the forward: VD500 fails (exit 1) with vLLM's error and the phase;
    outside eager mode the doctor re-runs eagerly, and says the model fails there too."""
    from tests.fixtures.engine_models import build_llama_dir

    plugin_site(tmp_path / "site", "always_failing_plugin", FAILING_PLUGIN)
    model = build_llama_dir(tmp_path / "model", ["AlwaysFailingLlama"])
    out = tmp_path / "report.json"
    proc = doctor(tmp_path, "check", str(model), "--fast", "--engine", "--select", "VD5", "--out", str(out))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "re-running the model in eager mode" in proc.stderr
    report = Report.from_dict(json.loads(out.read_text()))
    (f,) = report.by_code("VD500")
    assert f.outcome.value == "fail" and f.severity.value == "error"
    assert f.evidence["phase"] == "profile run" and f.subject == "engine start-up / profile run"
    assert "doctor test: this forward always fails" in f.message and "it fails in eager mode too" in f.message
    assert f.evidence["mode"]["requested"] == "vllm-default"
    assert "execution mode:" in proc.stdout and "it failed too" in proc.stdout
    # --eager: one engine, no re-run. With a fixed KV cache size vLLM's CPU worker runs no
    # profiling forward and an eager engine warms up without one: the forward first runs on the
    # workload, so the phase is the first step
    proc = doctor(tmp_path, "check", str(model), "--fast", "--engine", "--eager", "--select", "VD500", "--json")
    assert proc.returncode == 1 and "re-running" not in proc.stderr
    (f,) = [x for x in json.loads(proc.stdout)["findings"] if x["code"] == "VD500"]
    assert f["evidence"]["mode"]["requested"] == "eager" and f["evidence"]["phase"] == "first step"
    assert "doctor test: this forward always fails" in f["message"]
