"""The profiler's numbers in vLLM's default mode on an NVIDIA GPU (torch.compile + CUDA graphs
FULL_AND_PIECEWISE, async scheduling): ``vllm-doctor profile`` on a tiny Llama, one engine.

Asserts what must hold whatever the machine's speed: every step on the device's clock (CUDA
events), the steps adding up to no more than the workload's wall time (one engine's steps do not
overlap), per-layer times on decode steps that replay FULL CUDA graphs (events captured into the
graphs), the layers accounting for the sampled forwards, no rate above the device's peak, and
the CUDA-graph pool's bytes measured. No wall-clock thresholds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.gpu.test_engine_gpu import GPU_DIMS, REPO_ROOT, pytestmark  # noqa: F401  (markers: gpu, engine, skips)
from vllm_doctor.constants import GRAPH_TIMING_ENV


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.fixtures.engine_models import build_llama_dir

    tmp = tmp_path_factory.mktemp("gpu-timing")
    model = build_llama_dir(tmp / "tiny-llama", ["LlamaForCausalLM"], GPU_DIMS)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", GRAPH_TIMING_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    out = tmp / "prof"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "profile", str(model), "--out", str(out), "-q", "--prompts", "16",
         "--input-len", "64", "--output-len", "64", "--max-model-len", "512",
         "--engine-arg", "gpu_memory_utilization=0.3"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert (out / "report.json").is_file(), f"profile failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    report = json.loads((out / "report.json").read_text())
    report["_text"] = proc.stdout
    return report


def test_default_mode_is_what_ran(profiled: dict[str, Any]) -> None:
    compile_state = profiled["facts"]["engine"]["compile"]
    assert compile_state["compiled"] and compile_state["cudagraph_mode"] == "FULL_AND_PIECEWISE", compile_state


def test_the_sampled_steps_are_on_the_device_clock_and_they_fit_in_the_wall_time(profiled: dict[str, Any]) -> None:
    """The sampled step clock (the default on a GPU): every sampled step on CUDA events, the others
    on CUDA events (a sample's next step) or their host span; the device-clock steps of one engine
    do not overlap."""
    engine, workload = profiled["profiles"]["engine"], profiled["profiles"]["workload"]
    assert engine["clock"] == "cuda_events" and engine["step_clock"] == "sampled"
    steps = engine["steps"]
    assert steps and all(s["step_clock"] == "cuda_events" for s in steps if s["sampled"])
    assert {s["step_clock"] for s in steps} <= {"cuda_events", "host"}
    total = sum(s["step_s"] for s in steps if s["step_clock"] == "cuda_events")
    assert 0 < total <= workload["wall_s"] * 1.001


def test_decode_steps_in_full_graphs_have_layer_times(profiled: dict[str, Any]) -> None:
    engine = profiled["profiles"]["engine"]
    assert engine["layers_on"] is True and "captured into" in engine["layers_reason"], engine["layers_reason"]
    decode_timed = [s for s in engine["steps"] if s["phase"] == "decode" and s["layers_timed"]]
    assert decode_timed and all(s["forward_s"] and s["forward_s"] <= s["step_s"] for s in decode_timed)
    layers = engine["layers"]
    assert layers["timed_fraction"] >= 0.9
    per_layer = {b["layer"]: b for b in layers["by_layer"]}
    assert sorted(per_layer) == list(range(GPU_DIMS["num_hidden_layers"]))
    assert all(b["kinds"].get("attention", 0) > 0 and b["kinds"].get("dense", 0) > 0 for b in per_layer.values())
    decode_s = {m["name"]: m["decode_s"] for m in layers["modules"] if m["kind"] == "attention"}
    assert len(decode_s) == GPU_DIMS["num_hidden_layers"] and all(v > 0 for v in decode_s.values())


def test_no_rate_above_the_devices_peak_and_graph_memory_measured(profiled: dict[str, Any]) -> None:
    engine = profiled["profiles"]["engine"]
    roof = engine.get("roofline") or {}
    phases = roof.get("phases") or {}
    assert phases, roof
    for name, phase in phases.items():
        for key in ("bandwidth_share", "compute_share"):
            share = phase.get(key)
            assert share is None or 0 < share <= 1.0, (name, key, share)
    parts = engine["memory"][0]["parts"]
    assert parts["cuda_graphs"] and parts["cuda_graphs"] > 0


def test_a_refresh_keeps_the_stream_until_it_changes_and_then_follows_it() -> None:
    """CudaEventClock looks up the current stream at each step's start: by its raw handle, the
    Stream object rebuilt only when the stream changed; marks on a second stream are seen as such."""
    import torch

    from vllm_doctor.engine.clock import CudaEventClock

    clock = CudaEventClock()
    first = clock.mark(True)
    stream = clock._stream
    second = clock.mark(True)
    assert clock._stream is stream and clock.one_stream  # the same stream: the object kept
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        third = clock.mark(True)
        assert clock._stream == side and not clock.one_stream
    fourth = clock.mark(True)
    assert clock._stream == torch.cuda.current_stream()
    for event in (first, second, third, fourth):
        event.synchronize()
    assert clock.seconds(first, second) >= 0 and clock.seconds(second, fourth) >= 0
