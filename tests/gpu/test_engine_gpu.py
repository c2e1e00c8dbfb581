"""The engine stage on an NVIDIA GPU (run with ``pytest -m gpu tests/gpu``; skipped without CUDA).

Self-contained: builds its own tiny Llama (head_dim 64, 4 layers, GQA 8/4) with transformers
in a temporary directory, then runs one engine per runner kind in a fresh process
(tests/gpu/gpu_child.py): vLLM's V2 model runner, the V1 runner, and CUDA graphs. Asserts
placement on cuda:0, CUDA-event timings, KV bytes equal to torch's storages and vLLM's plan,
NVML memory beside the breakdown, and bit-identical outputs with the doctor attached.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_doctor.constants import DEFAULT_OWN_BUDGET, OWN_BUDGET_ENV, SAMPLE_WARMUP_STEPS

REPO_ROOT = Path(__file__).resolve().parents[2]


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(not _cuda(), reason="no CUDA device"),
]
GPU_DIMS = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=2048)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.engine_models import build_llama_dir

    return build_llama_dir(tmp_path_factory.mktemp("gpu") / "tiny-llama", ["LlamaForCausalLM"], GPU_DIMS)


_results: dict[str, dict[str, Any]] = {}


def run_mode(model_dir: Path, mode: str, tmp: Path) -> dict[str, Any]:
    if mode not in _results:
        out = tmp / f"{mode}.json"
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_V2_MODEL_RUNNER")}
        if mode != "budget":  # these modes' tests count the cadence's samples: no budget to leave some out
            env[OWN_BUDGET_ENV] = "0"
        else:
            env.pop(OWN_BUDGET_ENV, None)
        paths = [str(REPO_ROOT), env.get("PYTHONPATH", "")]
        if mode == "plugin":  # the doctor's vllm.general_plugins entry point, without pip install
            from tests.fixtures.entry_points import doctor_entry_point_site

            paths.insert(0, str(doctor_entry_point_site(tmp / "ep")))
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        proc = subprocess.run([sys.executable, "-m", "tests.gpu.gpu_child", str(model_dir), str(out), mode],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert out.exists(), f"{mode} child failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        _results[mode] = json.loads(out.read_text())
    return _results[mode]


def finding(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code]


@pytest.mark.parametrize("mode", ["v2", "v1"])
def test_eager_engine_on_cuda(model_dir: Path, tmp_path: Path, mode: str) -> None:
    r = run_mode(model_dir, mode, tmp_path)
    report = r["report"]
    assert r["same"] is True, "outputs changed with the doctor attached"
    anatomy = report["facts"]["engine"]
    assert anatomy["model_runner"]["kind"] == mode
    assert anatomy["workers"][0]["device"] == "cuda:0"
    # placement
    assert [f["outcome"] for f in finding(report, "VD401")] == ["pass"]
    assert "cuda:0" in finding(report, "VD401")[0]["subject"]
    vd402 = finding(report, "VD402")
    assert [f["outcome"] for f in vd402] == ["pass"] and vd402[0]["evidence"]["device"] == "cuda:0"
    # CUDA-event timings, per step and per layer
    prof = report["profiles"]["engine"]
    assert prof["clock"] == "cuda_events" and prof["layers_on"] is True
    # every step is timed on the device clock (an event pair per step); the forward on the sampled steps
    assert prof["steps"] and all(s["step_s"] > 0 and s["step_clock"] == "cuda_events" for s in prof["steps"])
    sampled = [s for s in prof["steps"] if s["sampled"]]
    assert sampled and all(s["forward_s"] > 0 for s in sampled)
    assert all(s["forward_s"] is None for s in prof["steps"] if not s["sampled"])
    _idle_between_steps_on_the_device_clock(prof)
    assert {s["phase"] for s in prof["steps"]} == {"prefill", "decode"}
    assert all(m["total_s"] > 0 for m in prof["layers"]["modules"])
    # sampled per-layer timing: the first 8 steps of each phase, then every N-th
    per_phase: dict[str, int] = {}
    for s in prof["steps"]:
        per_phase[s["phase"]] = per_phase.get(s["phase"], 0) + 1
    every = prof["layers"]["sample_every"]
    assert prof["layers"]["timed_steps"] == len(sampled) == sum(min(n, 8) + len(range(8, n, every)) for n in per_phase.values())
    assert 0.5 < prof["layers"]["timed_fraction"] <= 1.0
    assert 0 < prof["doctor_overhead"]["share"] < 0.5
    assert {"attention", "mlp", "norm"} <= set(prof["layers"]["by_kind"])
    # KV bytes: the doctor's count (shared storage once) = torch's storages = vLLM's plan
    vd504 = finding(report, "VD504")
    assert [f["outcome"] for f in vd504] == ["pass"]
    assert vd504[0]["evidence"]["storage_bytes"] == r["torch_kv_storage_bytes"] == r["vllm_planned_kv_bytes"]
    assert r["torch_kv_storage_bytes"] <= r["torch_allocated"]
    # memory breakdown next to NVML's per-process memory
    mem = prof["memory"][0]
    assert mem["parts"]["kv_cache"] == r["torch_kv_storage_bytes"]
    assert mem["parts"]["weights"] > 0 and mem["parts"]["peak_activations"] is not None
    if (prof.get("nvml") or {}).get("available"):
        assert mem["total_source"].startswith("NVML")
        assert sum(v for v in mem["parts"].values() if v) == mem["total"]
    else:
        assert prof["nvml"]["reason"]
    for code in ("VD403", "VD404", "VD405", "VD501", "VD208", "VD400"):
        assert all(f["outcome"] in ("pass", "not_applicable") or f["severity"] == "info" for f in finding(report, code)), finding(report, code)


def test_cuda_graphs_keep_per_layer_timing_on_and_the_probe_off(model_dir: Path, tmp_path: Path) -> None:
    """Under CUDA graphs the layers are timed at the attention calls (events captured into the
    graphs, issue 25) and every step on the device clock; the op probe still needs eager mode."""
    r = run_mode(model_dir, "graphs", tmp_path)
    prof = r["report"]["profiles"]["engine"]
    assert r["same"] is True
    assert prof["layers_on"] is True and prof["clock"] == "cuda_events"
    assert prof["steps"] and all(s["step_s"] > 0 and s["step_clock"] == "cuda_events" for s in prof["steps"])
    _idle_between_steps_on_the_device_clock(prof)
    probe = [f for f in r["report"]["findings"] if f["code"] == "VD404"]
    assert probe and probe[0]["outcome"] == "skip"


def test_the_doctors_own_budget_leaves_due_samples_out_and_says_so(model_dir: Path, tmp_path: Path) -> None:
    """On the device clock the doctor's own budget (0.5 % of the worker's time by default) decides
    which due steps are sampled: on this tiny model a sample costs the host more than the budget
    earns in a few steps, so most due steps are left out, counted in the report; the first step
    of each phase is always sampled; the outputs are the same."""
    r = run_mode(model_dir, "budget", tmp_path)
    prof = r["report"]["profiles"]["engine"]
    over = prof["doctor_overhead"]
    assert r["same"] is True
    assert over["own_budget"] == DEFAULT_OWN_BUDGET and over["samples_skipped"] > 0
    sampled = [s for s in prof["steps"] if s["sampled"]]
    assert {s["phase"] for s in sampled} == {"prefill", "decode"}
    per_phase: dict[str, int] = {}
    for s in prof["steps"]:
        per_phase[s["phase"]] = per_phase.get(s["phase"], 0) + 1
    every = prof["layers"]["sample_every"]
    due = sum(min(n, SAMPLE_WARMUP_STEPS) + len(range(SAMPLE_WARMUP_STEPS, n, every)) for n in per_phase.values())
    assert len(sampled) + over["samples_skipped"] == due
    assert "left unsampled to keep the doctor within its budget of 0.5%" in r["report_text"]


def _idle_between_steps_on_the_device_clock(prof: dict[str, Any]) -> None:
    """Every step after the first has the device's idle time since the previous one ended (the
    previous step's end event to its start event), and that fits between the steps' host starts:
    a step's start event cannot complete before its execute_model was entered, and the host runs
    at most a step or two ahead of the device (async scheduling)."""
    steps = prof["steps"]
    assert steps[0]["idle_before_s"] is None
    assert all(s["idle_before_s"] is not None and s["idle_before_s"] >= 0 for s in steps[1:]), steps
    idle = prof["idle_between_steps"]
    assert idle["clock"] == "cuda_events" and idle["gaps"] == len(steps) - 1
    span = steps[-1]["t"] - steps[0]["t"]
    assert sum(s["step_s"] for s in steps[:-1]) + idle["total_s"] <= span + 2 * max(s["step_s"] for s in steps)


def test_opt_in_plugin_adds_the_extension_to_a_plain_multiprocess_engine(model_dir: Path, tmp_path: Path) -> None:
    r = run_mode(model_dir, "plugin", tmp_path)
    assert r["worker_extension_cls"] == "vllm_doctor.engine.extension.DoctorWorkerExtension"
    assert r["same"] is True
    anatomy = r["report"]["facts"]["engine"]
    assert anatomy["workers"][0]["device"] == "cuda:0"
    assert anatomy["workers"][0]["pid"] != r["front_end_pid"]  # the engine core runs in its own process
    prof = r["report"]["profiles"]["engine"]
    assert prof["clock"] == "cuda_events" and prof["layers_on"] is True and prof["steps"]


def _doctor_check(model: Path, tmp: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """``vllm-doctor check MODEL --engine --json`` in a fresh process, the capture models' plugin on
    PYTHONPATH; returns (exit code, report, stderr)."""
    from tests.fixtures.capture_models import capture_site

    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_V2_MODEL_RUNNER")}
    site = capture_site(tmp / "capture-site")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "vllm_doctor", "check", str(model), "--fast", "--engine", "--json", "--select", "VD4,VD5",
           "--max-model-len", "512", "--engine-arg", "gpu_memory_utilization=0.15", *args]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.stdout.strip().startswith("{"), proc.stderr[-6000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("arch", ["DoctorCpuBufferLlama", "DoctorItemLlama"])
def test_a_model_that_cannot_be_captured_fails_with_its_cause(tmp_path: Path, arch: str) -> None:
    """Default mode (torch.compile + CUDA graphs): exit 1, VD500 with vLLM's error, the phase and
    the cause the eager re-run's op probe found (the buffer / the .item() line)."""
    from tests.fixtures.engine_models import build_llama_dir

    model = build_llama_dir(tmp_path / arch, [arch], GPU_DIMS)
    code, report, stderr = _doctor_check(model, tmp_path)
    assert code == 1, stderr[-4000:]
    (vd500,) = finding(report, "VD500")
    ev = vd500["evidence"]
    assert vd500["outcome"] == "fail" and vd500["severity"] == "error", vd500
    assert ev["mode"]["requested"] == "vllm-default" and ev["phase"].startswith("graph capture"), ev
    assert report["facts"]["engine_mode"]["requested"] == "vllm-default"
    causes = ev["causes"]
    assert causes, vd500
    if arch == "DoctorCpuBufferLlama":
        assert "CUDA graph capture" in ev["vllm_error"]
        assert causes[0]["kind"] in ("host tensor copied in forward", "tensor on another device"), causes
        assert any("gain" in c["detail"] for c in causes), causes
        assert any(c["kind"] == "tensor on another device" and "float64" in c["detail"] for c in causes), causes
        # the model's own checks read the eager re-run: the buffer is on the CPU of a cuda:0 worker
        assert any(f["outcome"] == "fail" and f["subject"].endswith("gain") for f in finding(report, "VD401"))
    else:
        assert causes[0]["kind"] == "host sync in forward", causes
        assert any("capture_models.py" in w for w in causes[0]["where"]), causes[0]
        assert "Tensor.item" in vd500["message"] and "capture_models.py" in vd500["message"]
        assert any(f["outcome"] == "warn" for f in finding(report, "VD404"))


def test_eager_mode_runs_the_cpu_buffer_model_and_finds_the_buffer(tmp_path: Path) -> None:
    from tests.fixtures.engine_models import build_llama_dir

    model = build_llama_dir(tmp_path / "cpu-buffer", ["DoctorCpuBufferLlama"], GPU_DIMS)
    code, report, stderr = _doctor_check(model, tmp_path, "--eager")
    assert code == 1, stderr[-4000:]  # VD401 is an error
    assert [f["outcome"] for f in finding(report, "VD500")] == ["pass"]
    assert report["facts"]["engine_mode"]["enforce_eager"] is True
    assert any(f["outcome"] == "fail" and f["subject"].endswith("gain") for f in finding(report, "VD401"))
    assert any(f["outcome"] == "warn" for f in finding(report, "VD403"))
