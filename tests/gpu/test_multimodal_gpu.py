"""The vision-language example on an NVIDIA GPU (``pytest -m gpu tests/gpu/test_multimodal_gpu.py``).

What tests/engine/test_multimodal_parity.py and tests/unit/test_multimodal_profile_replies.py assert on CPU, on
``cuda``: parity with one image per prompt (the working example agrees, vision tower and
projector included; the variant whose tower keeps its construction values is named "vision
tower"), and a profile in vLLM's default mode whose encoder calls are timed on the device clock,
whose encoder cache is counted and whose image embeddings are on the placeholder rows (VD213).
float32 for parity, the model's bf16 for the profile."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.engine.test_multimodal_parity import OK, PACKAGES, PROMPTS, SKIPPED, _engine, _options, built
from tests.gpu.test_engine_gpu import _cuda
from vllm_doctor.api import compare_with_reference
from vllm_doctor.stages.parity import ParityEngine, run_parity

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(not _cuda(), reason="no CUDA device"),
]
__all__ = ["built"]  # the fixture, shared with the CPU tests


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mm")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_multimodal.py"), str(out), "--only", "mm-ok",
         "mm-embeddings-not-merged"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return out


def _profile(
    example: Path, out: Path, *args: str, returncode: int = 0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``vllm-doctor profile`` of an example variant as a user runs it (its plugin site on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    # what PYTHONPATH already holds stays after them (the GPU machine carries vLLM in that way)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(example / "site"), str(REPO), os.environ.get("PYTHONPATH")] if p)
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "profile", str(example / "model"), "--out", str(out),
         "--prompts", "3", "--input-len", "24", "--output-len", "8", *args],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "report.json").read_text())


# first: before the parity engines of the module take their share of the memory
def test_the_encoder_on_the_device_clock_in_vllms_default_mode(examples: Path, tmp_path: Path) -> None:
    _, report = _profile(examples / "mm-ok", tmp_path, "--engine-arg", "gpu_memory_utilization=0.3")
    engine = report["profiles"]["engine"]
    assert engine["clock"] == "cuda_events"
    encoded = [s for s in engine["steps"] if s["encoder_s"] is not None]
    assert encoded and all(0 < s["encoder_s"] < s["step_s"] for s in encoded)
    use = engine["encoder_cache"]
    prompts = report["profiles"]["workload"]["prompts"]
    assert use["items"] == prompts and use["rows"] == 16 * prompts and use["budget_rows"]
    (merge,) = [f for f in report["findings"] if f["code"] == "VD213"]
    assert merge["outcome"] == "pass", merge
    assert engine["time_accounting"]["measured_share"] == pytest.approx(1.0, abs=0.05)


@pytest.fixture(scope="module")
def ok_engine(built: Path) -> Iterator[ParityEngine]:
    engine = _engine(built, OK, device="cuda")
    try:
        yield engine
    finally:
        engine.close()


def test_the_working_example_matches_its_reference_with_images_on_cuda(built: Path, ok_engine: ParityEngine) -> None:
    result = compare_with_reference(
        str(built / OK / "model"), engine=ok_engine, prompts=PROMPTS, max_tokens=4, device="cuda", images=1,
        engine_args={"gpu_memory_utilization": 0.3},
        hf_class=f"{PACKAGES[OK]}.modeling:TinyDoctorVLForConditionalGeneration",
    )  # fmt: skip
    assert result.ok, result.message()
    assert result.engine["device"] == "cuda" and result.images == 1
    assert sorted(row.part for row in result.encoder) == ["projector", "vision tower"]
    assert all(row.max_rel <= result.hidden_rtol for row in result.encoder), result.message()


def test_the_skipped_vision_weights_are_named_on_cuda(built: Path) -> None:
    engine = _engine(built, SKIPPED, device="cuda")
    try:
        result = run_parity(str(built / SKIPPED / "model"), _options(SKIPPED, device="cuda"), engine=engine)
    finally:
        engine.close()
    assert not result.ok and result.first_divergent == "vision tower", result.message()
