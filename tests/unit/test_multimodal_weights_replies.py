"""The weights checks on vision-language models, by tower (issue 32).

- VD313 names a tower load_weights never fills ONCE, with the cause: the vision tower's tensors
  filtered out before any weight loader (mm-vision-weights-skipped), or the checkpoint's
  ``model.vision_tower.*`` / ``model.multi_modal_projector.*`` prefixes that hf_to_vllm_mapper
  does not map (mm-unmapped-weight-prefix), with the mapper entry to add. VD301 and VD302 do not
  repeat it per parameter and per tensor.
- No finding for the layers a class deliberately does not build: the tiny example built up to
  ``vision_feature_layer`` (mm-ok-truncated-tower) and vLLM's own LLaVA over a CLIP and a SigLIP
  tower (tests/fixtures/in_tree_vlm.py), whose load_weights skip the checkpoint's layers past the
  built ones, post_layernorm and SigLIP's head.

On the import and weights passes' recorded replies (tests/fixtures/engine_replies.py,
``tools/record_engine_replies.py --family check-multimodal``; vLLM's LLaVA recorded where torchvision
imports). The working example's weights: tests/unit/test_multimodal_checks_replies.py. That vLLM
still answers as recorded: tests/integration/test_check_replies_drift.py; what the real engine
does with these variants: tests/engine/test_multimodal_ground_truth.py.
"""

from __future__ import annotations

import pytest

from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import IN_TREE_VLMS, check_name

VARIANTS = ("mm-ok-truncated-tower", "mm-vision-weights-skipped", "mm-unmapped-weight-prefix")
WEIGHT_CODES = ("VD301", "VD302", "VD303", "VD307", "VD313")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    workdir = tmp_path_factory.mktemp("mm-weights-replies")
    reports = {}
    for name in [*VARIANTS, *IN_TREE_VLMS]:
        run = engine_replies.replay(check_name(name), workdir)
        assert run.rc in (0, 1), f"{run.case}: exit {run.rc}\n{run.stderr[-3000:]}"
        reports[name] = run.report()
    return reports


def _of(report: dict, code: str) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code]


def _problems(report: dict, codes: tuple[str, ...] = WEIGHT_CODES) -> list[tuple[str, str, str]]:
    return [
        (f["code"], f["subject"], f["message"])
        for f in report["findings"]
        if f["code"] in codes and f["outcome"] in ("fail", "warn", "crash", "skip")
    ]


def test_vision_tower_filtered_out_is_one_vd313_not_a_finding_per_parameter(reports: dict[str, dict]) -> None:
    report = reports["mm-vision-weights-skipped"]
    (tower,) = _of(report, "VD313")
    assert (tower["outcome"], tower["severity"], tower["subject"]) == ("fail", "error", "vision_tower")
    assert tower["message"].startswith("vision_tower: 20 of 20 parameters never loaded")
    assert "load_weights never passes them to any weight loader" in tower["message"]
    # load_weights returns None: vLLM's own check is off, the doctor says so
    assert "vLLM's own missing-weight check does not catch it" in tower["message"]
    assert tower["evidence"]["cause"] == "filtered" and tower["evidence"]["checkpoint_tensors"] == 20
    assert "vision_tower.encoder.layers.0.mlp.fc1.weight" in tower["evidence"]["parameters_never_loaded"]
    assert "remove the filter in load_weights" in tower["hint"]
    # the per-parameter and per-tensor findings defer to it
    assert _problems(report, ("VD301", "VD302", "VD303")) == []
    assert [f["outcome"] for f in _of(report, "VD301")] == ["pass"]
    assert "VD313 names" in _of(report, "VD301")[0]["message"]
    assert [(f["outcome"], f["severity"]) for f in _of(report, "VD205")] == [("fail", "error")]  # load_weights returns None


def test_unmapped_checkpoint_prefixes_name_the_mapper_entry_per_tower(reports: dict[str, dict]) -> None:
    report = reports["mm-unmapped-weight-prefix"]
    towers = {f["subject"]: f for f in _of(report, "VD313")}
    assert sorted(towers) == ["multi_modal_projector", "vision_tower"]
    vision, projector = towers["vision_tower"], towers["multi_modal_projector"]
    assert vision["message"].startswith("vision_tower: 20 of 20 parameters never loaded")
    assert projector["message"].startswith("multi_modal_projector: 4 of 4 parameters never loaded")
    for tower, ckpt in ((vision, "model.vision_tower."), (projector, "model.multi_modal_projector.")):
        param = ckpt.removeprefix("model.")
        assert tower["outcome"] == "fail" and tower["evidence"]["cause"] == "prefix"
        assert (tower["evidence"]["checkpoint_prefix"], tower["evidence"]["parameter_prefix"]) == (ckpt, param)
        assert f'add "{ckpt}": "{param}" to hf_to_vllm_mapper' in tower["hint"]
        # what the class's mapper maps today (the two language-model prefixes)
        assert "'model.language_model.' -> 'language_model.model.'" in tower["message"]
        assert tower["evidence"]["hf_to_vllm_mapper"]["orig_to_new_prefix"] == {
            "model.language_model.": "language_model.model.",
            "lm_head.": "language_model.lm_head.",
        }
        # what the engine stops with (tests/engine/test_multimodal_ground_truth.py)
        assert (
            "vLLM fails at start-up, loading the weights: ValueError: There is no module or parameter named 'model'"
            in (tower["message"])
        )
        assert tower["evidence"]["vllm_error"].startswith("ValueError: There is no module or parameter named 'model'")
    assert vision["evidence"]["checkpoint_tensors"] == 20 and projector["evidence"]["checkpoint_tensors"] == 4
    # no VD301 per parameter, no VD302 per tensor (lm_head.weight loads: it is not blamed for the
    # error vLLM's message lists 'language_model.lm_head.weight' in)
    assert _problems(report, ("VD301", "VD302", "VD303")) == []


@pytest.mark.parametrize(
    ("name", "not_built"),
    [
        ("mm-ok-truncated-tower", ["vision_tower.encoder.layers.1.*"]),
        ("llava-clip", ["vision_tower.vision_model.encoder.layers.1.*", "vision_tower.vision_model.post_layernorm.*"]),
        (
            "llava-siglip",
            [
                "vision_tower.vision_model.encoder.layers.1.*",
                "vision_tower.vision_model.head.*",
                "vision_tower.vision_model.post_layernorm.*",
            ],
        ),
    ],
)
def test_layers_the_class_deliberately_does_not_build_are_not_findings(
    reports: dict[str, dict], name: str, not_built: list[str]
) -> None:
    report = reports[name]
    assert _problems(report) == []
    assert [f["outcome"] for f in _of(report, "VD313")] == ["pass"]
    passes = {f["subject"]: f for f in _of(report, "VD302") if f["subject"].endswith(".*")}
    assert sorted(passes) == not_built
    layer = passes[not_built[0]]
    assert layer["outcome"] == "pass"
    assert "vision_feature_layer=-2" in layer["message"] and "builds 1 of the 2 layers" in layer["message"]
    assert layer["evidence"]["built"] == 1 and layer["evidence"]["indices"] == [1]
    assert layer["evidence"]["tensor_count"] == 16
    for subject in not_built[1:]:
        assert passes[subject]["evidence"]["kind"] == "none"  # the class sets it to None


def test_in_tree_llava_runs_clean(reports: dict[str, dict]) -> None:
    """vLLM's own LlavaForConditionalGeneration: no finding at warn or above from the static stage."""
    for name in IN_TREE_VLMS:
        report = reports[name]
        assert report["findings"], name
        loud = [
            (f["code"], f["subject"], f["message"][:200])
            for f in report["findings"]
            if f["outcome"] in ("fail", "crash") and f["severity"] == "error"
        ]
        assert loud == [], name
