"""The private channel on an NVIDIA GPU (``pytest -m gpu tests/gpu``): the example served on
cuda:0 in vLLM's default mode (torch.compile + CUDA graphs) with ``VLLM_DOCTOR=1`` and no dev
mode. The channel's thread reads CUDA events recorded by the worker's thread (its device set to
the worker's, the device waited for outside the worker's lock); outputs stay the same.
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
    served = ServedEngine(tmp_path_factory.mktemp("channel-gpu"), engine_args=GPU_DEFAULT)
    try:
        served.start(timeout=600)
        yield served
    finally:
        served.stop()


def _outputs(server: ServedEngine) -> list[tuple[str, list[float]]]:
    out = []
    for prompt in PROMPTS:
        choice = server.complete(prompt, 8, logprobs=1)["choices"][0]
        out.append((choice["text"], choice["logprobs"]["token_logprobs"]))
    return out


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
    decode = profile["phases"]["decode"]
    assert decode["steps"] > 0 and decode["forward_steps"] > 0 and 0 < decode["forward_s_mean"] < 1, decode
    (status,) = server.rpc("doctor_status")
    assert status["data"]["profiling"] is False and status["data"]["wrapped_methods"] == []


def test_top_once_reads_the_model_on_the_gpu_without_dev_mode(server: ServedEngine) -> None:
    env = {k: v for k, v in server.env.items() if k != "VLLM_DOCTOR"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "top", "--url", server.base, "--once", "--json",
                             "--interval", "6"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        server.complete("top once on a GPU", 8)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    data = json.loads(stdout)
    model = data["model"]
    assert model["available"] and model["steps"] > 0 and "CUDA events" in str(model["clock"]), model
    assert data["devices"], data  # NVML on the GPU machine
