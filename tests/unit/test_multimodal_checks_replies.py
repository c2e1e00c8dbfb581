"""The doctor on the vision-language example (examples/tiny_vl_plugin) and the variants whose
mistake is in the class's multimodal registration or its processor, on the import and weights
passes' recorded replies (tests/fixtures/engine_replies.py, ``tools/record_engine_replies.py
--family check-multimodal``): VD209 (no processor registered, or registered on another class), VD210
(not SupportsMultiModal), VD211 (the processor fails on vLLM's start-up dummy inputs: an image
token id the prompt update does not find, or one outside the vocabulary), VD212 (the embedding
contract: no ``embed_multimodal``, an ``embed_input_ids`` that cannot take or never reads the
image embeddings), VD112 (no vision config), VD111 (a processor file that is not JSON), and none
of them on the working example, whose LM head sits under its decoder's prefix
(``language_model.lm_head.weight``: no VD307); the performance lint's advice for the vision
tower (vLLM's encoder attention, not the decoder's). That vLLM still answers as recorded:
tests/integration/test_check_replies_drift.py; what needs vLLM in process:
tests/integration/test_multimodal_checks.py; what the real engine does with the same variants:
tests/engine/test_multimodal_ground_truth.py."""

from __future__ import annotations

import pytest

from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import MM_BAD_INPUTS, Run, check_name

VARIANTS = (
    "mm-ok",
    "mm-processor-not-registered",
    "mm-not-supports-multimodal",
    "mm-image-token-mismatch",
    "mm-image-token-mismatch-precomputed",
    "mm-no-embed-multimodal",
    "mm-embeddings-not-merged",
)
CLS = "tiny_doctor_vl{}.model:TinyDoctorVLForConditionalGeneration"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """``check NAME --json -q`` replayed per variant and per bad input, in one directory (the
    family built once)."""
    workdir = tmp_path_factory.mktemp("mm-replies")
    return {name: engine_replies.replay(check_name(name), workdir) for name in [*VARIANTS, *MM_BAD_INPUTS]}


@pytest.fixture(scope="module")
def reports(runs: dict[str, Run]) -> dict[str, dict]:
    for run in runs.values():
        assert run.rc in (0, 1), f"{run.case}: exit {run.rc}\n{run.stderr[-3000:]}"
    return {name: runs[name].report() for name in VARIANTS}


@pytest.fixture(scope="module")
def bad_inputs(runs: dict[str, Run]) -> dict[str, Run]:
    """The working example with bad input in its model directory (MM_BAD_INPUTS): a processor file
    that is not JSON, an image token id outside the vocabulary, a config without its vision
    settings (the example's flat vision_* fields; an in-tree LLaVA config without vision_config),
    and a class whose embed_input_ids has the text model's signature."""
    return {name.removeprefix("mm-bad-"): runs[name] for name in MM_BAD_INPUTS if name.startswith("mm-bad-")}


def test_every_case_is_recorded() -> None:
    for name in [*VARIANTS, *MM_BAD_INPUTS]:
        assert engine_replies.recorded_versions(check_name(name)), f"tools/record_engine_replies.py {check_name(name)}"


def _cut_short(reports: dict[str, dict]) -> dict[str, list[str]]:
    """Each variant's passes that did not finish, and why (a finding that skips says so here)."""
    return {n: [str(f.get("message"))[:300] for f in r["findings"] if f["code"] == "VD100" and f["outcome"] != "pass"]
            for n, r in reports.items()}


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
    contract = _by_code(report, "VD212")
    assert contract["outcome"] == "pass"
    assert contract["message"] == (
        f"{CLS.format('_model')} implements embed_multimodal; embed_input_ids: its own, taking multimodal_embeddings, "
        "is_multimodal"
    )
    assert _by_code(report, "VD112")["outcome"] == "pass"  # the vision_* fields are in config.json
    # every tower loads (the weights by tower: tests/unit/test_multimodal_weights_replies.py)
    assert [_by_code(report, c)["outcome"] for c in ("VD301", "VD302", "VD313")] == ["pass", "pass", "pass"]
    errors = [f["code"] for f in report["findings"] if f["outcome"] == "fail" and f["severity"] == "error"]
    assert errors == []


def test_processor_not_registered_is_vd209(reports: dict[str, dict]) -> None:
    finding = _by_code(reports["mm-processor-not-registered"], "VD209")
    assert finding["outcome"] == "fail" and finding["severity"] == "error", (finding, _cut_short(reports))
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
    # which id is right: the tokenizer's id of the dummy prompt's placeholder
    assert "('<image>' is token 3 in the tokenizer: set image_token_index to 3)" in finding["hint"]
    assert finding["evidence"]["placeholder_ids"] == [3]
    assert _by_code(reports[variant], "VD209")["outcome"] == "pass"


def test_vision_tower_attention_is_pointed_at_vllms_encoder_attention(reports: dict[str, dict]) -> None:
    """The performance lint on the example's plain-PyTorch vision tower: its SDPA is advised
    vLLM's encoder attention layer (no KV cache), not the decoder's Attention; its separate
    q/k/v cite vLLM's own vision encoders, which fuse them (QKVParallelLinear in clip.py)."""
    report = reports["mm-ok"]
    attention = _by_code(report, "VD606")
    assert attention["outcome"] == "warn"
    assert attention["message"].startswith(
        "TinyVisionAttention.forward, in the multimodal encoder (vision_tower), computes attention with "
        "scaled_dot_product_attention"
    )
    assert "not vLLM's encoder attention layer (MMEncoderAttention)" in attention["message"]
    assert attention["evidence"]["encoder_modules"] == ["vision_tower", "multi_modal_projector"]
    assert attention["evidence"]["vllm_encoder_attention"] == "vllm.model_executor.layers.attention.MMEncoderAttention"
    assert attention["hint"].startswith("build vllm's MMEncoderAttention(")
    unfused = _by_code(report, "VD601")
    assert unfused["subject"] == "vision_tower.encoder.layers.*.self_attn"
    assert "vLLM's own vision encoders (clip.py, siglip.py) run them as one QKVParallelLinear" in unfused["message"]


def test_encoder_method_under_its_old_name_is_vd212(reports: dict[str, dict]) -> None:
    finding = _by_code(reports["mm-no-embed-multimodal"], "VD212")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert finding["subject"] == CLS.format("_no_embed_multimodal") + ".embed_multimodal"
    assert finding["message"].startswith(
        f"{CLS.format('_no_embed_multimodal')} does not implement embed_multimodal (it defines "
        "get_multimodal_embeddings, vLLM's older name): vLLM calls SupportsMultiModal's empty one, which returns None"
    )
    # what vLLM 0.32 says (tests/engine/test_multimodal_ground_truth.py)
    assert "but got <class 'NoneType'> instead" in finding["message"]
    assert finding["hint"] == "rename get_multimodal_embeddings to embed_multimodal"
    assert finding["evidence"]["defined_by"] == "vllm.model_executor.models.interfaces.SupportsMultiModal"


def test_embed_input_ids_that_never_reads_the_image_embeddings_is_vd212(reports: dict[str, dict]) -> None:
    finding = _by_code(reports["mm-embeddings-not-merged"], "VD212")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert finding["subject"] == CLS.format("_embeddings_not_merged") + ".embed_input_ids"
    assert finding["message"] == (
        f"{CLS.format('_embeddings_not_merged')}.embed_input_ids takes multimodal_embeddings but never reads it: the "
        "image embeddings are not merged at the placeholder positions, silently (the answer does not depend on the "
        "image)"
    )
    assert finding["evidence"]["unread"] == ["multimodal_embeddings", "is_multimodal"]


def test_a_processor_file_that_is_not_json_is_vllms_refusal_not_a_crash(bad_inputs: dict[str, Run]) -> None:
    proc = bad_inputs["not-json"]
    assert proc.rc == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    finding = _by_code(proc.report(), "VD111")
    assert finding["outcome"] == "fail"
    assert "preprocessor_config.json' is not a valid JSON file" in finding["message"]


def test_an_image_token_outside_the_vocabulary_is_vd211_with_the_vocabulary(bad_inputs: dict[str, Run]) -> None:
    proc = bad_inputs["token-outside-vocab"]
    assert proc.rc == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    finding = _by_code(proc.report(), "VD211")
    assert finding["outcome"] == "fail"
    assert "image_token_index = 1512; outside the vocabulary of 512 token(s)" in finding["hint"]


def test_a_registration_on_another_class_is_named_with_the_move(runs: dict[str, Run]) -> None:
    """The decorator put on the language model's class instead of the one the architecture
    resolves to: vLLM's registry looks on the resolved class only (the same text-only run as no
    registration at all); VD209 names the class that carries it and says where to move it."""
    package = "tiny_doctor_vl_processor_not_registered"
    finding = _by_code(runs["mm-registration-on-language-model"].report(), "VD209")
    assert finding["outcome"] == "fail"
    assert f"the registration sits on {package}.model.TinyLanguageModel instead" in finding["message"]
    assert finding["evidence"]["mm_processor_on"] == [f"{package}.model.TinyLanguageModel"]
    assert "from TinyLanguageModel to TinyDoctorVLForConditionalGeneration" in finding["hint"]


def test_flat_vision_fields_missing_is_vd112_naming_the_defaults(bad_inputs: dict[str, Run]) -> None:
    """config.json without the example's vision_* fields: the config class fills them from its
    defaults (which fit this checkpoint): a warning that names them, no traceback."""
    proc = bad_inputs["no-vision-fields"]
    assert proc.rc == 0, proc.stderr[-3000:]  # warnings only
    assert "Traceback" not in proc.stderr
    finding = _by_code(proc.report(), "VD112")
    assert finding["outcome"] == "fail" and finding["severity"] == "warn"
    assert finding["message"].startswith(
        "config.json has none of tiny_doctor_vl_model.configuration.TinyDoctorVLConfig's vision_* fields: its "
        "defaults are used (vision_image_size 32, vision_patch_size 8, vision_hidden_size 64"
    )


def test_llava_config_without_vision_config_is_vd112_naming_the_default_clip(bad_inputs: dict[str, Run]) -> None:
    """model_type llava without vision_config: transformers' LlavaConfig builds a default CLIP
    ViT (hidden 1024, 24 layers), which the checkpoint's tiny tower does not fit (VD302/VD303
    follow); VD112 names the cause; no traceback."""
    proc = bad_inputs["llava-no-vision-config"]
    assert proc.rc == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    report = proc.report()
    finding = _by_code(report, "VD112")
    assert finding["outcome"] == "fail" and finding["severity"] == "warn"
    assert finding["message"] == (
        "config.json has no vision_config: transformers.models.llava.configuration_llava.LlavaConfig builds a default "
        "CLIPVisionConfig (hidden_size 1024, num_hidden_layers 24, image_size 336, patch_size 14)"
    )
    failed = {f["code"]: f for f in report["findings"] if f["outcome"] == "fail"}
    # the default tower's names and shapes are not the checkpoint's: its tensors do not load (VD303 where
    # a name fits with the wrong shape, VD313 naming the tower once where none of its parameters fills)
    assert "VD303" in failed and "vision_tower" in failed["VD313"]["message"], sorted(failed)


def test_embed_input_ids_with_the_text_models_signature_is_vd212(bad_inputs: dict[str, Run]) -> None:
    proc = bad_inputs["text-signature"]
    assert proc.rc == 1, proc.stderr[-3000:]
    finding = _by_code(proc.report(), "VD212")
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert finding["message"].startswith(
        f"{CLS.format('_model')}.embed_input_ids(self, input_ids) does not accept multimodal_embeddings, "
        "is_multimodal: vLLM's runner passes embed_input_ids(input_ids, multimodal_embeddings=..., is_multimodal=...)"
    )
    assert finding["evidence"]["not_accepted"] == ["multimodal_embeddings", "is_multimodal"]
