"""`profile` on the vision-language example (examples/tiny_vl_plugin) on a real vLLM CPU engine:
prompts carry an image each (the processor's dummy-image size, random pixels per prompt), the
encoder (``embed_multimodal``: vision tower and projector) is timed apart from the decoder on the
step clock, per step and per phase, and the per-layer tables hold the language model's modules
only. ``--images 0`` gives text prompts and no encoder time."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mm")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_multimodal.py"), str(out), "--only", "mm-ok",
         "mm-embeddings-not-merged"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def example(examples: Path) -> Path:
    return examples / "mm-ok"


def _profile(
    example: Path, out: Path, *args: str, returncode: int = 0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env["PYTHONPATH"] = os.pathsep.join([str(example / "site"), str(REPO)])
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "profile", str(example / "model"), "--out", str(out),
         "--prompts", "3", "--input-len", "24", "--output-len", "8", *args],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def eager(example: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    return _profile(example, tmp_path_factory.mktemp("eager"), "--eager")


def test_prompts_carry_an_image_each_and_the_encoder_is_timed_apart(eager: tuple[Any, dict]) -> None:
    proc, report = eager
    workload = report["profiles"]["workload"]
    assert (workload["images_per_prompt"], workload["image_size"]) == (1, [32, 32])
    assert "1 image(s) each (32x32)" in proc.stderr
    engine = report["profiles"]["engine"]
    steps = engine["steps"]
    # the encoder runs in the step that prefills the prompts (their images), inside the step
    encoded = [s for s in steps if s["encoder_s"] is not None]
    assert encoded and all(s["phase"] != "decode" for s in encoded)
    assert all(0 < s["encoder_s"] < s["step_s"] for s in encoded)
    prefill = engine["phases"]["prefill"]
    assert prefill["encoder_steps"] == len([s for s in encoded if s["phase"] == "prefill"])
    assert prefill["encoder_s"] == pytest.approx(sum(s["encoder_s"] for s in encoded if s["phase"] == "prefill"))
    assert engine["phases"]["decode"]["encoder_steps"] == 0
    assert "  encoder       prefill: " in proc.stdout and "of those steps (embed_multimodal" in proc.stdout


def test_per_layer_tables_hold_the_language_models_modules_only(eager: tuple[Any, dict]) -> None:
    _, report = eager
    names = [m["name"] for m in report["profiles"]["engine"]["layers"]["modules"]]
    assert any(n.startswith("language_model.model.layers.0") for n in names)
    # the vision encoder's layers are not decoder layers: the encoder is one span (encoder_s)
    assert not any(n.startswith(("vision_tower", "multi_modal_projector")) for n in names)
    by_layer = report["profiles"]["engine"]["layers"]["by_layer"]
    assert [row["layer"] for row in by_layer] == [0, 1]


def test_images_zero_runs_text_prompts_without_encoder_time(example: Path, tmp_path: Path) -> None:
    proc, report = _profile(example, tmp_path, "--eager", "--images", "0")
    assert "images_per_prompt" not in report["profiles"]["workload"]
    assert all(s["encoder_s"] is None for s in report["profiles"]["engine"]["steps"])
    assert "  encoder  " not in proc.stdout


def _finding(report: dict, code: str) -> dict:
    (finding,) = [f for f in report["findings"] if f["code"] == code]
    return finding


def test_the_image_embeddings_are_on_the_placeholder_rows(eager: tuple[Any, dict]) -> None:
    """VD213 on the working example: the first embed_input_ids calls with image embeddings put
    every one of them on the rows the mask marks (16 per image)."""
    _, report = eager
    finding = _finding(report, "VD213")
    assert finding["outcome"] == "pass", finding
    # three prompts of one 32x32 image each: 3 x 16 placeholder rows in all, none differs
    assert re.fullmatch(
        r"the image embeddings are on the placeholder positions \(48 row\(s\) in [1-3] call\(s\)\)", finding["message"]
    ), finding


def test_embed_input_ids_that_drops_the_images_is_vd213(examples: Path, tmp_path: Path) -> None:
    """mm-embeddings-not-merged: vLLM runs it silently (tests/engine/test_multimodal_ground_truth.py);
    the doctor compares the merge's output rows with the image embeddings: none of them is there."""
    proc, report = _profile(
        examples / "mm-embeddings-not-merged", tmp_path, "--eager", "--prompts", "2", "--output-len", "2", returncode=1
    )
    finding = _finding(report, "VD213")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    # two prompts of one 32x32 image each: 2 x 16 placeholder rows, prefilled in one step
    assert finding["message"] == (
        "image embeddings not merged at the placeholder positions: 32 of 32 rows differ (1 call(s) checked)"
    )
    assert finding["subject"] == "rank 0: embed_input_ids"
    assert finding["evidence"]["calls"] == [{"items": 2, "rows": 32, "expected_rows": 32, "rows_differ": 32}]
    assert "FAIL  VD213" in proc.stdout
