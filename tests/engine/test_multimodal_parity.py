"""Parity with image inputs (issue 32, item 4), against a real vLLM engine on CPU.

The tiny vision-language example (examples/tiny_vl_plugin, built by examples/make_multimodal.py)
against its Hugging Face class (tiny_doctor_vl_model/modeling.py), one seeded image per prompt:

- the working example agrees, tower and projector included;
- the same engine against a reference whose projector uses ReLU where the vLLM class uses GELU,
  through the pytest plugin's assert_logprobs_close: the verdict is "projector" (the tower's
  output matches on the same pixel values);
- mm-vision-weights-skipped (vLLM's tower keeps its construction values): "vision tower".

Two engines in all (one per model, module-scoped), each started with only its own plugin on
PYTHONPATH (both register the same architecture name); the reference children see both sites.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from vllm_doctor.api import compare_with_reference, parity_engine_key
from vllm_doctor.pytest_plugin.fixtures import VllmDoctor
from vllm_doctor.pytest_plugin.session import DoctorSession
from vllm_doctor.stages.options import EngineOptions
from vllm_doctor.stages.parity import ParityEngine, ParityOptions, engine_options, run_parity

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed"),
]
BUILDER = REPO / "examples" / "make_multimodal.py"
OK, SKIPPED = "mm-ok", "mm-vision-weights-skipped"
PACKAGES = {OK: "tiny_doctor_vl_model", SKIPPED: "tiny_doctor_vl_vision_weights_skipped"}
PROMPTS = ["hello world my name is", "the doctor is in"]
RELU_REFERENCE = '''
from torch import nn

from tiny_doctor_vl_model.modeling import TinyDoctorVLForConditionalGeneration


class ReluProjectorReference(TinyDoctorVLForConditionalGeneration):
    """The reference with ReLU in the projector, where the vLLM class has GELU."""

    def __init__(self, config):
        super().__init__(config)
        self.multi_modal_projector.act = nn.ReLU()
'''


def _options(variant: str, hf_class: str | None = None, device: str = "cpu") -> ParityOptions:
    return ParityOptions(
        hf_class=hf_class or f"{PACKAGES[variant]}.modeling:TinyDoctorVLForConditionalGeneration",
        prompts=list(PROMPTS),
        max_tokens=4,
        device=device,
        # on a GPU two engines of the module live at once: each takes a share of the memory
        engine_args={"gpu_memory_utilization": 0.3} if device == "cuda" else {},
        images=1,
    )


GIVEN_PYTHONPATH = os.environ.get("PYTHONPATH")  # before the module's fixtures put sites on it


def _path(*parts: str | Path) -> str:
    return os.pathsep.join(str(p) for p in (*parts, GIVEN_PYTHONPATH) if p)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Both variants built; while the module runs, the reference children import either plugin
    (and the ReLU reference's file)."""
    out = tmp_path_factory.mktemp("mm-parity")
    subprocess.run([sys.executable, str(BUILDER), str(out), "--only", OK, SKIPPED], check=True, timeout=300)
    (out / "relu_reference.py").write_text(RELU_REFERENCE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", _path(out / OK / "site", out / SKIPPED / "site", out, REPO))
        yield out


def _engine(built: Path, variant: str, device: str = "cpu") -> ParityEngine:
    with pytest.MonkeyPatch.context() as mp:  # the engine's process: its own plugin only
        mp.setenv("PYTHONPATH", _path(built / variant / "site", REPO))
        return ParityEngine(str(built / variant / "model"), engine_options(_options(variant, device=device)))


@pytest.fixture(scope="module")
def ok_engine(built: Path) -> Iterator[ParityEngine]:
    engine = _engine(built, OK)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def skipped_engine(built: Path) -> Iterator[ParityEngine]:
    engine = _engine(built, SKIPPED)
    try:
        yield engine
    finally:
        engine.close()


def test_the_working_example_matches_its_reference_with_images(built: Path, ok_engine: ParityEngine) -> None:
    result = compare_with_reference(
        str(built / OK / "model"),
        engine=ok_engine,
        hf_class=f"{PACKAGES[OK]}.modeling:TinyDoctorVLForConditionalGeneration",
        prompts=PROMPTS,
        max_tokens=4,
        device="cpu",
        images=1,
    )
    assert result.ok, result.message()
    assert result.images == 1 and result.first_divergent is None
    assert result.engine["model_class"].endswith("TinyDoctorVLForConditionalGeneration")
    assert result.max_logprob_diff < 1e-4, result.message()
    # the tower and the projector were compared on the same pixel values (16 patches of one image)
    parts = {row.part: row for row in result.encoder}
    assert sorted(parts) == ["projector", "vision tower"], result.message()
    assert parts["vision tower"].name == "vision_tower" and parts["projector"].name == "multi_modal_projector"
    assert all(row.rows == 16 and row.max_rel <= result.hidden_rtol for row in parts.values())
    # every decoder layer, on the prefill with the image's 16 placeholder positions expanded
    assert [row.layer for row in result.layers] == [0, 1]
    assert all(row.max_rel <= result.hidden_rtol for row in result.layers)
    assert "the vision tower and projector outputs match" in result.message()


def test_vision_weights_left_at_construction_values_are_named(built: Path, skipped_engine: ParityEngine) -> None:
    result = run_parity(str(built / SKIPPED / "model"), _options(SKIPPED), engine=skipped_engine)
    assert not result.ok, result.message()
    assert result.first_divergent == "vision tower", result.message()
    tower = next(row for row in result.encoder if row.part == "vision tower")
    assert tower.max_rel > 0.1, result.message()  # construction values, not a rounding difference
    text = result.message()
    assert "the vision tower's output differs first" in text
    assert "load_weights" in text
    assert result.to_dict()["first_divergent"] == "vision tower"


def test_a_projector_that_differs_from_the_reference_is_named_by_the_pytest_plugin(
    built: Path, ok_engine: ParityEngine
) -> None:
    """vllm_doctor.assert_logprobs_close(images=1) against a reference with ReLU in its projector:
    it fails naming the projector (the tower matches exactly on the same pixel values). The
    session's parity engine for those options is the module's: no engine is started here."""
    model = str(built / OK / "model")
    session = DoctorSession(engine=EngineOptions(device="cpu"))
    session.engines[parity_engine_key(model, dtype="float32", device="cpu", images=1)] = ok_engine
    doctor = VllmDoctor(session, "test_a_projector_that_differs_from_the_reference_is_named_by_the_pytest_plugin")
    with pytest.raises(pytest.fail.Exception) as failed:
        doctor.assert_logprobs_close(
            model, hf_class="relu_reference:ReluProjectorReference", prompts=PROMPTS, max_tokens=4, images=1
        )
    text = str(failed.value)
    assert "prefill of prompt 0: the projector's output differs first" in text
    assert "gelu vs relu" in text  # the fix names the activation
    assert session.runs.get("parity_engine", 0) == 0  # the module's engine served it
    outcome = session.outcomes[-1]
    assert not outcome.ok and outcome.summary.startswith("first divergent: the projector (prefill of prompt 0)")
    parity = outcome.details["parity"]
    assert parity["first_divergent"] == "projector" and parity["images"] == 1
    parts = {row["part"]: row for row in parity["encoder"]}
    assert parts["vision tower"]["max_rel"] <= parity["hidden_rtol"] < parts["projector"]["max_rel"]
    assert parity["layers_on"] == {"prompt": 0, "step": 0, "phase": "prefill"}
