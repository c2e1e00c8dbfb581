"""The private channel on an NVIDIA GPU (``pytest -m gpu tests/gpu``): the example served on
cuda:0 in vLLM's default mode (torch.compile + CUDA graphs) with ``VLLM_DOCTOR=1`` and no dev
mode. The channel's thread reads CUDA events recorded by the worker's thread (its device set to
the worker's, the device waited for outside the worker's gate); outputs stay the same.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.gpu.test_engine_gpu import _cuda
from tests.served import ServedEngine
from vllm_doctor.live.proctree import discover

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(not _cuda(), reason="no CUDA device"),
]
GPU_DEFAULT = ["--max-model-len", "256", "--gpu-memory-utilization", "0.3"]
PROMPTS = ["the channel on a GPU", "events from another thread"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedEngine]:
    # the doctor's /metrics series on: the module's last test scrapes them (the exporter attaches
    # as soon as the workers are up, while the engine starts, and holds the hooks from then on)
    served = ServedEngine(tmp_path_factory.mktemp("channel-gpu"), engine_args=GPU_DEFAULT, metrics=True)
    with served.serving(timeout=600):
        yield served


def _outputs(server: ServedEngine) -> list[tuple[str, list[float]]]:
    return server.greedy(PROMPTS, 8)


def test_attach_through_the_channel_times_steps_on_cuda_events_and_changes_no_output(server: ServedEngine) -> None:
    holders = {int(p.name[5:-5]) for p in server.procs_dir.glob("chan-*.sock")}
    roles = {p.pid: p.role for p in discover(url=server.base)}
    assert holders and all(roles.get(pid) in ("engine-core", "worker") for pid in holders), (holders, roles)
    before = _outputs(server)
    env = {k: v for k, v in server.env.items() if k != "VLLM_DOCTOR"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "attach", "--url", server.base, "--duration", "20",
                             "--json", "--sample-every", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if "profiling the server's traffic" in line:
            break
    during = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        during = _outputs(server)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]
    after = _outputs(server)
    assert before == during == after
    report = json.loads(stdout)
    profile = report["profiles"]["engine"]
    assert profile["clock"] == "cuda_events", profile.get("clock")
    # the attach's window holds a sample of each phase whatever the budget (on this tiny model the
    # unsampled steps alone cost more than the 0.5 %, and the /metrics exporter, attached while the
    # engine started, took each phase's first), and its decode steps' forward is timed: FULL graph
    # replays, whose timer the exporter's install could not put on (vLLM makes the V2 runner's graph
    # manager with the KV cache, after the model loads): it is put on at the first sampled step
    decode = profile["phases"]["decode"]
    assert decode["steps"] > 0 and decode["forward_steps"] > 0 and 0 < decode["forward_s_mean"] < 1, decode
    (status,) = server.rpc("doctor_status")
    data = status["data"]
    # the exporter's reader keeps the hooks on after the attach left
    assert data["profiling"] is True and data["wrapped_methods"] == ["execute_model", "sample_tokens"], data
    assert "ModelCudaGraphManager.run_fullgraph" in data["timer_targets"], data


def test_top_once_reads_the_model_on_the_gpu_without_dev_mode(server: ServedEngine) -> None:
    env = {k: v for k, v in server.env.items() if k != "VLLM_DOCTOR"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "top", "--url", server.base, "--once", "--json",
                             "--interval", "6"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    started = time.monotonic()  # traffic for as long as top runs: its window is its last --interval
    while proc.poll() is None and time.monotonic() - started < 300:
        server.complete("top once on a GPU", 8)
    if proc.poll() is None:
        proc.kill()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    data = json.loads(stdout)
    model = data["model"]
    assert model["available"] and model["steps"] > 0 and model["clock"] == "cuda_events", model
    assert data["devices"], data  # NVML on the GPU machine


def test_metrics_carry_the_step_time_on_cuda_events(server: ServedEngine) -> None:
    """The API server's exporter reads the GPU worker through the channel: vllm_doctor_* series in
    /metrics, step and forward time on the device clock, the roofline against the device's peaks."""
    from tests.engine.test_metrics_served import _scrape, _until, _value

    first = _until(server, lambda e: _value(e, "vllm_doctor_up") == 1.0)
    assert _value(first, "vllm_doctor_up") == 1.0, first.families.get("vllm_doctor_info")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        server.complete("metrics on a GPU", 16)
    after = _until(server, lambda e: _value(e, "vllm_doctor_forward_steps", phase="decode") > 0)
    info = after.families["vllm_doctor_info"].samples[0]
    assert info.label("clock") == "cuda_events", info
    steps = _value(after, "vllm_doctor_steps", phase="decode")
    step_s = _value(after, "vllm_doctor_step_seconds", phase="decode") / steps
    forward_steps = _value(after, "vllm_doctor_forward_steps", phase="decode")
    forward_s = _value(after, "vllm_doctor_forward_seconds", phase="decode") / forward_steps
    # the forward within the step time of the same (sampled) steps; every step's mean can be shorter
    forward_step_s = _value(after, "vllm_doctor_forward_step_seconds", phase="decode") / forward_steps
    assert 0 < step_s < 1 and 0 < forward_s <= forward_step_s < 1, (forward_s, forward_step_s, step_s)
    ratios = {s.label("phase"): s.value for s in after.families["vllm_doctor_roofline_bandwidth_ratio"].samples}
    assert 0 < ratios.get("decode", 0) <= 1, ratios
    print(f"GPU /metrics: {steps:.0f} decode steps, step {step_s * 1e3:.3f} ms, forward {forward_s * 1e3:.3f} ms, "
          f"decode bandwidth {ratios['decode']:.1%}, own ratio {_value(after, 'vllm_doctor_own_ratio'):.4f}")  # fmt: skip
    assert _scrape(server).families["vllm_doctor_own_seconds"].samples
