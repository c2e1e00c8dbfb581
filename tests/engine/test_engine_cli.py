"""``vllm-doctor check --engine`` and the engine stage's failures end to end (real engines, subprocesses);
``profile``'s report, trace and HTML are tests/unit/test_profile_replies.py's, on a recorded engine reply.

The working example (examples/make_examples.py, "ok") runs on a real single-process engine
started by the CLI's engine stage, eagerly (``--eager``): a fast engine (vLLM's default mode is
tests/engine/test_engine_front_ends.py's).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.model import Report

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]


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
