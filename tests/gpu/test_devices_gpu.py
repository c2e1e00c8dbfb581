"""live/devices.py on a real NVIDIA GPU (``pytest -m gpu tests/gpu/test_devices_gpu.py``; skipped without CUDA).

A child process of this test allocates CUDA memory with torch and keeps a kernel loop busy; the
sampler must see the GPU's readings and that child among the GPU's compute processes.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.fixtures.processes import ready_child
from vllm_doctor.live.devices import MIN_CPU_INTERVAL_S, DeviceSampler, DevicesFrame


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="no CUDA device")]

# 512 MiB on cuda:0, then matmuls until killed (so utilisation and power rise)
CHILD = (
    "import torch, sys\n"
    "keep = torch.empty(512 * 2**20, dtype=torch.uint8, device='cuda:0')\n"
    "a = torch.randn(4096, 4096, device='cuda:0')\n"
    "torch.cuda.synchronize(); print('ready', flush=True)\n"
    "while True:\n"
    "    b = a @ a\n"
    "    torch.cuda.synchronize()\n"
)


@pytest.fixture(scope="module")
def cuda_child() -> Iterator[subprocess.Popen[str]]:
    with ready_child(CHILD, wait_s=60) as child:
        yield child


def test_a_real_gpu_sample_shows_readings_and_our_cuda_process(cuda_child: subprocess.Popen[str]) -> None:
    with DeviceSampler(lambda: [(cuda_child.pid, "cuda child"), (os.getpid(), "test")]) as sampler:
        frame = sampler.sample()
        for _ in range(50):  # NVML's process list and utilisation lag the allocation by up to a sample period
            if any(p.pid == cuda_child.pid for g in frame.gpus for p in g.processes) and (frame.gpus[0].util_gpu_pct or 0) > 0:
                break
            time.sleep(0.2)
            frame = sampler.sample()
        time.sleep(MIN_CPU_INTERVAL_S)
        frame = sampler.sample()  # CPU% needs two samples of the same process, 250 ms apart at least
    assert frame.nvml_available, frame.nvml_reason
    assert frame.gpus and frame.gpus[0].name and frame.gpus[0].uuid.startswith("GPU-")
    gpu = frame.gpus[0]
    for field in ("util_gpu_pct", "util_mem_pct", "mem_used", "mem_total", "power_w", "power_limit_w", "temp_c",
                  "sm_clock_mhz", "mem_clock_mhz"):
        assert getattr(gpu, field) is not None, field
    assert gpu.util_gpu_pct is not None and gpu.util_gpu_pct > 0
    assert gpu.mem_used is not None and gpu.mem_total is not None and 512 * 2**20 <= gpu.mem_used <= gpu.mem_total
    assert gpu.power_w is not None and gpu.power_limit_w is not None and 0 < gpu.power_w <= gpu.power_limit_w * 1.5
    ours = [p for g in frame.gpus for p in g.processes if p.pid == cuda_child.pid]
    assert ours, [g.processes for g in frame.gpus]
    assert ours[0].used_memory is None or ours[0].used_memory >= 512 * 2**20
    assert ours[0].name.startswith("python")
    child = next(p for p in frame.processes if p.pid == cuda_child.pid)
    assert child.cpu_pct is not None and child.rss is not None and child.rss > 0 and child.threads and child.threads >= 1
    assert DevicesFrame.from_json(frame.to_json()) == frame
