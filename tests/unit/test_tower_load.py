"""VD313's reading of the weights pass by tower, and VD302's not-built layers, on plain data."""

from __future__ import annotations

from typing import Any

from vllm_doctor.checks import run_checks
from vllm_doctor.checks.tower_load import unloaded_towers
from vllm_doctor.facts.checkpoint import CheckpointFacts, FileHeader, TensorHeader
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Outcome

VISION = ["embeddings.patch_embedding.weight", "encoder.layers.0.mlp.fc1.weight", "encoder.layers.0.mlp.fc2.weight"]
TEXT = ["model.embed_tokens.weight", "lm_head.weight"]


def param(written: bool) -> dict[str, Any]:
    return {"written": written, "covered": 4 if written else 0, "numel": 4, "failed_from": [], "shape": [2, 2],
            "dtype": "bfloat16", "in_returned": None, "vllm_exempt": False, "shards_expected": None,
            "shards_loaded": None, "shards_missing": None, "sources": []}  # fmt: skip


def tensor(status: str) -> dict[str, Any]:
    return {"status": status, "shape": [2, 2], "dtype": "BF16", "params": [], "handed_to": [], "errors": []}


def weights_facts(params: dict[str, bool], tensors: dict[str, str], layout: dict[str, Any], config=None) -> Facts:
    f = Facts(model_dir="/nonexistent", config=config or {"architectures": ["X"]})
    headers = [TensorHeader(n, "BF16", [2, 2], "model.safetensors", (0, 8)) for n in tensors or {"x": ""}]
    f.checkpoint = CheckpointFacts(
        "/nonexistent", "safetensors", [FileHeader("model.safetensors", 8, 8, headers, ok=True)]
    )
    f.weight_load = {
        "params": {n: param(w) for n, w in params.items()},
        "tensors": {n: tensor(s) for n, s in tensors.items()},
        "load_weights": {"global_errors": []},
        "layout": layout,
    }
    return f


def test_a_prefix_inside_the_name_is_the_mapper_entry() -> None:
    """transformers 5 saves a LLaVA's CLIP tower without its vision_model level."""
    params = {
        **{f"vision_tower.vision_model.{n}": False for n in VISION},
        **{f"language_model.{n}": True for n in TEXT},
    }
    tensors = {**{f"vision_tower.{n}": "raised" for n in VISION}, **{f"language_model.{n}": "loaded" for n in TEXT}}
    f = weights_facts(params, tensors, {"mapper": {"orig_to_new_prefix": {"model.vision_tower.": "vision_tower."}}})
    (tower,) = unloaded_towers(f)
    assert (tower.name, tower.cause, len(tower.unfilled), tower.params) == ("vision_tower", "prefix", 3, 3)
    assert (tower.checkpoint_prefix, tower.parameter_prefix) == ("vision_tower.", "vision_tower.vision_model.")
    (finding,) = run_checks(f, ["VD313"])
    assert finding.outcome is Outcome.FAIL
    assert 'add "vision_tower.": "vision_tower.vision_model."' in finding.hint
    assert "'model.vision_tower.' -> 'vision_tower.'" in finding.message
    # VD301 and VD302 leave the tower to VD313
    assert [x.outcome for x in run_checks(f, ["VD301", "VD302"])] == [Outcome.PASS, Outcome.PASS]


def test_a_tower_with_one_parameter_loaded_of_five_is_still_named_and_one_parameter_is_not_a_tower() -> None:
    names = [f"vision_tower.encoder.layers.{i}.weight" for i in range(5)]
    f = weights_facts({**{n: i == 0 for i, n in enumerate(names)}, "lm_head.weight": False}, {}, {"mapper": None})
    (tower,) = unloaded_towers(f)
    assert (tower.name, tower.cause, len(tower.unfilled)) == ("vision_tower", "absent", 4)
    assert "the class has no hf_to_vllm_mapper" in run_checks(f, ["VD313"])[0].hint
    # lm_head alone is VD301's
    assert [x.subject for x in run_checks(f, ["VD301"]) if x.outcome is Outcome.FAIL] == ["lm_head.weight"]


def test_a_layer_past_the_built_ones_is_a_pass_only_where_config_declares_it() -> None:
    tensors = {"vision_tower.encoder.layers.0.w": "loaded", "vision_tower.encoder.layers.1.w": "skipped"}
    unbuilt = {"vision_tower.encoder.layers.1.w": {"module": "vision_tower.encoder.layers", "kind": "layer",
                                                   "index": 1, "built": 1}}  # fmt: skip
    params = {"vision_tower.encoder.layers.0.w": True}
    declared = {"architectures": ["X"], "vision_config": {"num_hidden_layers": 2}, "vision_feature_layer": -2}
    f = weights_facts(params, tensors, {"unbuilt": unbuilt}, config=declared)
    findings = run_checks(f, ["VD302"])
    assert [x.outcome for x in findings] == [Outcome.PASS, Outcome.PASS]
    assert findings[0].subject == "vision_tower.encoder.layers.1.*"
    assert "vision_config.num_hidden_layers=2, vision_feature_layer=-2" in findings[0].message
    # config.json does not say there is a layer 1: the skipped tensor stays a warning
    f = weights_facts(params, tensors, {"unbuilt": unbuilt}, config={"architectures": ["X"], "num_hidden_layers": 1})
    assert [(x.outcome, x.subject) for x in run_checks(f, ["VD302"])] == [
        (Outcome.WARN, "vision_tower.encoder.layers.1.w")
    ]
