"""Ground truth for vision-language plugins: what a real vLLM CPU engine does with the tiny
LLaVA-style example (examples/tiny_vl_plugin) and each of its broken variants
(examples/multimodal/NAME), before any check is written for them (issue 32).

The variants are built once (examples/make_multimodal.py), then each runs on its own engine,
one at a time, in a fresh subprocess (tests/engine_mm_harness.py: eager, single process,
64 MiB KV cache): engine start, a greedy text request, and the same greedy request with two
different images. The tests pin the phase that fails, the error the user sees, or the silent
wrong output (tokens that differ from the working example's for the same request).
docs/multimodal.md tabulates the same facts.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import ground_truth

REPO = Path(__file__).resolve().parents[2]
BUILDER = REPO / "examples" / "make_multimodal.py"
VARIANTS_SRC = REPO / "examples" / "multimodal"
OK = "mm-ok"
FAMILY = ground_truth.FAMILIES["multimodal"]

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]

NO_PROCESSOR_WARNING = "is treated as multimodal but has no registered multimodal processor; running in text-only mode."
TEXT_ONLY_ERROR = "ValueError: Multi-modal processor not available for text-only models"
REPLACEMENT_ERROR = "AssertionError: Failed to apply prompt replacement for mm_items['image'][0]"
WARMUP_FAILED = "Multi-modal warmup failed"
NONE_EMBEDDINGS_ERROR = (
    "AssertionError: Expected multimodal embeddings to be a list/tuple of 2D tensors, or a single 3D tensor, but got "
    "<class 'NoneType'> instead. This is most likely due to incorrect implementation of the model's `embed_multimodal`"
)
UNMAPPED_ERROR = "ValueError: There is no module or parameter named 'model' in TinyDoctorVLForConditionalGeneration."
# where vLLM 0.32 processes a request's image (the caller's renderer, before the engine core)
RENDERER_FRAME = "base.py:_process_multimodal"
PHASE_NAMES = ("start", "text", "image", "image_other")


@pytest.fixture(scope="module")
def mm_truth(tmp_path_factory: pytest.TempPathFactory) -> ground_truth.Truth:
    """Every multimodal variant built; the family's live ones run on a real engine now, two at a
    time, the others as recorded for this vLLM (tests/fixtures/ground_truth.py; all live without
    a recording)."""
    out = tmp_path_factory.mktemp("mm-examples")
    subprocess.run([sys.executable, str(BUILDER), str(out)], check=True, capture_output=True, timeout=600)
    jobs = {d.name: d for d in sorted(out.iterdir()) if d.is_dir()}
    truth = ground_truth.gather(FAMILY, tmp_path_factory.getbasetemp(), jobs=jobs)
    shown = {name: {k: v for k, v in r.items() if k != "log"} for name, r in truth.answers.items()}
    (tmp_path_factory.getbasetemp() / "mm_ground_truth.json").write_text(json.dumps(shown, indent=2))
    return truth


@pytest.fixture(scope="module")
def mm_results(mm_truth: ground_truth.Truth) -> dict[str, dict[str, Any]]:
    return mm_truth.answers


def test_the_live_variants_answer_as_recorded(mm_truth: ground_truth.Truth) -> None:
    """vLLM still does with the family's live variants what it did when it was recorded."""
    ground_truth.assert_as_recorded("multimodal", mm_truth)


def _ok_beside(truth: ground_truth.Truth, name: str) -> dict[str, Any]:
    """The working example's answer from the same run as ``name``'s (recorded or live)."""
    result = truth.beside(name, OK)
    assert "harness_error" not in result, _describe(result)
    return result


def _describe(result: dict[str, Any]) -> str:
    log = Path(result["log_path"]).read_text() if "log_path" in result else ""
    return json.dumps(result, indent=1)[:6000] + "\n--- log tail ---\n" + log[-3000:]


def _get(results: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    result = results[name]
    assert "harness_error" not in result, _describe(result)
    return result


def _log(result: dict[str, Any]) -> str:
    return Path(result["log_path"]).read_text()


def _warnings(result: dict[str, Any]) -> set[str]:
    """The engine log's warnings, without their time and source line."""
    return set(re.findall(r"WARNING [\d-]+ [\d:]+ \[[^\]]*\] (.*)", _log(result)))


def _assert_failed(phase: dict[str, Any] | None, error: str, frames: tuple[str, ...], result: dict[str, Any]) -> None:
    assert phase is not None and phase["ok"] is False, _describe(result)
    assert error in phase["error_message"], _describe(result)
    for frame in frames:
        assert frame in phase["frames"], f"{frame} not in the traceback\n" + _describe(result)


def _tokens(result: dict[str, Any], phase: str) -> list[int]:
    assert result[phase] is not None and result[phase]["ok"] is True, _describe(result)
    assert result[phase]["logprobs_finite"] is True, _describe(result)
    tokens = result[phase]["token_ids"]
    assert len(tokens) > 0, _describe(result)
    return tokens


def test_every_variant_is_pinned_here() -> None:
    built = {OK, *(p.name for p in VARIANTS_SRC.iterdir() if (p / "variant.py").is_file())}
    assert built == {
        OK,
        "mm-processor-not-registered",
        "mm-not-supports-multimodal",
        "mm-image-token-mismatch",
        "mm-image-token-mismatch-precomputed",
        "mm-vision-weights-skipped",
        "mm-unmapped-weight-prefix",
        "mm-embeddings-not-merged",
        "mm-no-embed-multimodal",
        "mm-ok-truncated-tower",
    }


def test_working_example_serves_text_and_images(mm_results: dict[str, dict[str, Any]]) -> None:
    result = _get(mm_results, OK)
    assert result["start"] == {"ok": True}, _describe(result)
    text, red, noise = (_tokens(result, p) for p in ("text", "image", "image_other"))
    # the image reaches the decoder: it changes the answer, and two images answer differently
    assert red != text and noise != text and red != noise
    assert result["vision_embeds_finite"] is True
    log = _log(result)
    assert "Resolved architecture: TinyDoctorVLForConditionalGeneration" in log
    assert NO_PROCESSOR_WARNING not in log and WARMUP_FAILED not in log


def test_processor_not_registered_runs_text_only(
    mm_results: dict[str, dict[str, Any]], mm_truth: ground_truth.Truth
) -> None:
    """(a) start: one warning; text as the working example; an image request is refused in
    the caller's input processing."""
    result, ok = _get(mm_results, "mm-processor-not-registered"), _ok_beside(mm_truth, "mm-processor-not-registered")
    assert result["start"] == {"ok": True}, _describe(result)
    assert NO_PROCESSOR_WARNING in _log(result)
    assert _tokens(result, "text") == _tokens(ok, "text")
    for phase in ("image", "image_other"):
        _assert_failed(result[phase], TEXT_ONLY_ERROR, (RENDERER_FRAME,), result)


def test_not_supports_multimodal_starts_silently(
    mm_results: dict[str, dict[str, Any]], mm_truth: ground_truth.Truth
) -> None:
    """(b) no warning at all (limit_mm_per_prompt is accepted and ignored); text as the
    working example; an image request is refused with the same error as (a)."""
    result, ok = _get(mm_results, "mm-not-supports-multimodal"), _ok_beside(mm_truth, "mm-not-supports-multimodal")
    assert result["start"] == {"ok": True}, _describe(result)
    log = _log(result)
    assert NO_PROCESSOR_WARNING not in log and "Multi-modal" not in log
    assert _tokens(result, "text") == _tokens(ok, "text")
    for phase in ("image", "image_other"):
        _assert_failed(result[phase], TEXT_ONLY_ERROR, (RENDERER_FRAME,), result)


def test_image_token_mismatch_fails_at_start(mm_results: dict[str, dict[str, Any]]) -> None:
    """(c) start fails before the model is loaded: the caller's input processor sizes the
    encoder budget by processing a dummy prompt + image, whose replacement finds no target."""
    result = _get(mm_results, "mm-image-token-mismatch")
    frames = (
        "input_processor.py:__init__",
        "encoder_budget.py:get_mm_max_toks_per_item",
        "processor.py:get_dummy_mm_inputs",
        "processor.py:_matched_updates_from_result",
    )
    _assert_failed(result["start"], REPLACEMENT_ERROR, frames, result)
    assert not any("load_model" in frame for frame in result["start"]["frames"]), _describe(result)
    assert all(result[p] is None for p in PHASE_NAMES[1:])


def test_image_token_mismatch_with_precomputed_budget_fails_per_request(
    mm_results: dict[str, dict[str, Any]], mm_truth: ground_truth.Truth
) -> None:
    """(c') the same mistake when the processor gives get_mm_max_tokens_per_item: the engine
    starts (the warmup's failure is one warning without its reason), text works, every image
    request fails with (c)'s assertion."""
    result, ok = (
        _get(mm_results, "mm-image-token-mismatch-precomputed"),
        _ok_beside(mm_truth, "mm-image-token-mismatch-precomputed"),
    )
    assert result["start"] == {"ok": True}, _describe(result)
    log = _log(result)
    assert WARMUP_FAILED in log and "Failed to apply prompt replacement" not in log
    assert _tokens(result, "text") == _tokens(ok, "text")
    for phase in ("image", "image_other"):
        _assert_failed(result[phase], REPLACEMENT_ERROR, (RENDERER_FRAME, "processor.py:apply"), result)


def test_vision_weights_skipped_answers_differently_without_error(
    mm_results: dict[str, dict[str, Any]], mm_truth: ground_truth.Truth
) -> None:
    """(d) no error, no warning: the vision tower keeps PyTorch's default initialisation
    (finite, seeded), so image answers differ from the working example's; text is identical."""
    result, ok = _get(mm_results, "mm-vision-weights-skipped"), _ok_beside(mm_truth, "mm-vision-weights-skipped")
    assert result["start"] == {"ok": True}, _describe(result)
    assert _tokens(result, "text") == _tokens(ok, "text")
    for phase in ("image", "image_other"):
        assert _tokens(result, phase) != _tokens(ok, phase), _describe(result)
    assert result["vision_embeds_finite"] is True  # garbage, not NaN
    assert "not initialized from checkpoint" not in _log(result)


def test_truncated_tower_answers_as_the_working_example(
    mm_results: dict[str, dict[str, Any]], mm_truth: ground_truth.Truth
) -> None:
    """The vision tower built up to vision_feature_layer (vLLM's LLaVA's rule) over a checkpoint
    that holds one layer more, which its load_weights skips: starts without a word and answers
    exactly as mm-ok (the built layer, post_layernorm and projector are mm-ok's). The doctor
    reports nothing for it (tests/unit/test_multimodal_weights_replies.py, on recorded pass replies)."""
    result, ok = _get(mm_results, "mm-ok-truncated-tower"), _ok_beside(mm_truth, "mm-ok-truncated-tower")
    assert result["start"] == {"ok": True}, _describe(result)
    for phase in PHASE_NAMES[1:]:
        assert _tokens(result, phase) == _tokens(ok, phase), _describe(result)
    assert result["vision_embeds_finite"] is True
    assert "not initialized from checkpoint" not in _log(result)


def test_unmapped_weight_prefix_fails_loading_weights(mm_results: dict[str, dict[str, Any]]) -> None:
    """(e) start fails while loading weights: AutoWeightsLoader meets `model.vision_tower.*`,
    which the mapper left as is, and finds no child module `model`."""
    result = _get(mm_results, "mm-unmapped-weight-prefix")
    frames = ("cpu_model_runner.py:load_model", "utils.py:_load_module")
    _assert_failed(result["start"], UNMAPPED_ERROR, frames, result)
    assert all(result[p] is None for p in PHASE_NAMES[1:])


def test_embeddings_not_merged_ignores_the_image_silently(
    mm_results: dict[str, dict[str, Any]], mm_truth: ground_truth.Truth
) -> None:
    """(f) no error, no warning: embed_input_ids drops the image embeddings, so the decoder sees
    the <image> token's embedding on every placeholder: two different images give the same
    tokens, which are not the working example's; text is identical."""
    result, ok = _get(mm_results, "mm-embeddings-not-merged"), _ok_beside(mm_truth, "mm-embeddings-not-merged")
    assert result["start"] == {"ok": True}, _describe(result)
    assert _tokens(result, "text") == _tokens(ok, "text")
    red, noise = _tokens(result, "image"), _tokens(result, "image_other")
    assert red == noise, _describe(result)  # the image does not matter
    assert red != _tokens(ok, "image") and noise != _tokens(ok, "image_other")
    assert result["vision_embeds_finite"] is True  # the tower itself works
    assert _warnings(result) == _warnings(ok)  # not one warning more than the working example's


def test_no_embed_multimodal_fails_every_image_request_in_the_engine_core(
    mm_results: dict[str, dict[str, Any]], mm_truth: ground_truth.Truth
) -> None:
    """(g) the encoder method under its pre-rename name (get_multimodal_embeddings): the engine
    starts and serves text; SupportsMultiModal's empty embed_multimodal returns None, which vLLM's
    sanity check of the encoder output refuses in the engine core (the runner's
    _execute_mm_encoder), on every image request."""
    result, ok = _get(mm_results, "mm-no-embed-multimodal"), _ok_beside(mm_truth, "mm-no-embed-multimodal")
    assert result["start"] == {"ok": True}, _describe(result)
    assert _tokens(result, "text") == _tokens(ok, "text")
    frames = ("core.py:step", "gpu_model_runner.py:_execute_mm_encoder", "utils.py:sanity_check_mm_encoder_outputs")
    for phase in ("image", "image_other"):
        _assert_failed(result[phase], NONE_EMBEDDINGS_ERROR, frames, result)
        assert RENDERER_FRAME not in result[phase]["frames"]  # past the caller's processing
