"""`profile` on the vision-language example (examples/tiny_vl_plugin) on its engine's recorded replies
(tests/fixtures/engine_replies.py, cases ``mm-ok-eager``, ``mm-ok-twin``,
``mm-embeddings-not-merged-eager``, recorded on a vLLM CPU engine by
``tools/record_engine_replies.py``): prompts carry an image each (the processor's dummy-image size,
random pixels per prompt), the encoder (``embed_multimodal``: vision tower and projector) is timed
apart from the decoder on the step clock, per step and per phase, and the per-layer tables hold the
language model's modules only."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import engine_replies


def _replayed(case: str, workdir: Path, returncode: int = 0) -> tuple[engine_replies.Run, dict[str, Any]]:
    run = engine_replies.replay(case, workdir)
    assert run.rc == returncode, run.stdout[-3000:] + run.stderr[-3000:]
    return run, run.report()


@pytest.fixture(scope="module")
def eager(tmp_path_factory: pytest.TempPathFactory) -> tuple[engine_replies.Run, dict]:
    return _replayed("mm-ok-eager", tmp_path_factory.mktemp("eager"))


def test_prompts_carry_an_image_each_and_the_encoder_is_timed_apart(eager: tuple[Any, dict]) -> None:
    proc, report = eager
    workload = report["profiles"]["workload"]
    assert (workload["images_per_prompt"], workload["image_size"]) == (1, [32, 32])
    assert " in + 1 image (32x32) / " in proc.stdout  # the workload line
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


def test_the_time_before_the_first_step_is_measured_not_left_over(eager: tuple[Any, dict]) -> None:
    """The image processor runs before the first step (requests in): the report measures that
    stretch and the one after the last step on the host's monotonic clock, so steps + the gaps
    between them + both edges is a sum that can miss the wall time, and here does not."""
    proc, report = eager
    acc = report["profiles"]["engine"]["time_accounting"]
    span = report["profiles"]["engine"]["host_span_s"]
    start, wall = report["profiles"]["workload"]["host_start_s"], report["profiles"]["workload"]["wall_s"]
    assert acc["before_first_s"] == pytest.approx(span[0] - start) and acc["before_first_s"] > 0
    assert acc["after_last_s"] == pytest.approx(max(0.0, start + wall - span[1]), abs=1e-6)
    assert acc["measured_share"] == pytest.approx(1.0, abs=0.05)
    assert "before the first step (requests in: tokenizing, a multimodal processor)" in proc.stdout
    assert "each measured on the host's clock" in proc.stdout


def test_the_encoder_cache_use_is_reported(eager: tuple[Any, dict]) -> None:
    """The doctor's wrapper on embed_multimodal counts what each call returned and the runner's
    encoder cache at its fullest, against the budget vLLM sized it by: each prompt's image is its
    own (random pixels), so each is encoded once, 16 rows each (32x32 px in 8x8 patches)."""
    proc, report = eager
    use = report["profiles"]["engine"]["encoder_cache"]
    prompts = report["profiles"]["workload"]["prompts"]
    assert use["items"] == prompts and use["rows"] == 16 * prompts and 1 <= use["calls"] <= prompts
    assert 1 <= use["peak_entries"] <= prompts and use["peak_rows"] == 16 * use["peak_entries"]
    assert use["peak_bytes"] == use["peak_rows"] * 128 * 2  # rows of the decoder's width (128), bf16
    assert use["budget_rows"] and use["budget_rows"] >= use["peak_rows"]
    assert use["budget_source"] in ("mm_budget.encoder_cache_size", "scheduler_config.encoder_cache_size")
    assert f"  encoder cache {prompts} item(s) encoded in {use['calls']} call(s) ({16 * prompts} embedding rows, each fed image once)" in proc.stdout


def test_the_roofline_is_the_decoders(eager: tuple[Any, dict]) -> None:
    """The rates are the decoder's: the encoder's weights (the worker's own count of the parameters
    outside the language model) and the encoder's time in the prefill steps are left out."""
    _, report = eager
    engine = report["profiles"]["engine"]
    roof, prefill = engine["roofline"], engine["phases"]["prefill"]
    assert roof["phases"]["prefill"]["step_s"] == pytest.approx(
        prefill["step_s_mean"] - prefill["encoder_s"] / prefill["steps"]
    )
    assert roof["phases"]["decode"]["step_s"] == pytest.approx(engine["phases"]["decode"]["step_s_mean"])
    # the tiny tower + projector: 1 layer of 64 wide, 64 -> 128 -> 128, in bf16
    assert any(re.search(r"the encoder's 1[34]\d\.\d\d KiB of weights .* left out", note) for note in roof["notes"])


def test_per_layer_tables_hold_the_language_models_modules_only(eager: tuple[Any, dict]) -> None:
    _, report = eager
    names = [m["name"] for m in report["profiles"]["engine"]["layers"]["modules"]]
    assert any(n.startswith("language_model.model.layers.0") for n in names)
    # the vision encoder's layers are not decoder layers: the encoder is one span (encoder_s)
    assert not any(n.startswith(("vision_tower", "multi_modal_projector")) for n in names)
    by_layer = report["profiles"]["engine"]["layers"]["by_layer"]
    assert [row["layer"] for row in by_layer] == [0, 1]


def test_the_twin_of_a_multimodal_port_is_its_decoders_fed_text_prompts(tmp_path: Path) -> None:
    """``--twin auto`` on the vision-language port: vLLM's LlamaForCausalLM stands for the language
    model (``language_model.*``); both runs get text prompts (images 0: the port's report has no
    image and no encoder time) and random weights, and the A/B compares the decoders."""
    proc, report = _replayed("mm-ok-twin", tmp_path)
    for side in (report, json.loads((proc.out / "twin" / "report.json").read_text())):
        assert "images_per_prompt" not in side["profiles"]["workload"]
        assert all(s["encoder_s"] is None for s in side["profiles"]["engine"]["steps"])
        assert side["profiles"]["engine_kwargs"]["load_format"] == "dummy"
    assert "  encoder  " not in proc.stdout
    twin = report["profiles"]["twin"]
    assert twin["architecture"] == "LlamaForCausalLM" and twin["match"]["decoder_prefix"] == "language_model."
    assert twin["phases"]["decode"]["port_steps"] == twin["phases"]["decode"]["twin_steps"] > 0
    assert "the twin is its language model's (language_model.* as LlamaForCausalLM)" in proc.stdout


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


def test_embed_input_ids_that_drops_the_images_is_vd213(tmp_path: Path) -> None:
    """mm-embeddings-not-merged: vLLM runs it silently (tests/engine/test_multimodal_ground_truth.py);
    the doctor compares the merge's output rows with the image embeddings: none of them is there."""
    proc, report = _replayed("mm-embeddings-not-merged-eager", tmp_path, returncode=1)
    finding = _finding(report, "VD213")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    # two prompts of one 32x32 image each: 2 x 16 placeholder rows, prefilled in one step
    assert finding["message"] == (
        "image embeddings not merged at the placeholder positions: 32 of 32 rows differ (1 call(s) checked)"
    )
    assert finding["subject"] == "rank 0: embed_input_ids"
    assert finding["evidence"]["calls"] == [{"items": 2, "rows": 32, "expected_rows": 32, "rows_differ": 32}]
    assert "FAIL  VD213" in proc.stdout
