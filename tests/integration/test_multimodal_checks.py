"""The doctor on the vision-language example (examples/tiny_vl_plugin) and the variants whose
mistake is in the class's multimodal registration or its processor: VD209 (no processor
registered), VD210 (not SupportsMultiModal), VD211 (the processor fails on vLLM's start-up dummy
inputs: an image token id the prompt update does not find), and none of them on the working example, whose LM head sits under its
decoder's prefix (``language_model.lm_head.weight``: no VD307). What the real engine does with the
same variants: tests/engine/test_multimodal_ground_truth.py."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import REPO, doctor_json

VARIANTS = (
    "mm-ok",
    "mm-processor-not-registered",
    "mm-not-supports-multimodal",
    "mm-image-token-mismatch",
    "mm-image-token-mismatch-precomputed",
)
CLS = "tiny_doctor_vl{}.model:TinyDoctorVLForConditionalGeneration"


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("mm-examples")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_multimodal.py"), str(out), "--only", *VARIANTS],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(VARIANTS, pool.map(lambda n: doctor_json(out, n), VARIANTS), strict=True))


def _by_code(report: dict, code: str) -> dict:
    (finding,) = [f for f in report["findings"] if f["code"] == code]
    return finding


def test_working_vision_language_example_passes_the_multimodal_and_lm_head_checks(reports: dict[str, dict]) -> None:
    report = reports["mm-ok"]
    assert _by_code(report, "VD209")["outcome"] == "pass"
    assert _by_code(report, "VD210")["outcome"] == "pass"
    assert _by_code(report, "VD211")["outcome"] == "pass"
    assert "image: 16 token(s)" in _by_code(report, "VD211")["message"]  # the processor's dummy image
    assert _by_code(report, "VD307")["outcome"] == "pass"  # language_model.lm_head.weight is the head
    # every tower loads (the weights by tower: tests/integration/test_multimodal_weights.py)
    assert [_by_code(report, c)["outcome"] for c in ("VD301", "VD302", "VD313")] == ["pass", "pass", "pass"]
    errors = [f["code"] for f in report["findings"] if f["outcome"] == "fail" and f["severity"] == "error"]
    assert errors == []


def test_processor_not_registered_is_vd209(reports: dict[str, dict]) -> None:
    finding = _by_code(reports["mm-processor-not-registered"], "VD209")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert finding["subject"] == CLS.format("_processor_not_registered")
    assert "Multi-modal processor not available for text-only models" in finding["message"]
    assert "register_processor" in finding["hint"]
    assert _by_code(reports["mm-processor-not-registered"], "VD210")["outcome"] == "pass"


def test_class_without_supports_multimodal_is_vd210(reports: dict[str, dict]) -> None:
    report = reports["mm-not-supports-multimodal"]
    finding = _by_code(report, "VD210")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert finding["subject"] == CLS.format("_not_supports_multimodal")
    assert finding["evidence"]["config_keys"] == ["image_token_index"]
    assert "SupportsMultiModal" in finding["hint"]
    assert _by_code(report, "VD209")["outcome"] == "not_applicable"


@pytest.mark.parametrize(
    ("variant", "when"),
    [
        ("mm-image-token-mismatch", "vLLM fails at engine start, building its dummy inputs"),
        # the processing info declares its tokens per item: vLLM skips the build at start, fails per request
        ("mm-image-token-mismatch-precomputed", "vLLM starts (one warning: 'Multi-modal warmup failed')"),
    ],
)
def test_image_token_the_prompt_update_does_not_find_is_vd211(reports: dict[str, dict], variant: str, when: str) -> None:
    finding = _by_code(reports[variant], "VD211")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert "AssertionError: Failed to apply prompt replacement for mm_items['image'][0]" in finding["message"]
    assert when in finding["message"]
    assert finding["evidence"]["stage"] == "dummy_inputs"
    assert "get_dummy_mm_inputs" in finding["evidence"]["traceback"]  # vLLM's own frames
    assert "image_token_index = 32000" in finding["hint"]
    assert _by_code(reports[variant], "VD209")["outcome"] == "pass"


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """The working example with bad input in its model directory: a processor file that is not
    JSON, an image token id outside the vocabulary."""
    import shutil

    out = tmp_path_factory.mktemp("mm-bad")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_multimodal.py"), str(out), "--only", "mm-ok"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    for name in ("not-json", "token-outside-vocab"):
        shutil.copytree(out / "mm-ok", out / name)
    (out / "not-json" / "model" / "preprocessor_config.json").write_text("{not json")
    config_path = out / "token-outside-vocab" / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config["image_token_index"] = config["vocab_size"] + 1000
    config_path.write_text(json.dumps(config))
    from tests.conftest import run_doctor, variant_env

    return {
        name: run_doctor(["check", str(out / name / "model"), "--json", "-q"], variant_env(out, name))
        for name in ("not-json", "token-outside-vocab")
    }


def test_a_processor_file_that_is_not_json_is_vllms_refusal_not_a_crash(bad_inputs: dict) -> None:
    proc = bad_inputs["not-json"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    finding = _by_code(json.loads(proc.stdout), "VD111")
    assert finding["outcome"] == "fail"
    assert "preprocessor_config.json' is not a valid JSON file" in finding["message"]


def test_an_image_token_outside_the_vocabulary_is_vd211_with_the_vocabulary(bad_inputs: dict) -> None:
    proc = bad_inputs["token-outside-vocab"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    finding = _by_code(json.loads(proc.stdout), "VD211")
    assert finding["outcome"] == "fail"
    assert "image_token_index = 1512; outside the vocabulary of 512 token(s)" in finding["hint"]
