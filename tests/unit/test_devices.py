"""live/devices.py: the engine processes from real /proc, NVML's absence, and the NVML gateway's degradation.

The /proc tests read real processes this test spawns. This host has no NVIDIA driver, so the
NVML-absent test reads the real failure; the real GPU readings are tests/gpu/test_devices_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import ready_child
from vllm_doctor.compat import nvml
from vllm_doctor.live.devices import (
    MIN_CPU_INTERVAL_S,
    DeviceSampler,
    DevicesFrame,
    GpuProcess,
    GpuSample,
    ProcSample,
    read_proc_stat,
)

# a busy child with two extra (sleeping) threads: CPU% > 0, threads >= 3, RSS > 0
BUSY = (
    "import threading, time, sys\n"
    "for _ in range(2): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    "print('ready', flush=True)\n"
    "x = 0\n"
    "while True: x += 1\n"
)


@pytest.fixture
def busy_child() -> Iterator[subprocess.Popen[str]]:
    with ready_child(BUSY) as child:
        yield child


def sample_until(sampler: DeviceSampler, ok: Any, tries: int = 40) -> DevicesFrame:
    """Sample every 0.1 s until ``ok(frame)`` (a loaded 2-core host may not schedule the child at once)."""
    frame = sampler.sample()
    for _ in range(tries):
        if ok(frame):
            break
        time.sleep(0.1)
        frame = sampler.sample()
    return frame


def test_a_busy_child_has_cpu_rss_and_threads_and_the_first_sample_has_no_cpu(busy_child: subprocess.Popen[str]) -> None:
    me = os.getpid()
    with DeviceSampler(lambda: [(busy_child.pid, "worker"), (me, "doctor")]) as sampler:
        first = sampler.sample()
        assert [(p.pid, p.role) for p in first.processes] == [(busy_child.pid, "worker"), (me, "doctor")]
        assert all(p.cpu_pct is None for p in first.processes)
        frame = sample_until(sampler, lambda f: (f.processes[0].cpu_pct or 0) > 0)
    child = frame.processes[0]
    assert child.cpu_pct is not None and 0 < child.cpu_pct <= 100 * (os.cpu_count() or 1) + 1
    assert child.rss is not None and child.rss > 1_000_000  # a python interpreter: several MB
    assert child.threads == 3
    assert frame.processes[1].threads is not None and frame.processes[1].threads >= 1


def test_a_sample_sooner_than_the_tick_clock_can_resolve_has_no_cpu_and_keeps_the_baseline(
    busy_child: subprocess.Popen[str],
) -> None:
    # /proc's CPU time moves in 10 ms ticks: two samples 1 ms apart once gave 568 % for one process
    with DeviceSampler(lambda: [(busy_child.pid, "worker")]) as sampler:
        sampler.sample()
        t0 = time.monotonic()
        soon = sampler.sample()
        if time.monotonic() - t0 < MIN_CPU_INTERVAL_S:  # a host too loaded to sample twice in 250 ms says nothing here
            assert soon.processes[0].cpu_pct is None
        time.sleep(MIN_CPU_INTERVAL_S)
        later = sampler.sample()  # measured from the first sample, not the one in between
        t1 = time.monotonic()
        again = sampler.sample()
        too_soon = time.monotonic() - t1 < MIN_CPU_INTERVAL_S
    cpu = later.processes[0].cpu_pct
    assert cpu is not None and 0 <= cpu <= 100 * (os.cpu_count() or 1) + 1
    if too_soon:  # a refresh faster than the tick clock resolves shows the last rate measured
        assert again.processes[0].cpu_pct == cpu


def test_a_vanished_pid_is_dropped_not_an_error(busy_child: subprocess.Popen[str]) -> None:
    pids = [(busy_child.pid, "worker"), (os.getpid(), "doctor")]
    with DeviceSampler(lambda: pids) as sampler:
        assert len(sampler.sample().processes) == 2
        busy_child.kill()
        busy_child.wait(timeout=10)
        assert [p.pid for p in sampler.sample().processes] == [os.getpid()]


def test_a_failing_pids_provider_gives_no_processes() -> None:
    def down() -> list[tuple[int, str]]:
        raise ConnectionError("server down")

    with DeviceSampler(down) as sampler:
        assert sampler.sample().processes == ()


def test_stat_with_parentheses_and_spaces_in_the_name(tmp_path: Path) -> None:
    # the real layout of /proc/PID/stat (52 fields); comm is "(a) b (c)"
    rest = ["S"] + [str(n) for n in range(4, 53)]
    rest[13 - 3], rest[14 - 3], rest[15 - 3] = "0", "70", "30"  # field 13 cmajflt, 14 utime, 15 stime
    rest[20 - 3], rest[22 - 3], rest[24 - 3] = "5", "12345", "10"  # num_threads, starttime, rss pages
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 ((a) b (c)) " + " ".join(rest) + "\n", encoding="utf-8")
    stat = read_proc_stat(42, tmp_path)
    assert stat is not None
    assert (stat.cpu_ticks, stat.threads, stat.start_ticks) == (100, 5, 12345)
    assert stat.rss == 10 * os.sysconf("SC_PAGE_SIZE")
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "stat").write_text("43 (x) S 1 2", encoding="utf-8")  # truncated
    assert read_proc_stat(43, tmp_path) is None and read_proc_stat(44, tmp_path) is None


def test_own_process_matches_proc_status() -> None:
    stat = read_proc_stat(os.getpid())
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    assert stat is not None
    assert stat.threads == int(status["Threads"])
    assert abs(stat.rss - int(status["VmRSS"].split()[0]) * 1024) < 64 * 2**20


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this host has an NVIDIA driver")
def test_without_a_driver_the_frame_says_why_and_processes_still_come() -> None:
    with DeviceSampler(lambda: [(os.getpid(), "doctor")]) as sampler:
        frame = sampler.sample()
    assert frame.nvml_available is False and frame.gpus == ()
    assert "no libnvidia-ml.so.1 on this host (no NVIDIA driver installed)" in frame.nvml_reason
    assert [p.pid for p in frame.processes] == [os.getpid()]
    assert nvml.snapshot() == {"available": False, "reason": frame.nvml_reason}


def test_frame_json_round_trip() -> None:
    frame = DevicesFrame(
        t=1.5,
        nvml_available=True,
        nvml_reason="",
        gpus=(GpuSample(0, "H200", "GPU-1", 50.0, 10.0, 2**30, 2**37, 300.5, 700.0, 41.0, 1980, 3201,
                        (GpuProcess(7, 2**29, "python3"), GpuProcess(8, None, ""))),),
        processes=(ProcSample(7, "worker", None, 123, 4), ProcSample(8, "engine core", 12.5, 456, 9)),
    )
    assert DevicesFrame.of(json.loads(json.dumps(frame.to_json()))) == frame


# --- the gateway's degradation: an old driver without some functions. No such driver exists
# here, so a minimal stand-in for the pynvml module (only the names the gateway looks up) plays it.


class NVMLError_NotSupported(Exception):  # pynvml's class name: the gateway reads it
    pass


def old_driver_pynvml(calls: dict[str, int]) -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    def counted(name: str, result: Any) -> Any:
        def fn(*args: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            if isinstance(result, Exception):
                raise result
            return result

        fn.__name__ = name
        return fn

    ns = types.SimpleNamespace
    table = {
        "nvmlInit": None, "nvmlShutdown": None, "nvmlDeviceGetCount": 1, "nvmlDeviceGetHandleByIndex": "h0",
        "nvmlSystemGetDriverVersion": b"470.1", "nvmlDeviceGetName": b"Old GPU", "nvmlDeviceGetUUID": "GPU-old",
        "nvmlDeviceGetMemoryInfo": ns(total=100, used=40, free=60),
        "nvmlDeviceGetUtilizationRates": NVMLError_NotSupported("Not Supported"),
        "nvmlDeviceGetEnforcedPowerLimit": 250_000, "nvmlDeviceGetTemperature": 55, "nvmlDeviceGetClockInfo": 1000,
        "nvmlDeviceGetComputeRunningProcesses": [ns(pid=os.getpid(), usedGpuMemory=2**64 - 1)],
    }  # no nvmlDeviceGetPowerUsage: a function this "driver" lacks
    for name, result in table.items():
        setattr(mod, name, counted(name, result))
    return mod


@pytest.mark.parametrize("background", [False, True], ids=["nvml-started-inline", "nvml-started-in-a-thread"])
def test_a_missing_function_degrades_one_field_and_nvml_is_initialised_once(
    monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    calls: dict[str, int] = {}
    monkeypatch.setitem(sys.modules, "pynvml", old_driver_pynvml(calls))
    sampler = DeviceSampler(background=background)  # in a thread: the first sample() waits for it
    frames = [sampler.sample() for _ in range(3)]
    sampler.close()
    sampler.close()
    gpu = frames[-1].gpus[0]
    assert frames[-1].nvml_available and (gpu.name, gpu.uuid) == ("Old GPU", "GPU-old")
    assert (gpu.mem_used, gpu.mem_total, gpu.power_limit_w, gpu.temp_c, gpu.sm_clock_mhz) == (40, 100, 250.0, 55.0, 1000)
    assert gpu.power_w is None and gpu.util_gpu_pct is None and gpu.util_mem_pct is None
    assert gpu.processes == (GpuProcess(os.getpid(), None, Path("/proc/self/comm").read_text().strip()),)
    assert calls["nvmlInit"] == 1 and calls["nvmlShutdown"] == 1
    assert calls["nvmlDeviceGetUtilizationRates"] == 1  # not supported: never asked again
    assert calls["nvmlDeviceGetMemoryInfo"] == 3
    session = nvml.NvmlSession()
    dev = session.read_device(0)
    session.close()
    assert dev["unavailable"]["power_w"] == "nvmlDeviceGetPowerUsage: not in this nvidia-ml-py"
    assert dev["unavailable"]["util_gpu_pct"].startswith("nvmlDeviceGetUtilizationRates: not supported on this device")
    snap = nvml.snapshot(pids=[12345])
    assert snap == {"available": True, "driver": "470.1", "devices": [
        {"index": 0, "name": "Old GPU", "uuid": "GPU-old", "memory_total": 100, "memory_used": 40, "memory_free": 60,
         "processes": []}]}
