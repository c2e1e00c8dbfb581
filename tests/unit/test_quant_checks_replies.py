"""The quantization checks on the quantized examples (examples/quant) and on vLLM's own Llama
under each quantization method this vLLM builds on the meta device (issue 33, parts 3 and 4), on
the weights pass's recorded replies (tests/fixtures/engine_replies.py,
``tools/record_engine_replies.py --family check-quantized``).

- VD314: a layer built without quant_config in front of a quantized checkpoint is named once (all
  layers' repeats grouped), with vLLM's KeyError and the fix; VD302/VD304 defer to it;
- VD315: a layer's scales missing, one finding per layer; VD301 defers to it;
- VD316: a checkpoint quantized in another format than its quantization_config says;
- no weights finding on correct quantized ports: the attention layer's q/k/v_scale and zero points
  of the KV-cache methods, which vLLM fills itself, are not VD301 (quant-ok, quant-fp8,
  quant-w4a16, and vLLM's LlamaForCausalLM in compressed-tensors int8/fp8/w4a16, native fp8 and
  GPTQ: tests/fixtures/in_tree_quant.py); GPTQ's g_idx, which vLLM's loader drops, is no VD302.

Weights-pass runs only (``--select VD3``). That vLLM still answers as recorded:
tests/integration/test_check_replies_drift.py; what the real engine does with the same variants:
tests/engine/test_moe_quant_ground_truth.py.
"""

from __future__ import annotations

import pytest

from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import IN_TREE_QUANT, QUANT_VARIANTS, check_name

VARIANTS = QUANT_VARIANTS
CORRECT = ("quant-ok", "quant-fp8", "quant-w4a16", *IN_TREE_QUANT)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """``check NAME --json -q --select VD3`` replayed per variant and in-tree checkpoint, in one
    directory (the examples built once)."""
    workdir = tmp_path_factory.mktemp("quant-replies")
    reports = {}
    for name in [*VARIANTS, *IN_TREE_QUANT]:
        run = engine_replies.replay(check_name(name, "-vd3"), workdir)
        assert run.rc in (0, 1), f"{run.case}: exit {run.rc}\n{run.stderr[-3000:]}"
        reports[name] = run.report()
    return reports


def test_every_case_is_recorded() -> None:
    for name in [*VARIANTS, *IN_TREE_QUANT]:
        case = check_name(name, "-vd3")
        assert engine_replies.recorded_versions(case), f"tools/record_engine_replies.py {case}"


def _of(report: dict, code: str) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code]


def _problems(report: dict) -> list[tuple[str, str, str]]:
    return [
        (f["code"], f["subject"], f["message"])
        for f in report["findings"]
        if f["outcome"] in ("fail", "warn", "crash", "skip")
    ]


@pytest.mark.parametrize("name", CORRECT)
def test_correct_quantized_ports_get_no_weights_finding(reports: dict[str, dict], name: str) -> None:
    report = reports[name]
    assert _problems(report) == []
    (loaded,) = _of(report, "VD301")
    if name in IN_TREE_QUANT and name != "llama-gptq":  # vLLM's Llama's Attention gets q/k/v scales (+ zero points)
        assert "KV-cache/query scale(s) and zero point(s) the checkpoint lacks" in loaded["message"]
        assert any(n.endswith("self_attn.attn.k_scale") for n in loaded["evidence"]["defaulted_by_vllm"])
    assert [f["outcome"] for f in _of(report, "VD314")] == ["pass"]
    assert [f["outcome"] for f in _of(report, "VD315")] == ["pass"]
    assert [f["outcome"] for f in _of(report, "VD316")] == ["pass"]
    if name == "llama-gptq":
        (loaded,) = _of(report, "VD302")
        assert (
            "14 tensor(s) the quantization method discards (e.g. model.layers.0.mlp.down_proj.g_idx"
            in loaded["message"]
        )


def test_layer_built_without_quant_config_is_one_vd314_naming_the_cause(reports: dict[str, dict]) -> None:
    report = reports["quant-unquantized-down-proj"]
    (found,) = _of(report, "VD314")
    assert (found["outcome"], found["subject"]) == ("fail", "model.layers.*.mlp.down_proj")
    assert found["message"].startswith(
        "model.layers.*.mlp.down_proj was built without quant_config (vLLM gave it UnquantizedLinearMethod; the other "
        "layers got CompressedTensorsLinearMethod) in a compressed-tensors checkpoint: the checkpoint's int8 weight is "
        "copied into its bfloat16 weight"
    )
    # what the engine stops with (tests/engine/test_moe_quant_ground_truth.py)
    assert (
        "weight_scale has no parameter (vLLM stops loading: KeyError: 'model.layers.0.mlp.down_proj.weight_scale')"
        in (found["message"])
    )
    assert found["evidence"]["modules"] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert 'pass quant_config=vllm_config.quant_config and prefix=f"{prefix}.down_proj"' in found["hint"]
    # the per-tensor findings defer to it; lm_head (in the config's ignore list, bfloat16) is no finding
    assert _problems(report) == [("VD314", found["subject"], found["message"])]


def test_missing_scales_are_one_vd315_per_layer(reports: dict[str, dict]) -> None:
    report = reports["quant-missing-scales"]
    (found,) = _of(report, "VD315")
    assert (found["outcome"], found["subject"]) == ("fail", "layer 1")
    assert found["message"].startswith(
        "layer 1: weight_scale of qkv_proj, o_proj, gate_up_proj, down_proj never loaded"
    )
    assert "missing-weight check is off for quantized models" in found["message"]
    assert len(found["evidence"]["parameters"]) == 4
    assert _problems(report) == [("VD315", "layer 1", found["message"])]  # VD301 defers


def test_fp8_tensors_under_an_int8_config_are_vd316(reports: dict[str, dict]) -> None:
    report = reports["quant-method-mismatch"]
    (found,) = _of(report, "VD316")
    assert (found["outcome"], found["subject"]) == ("fail", "config.json:quantization_config")
    assert found["message"].startswith(
        "config.json's quantization_config says compressed-tensors with int8 weights, but the checkpoint holds 14 "
        "float8 weights"
    )
    assert found["evidence"]["checkpoint_formats"].keys() == {"fp8"}


def test_gptq_module_names_the_model_does_not_use_are_vd317(reports: dict[str, dict]) -> None:
    report = reports["quant-gptq-names"]
    (found,) = _of(report, "VD317")
    assert (found["outcome"], found["subject"]) == ("fail", "model.layers.*.feed_forward.down_proj")
    assert found["message"].startswith(
        "auto_gptq quantizes layers by module name and the model's model.layers.*.feed_forward.down_proj, "
        "model.layers.*.feed_forward.gate_up_proj match none of the checkpoint's (model.layers.*.mlp.down_proj, "
    )
    assert found["message"].endswith(
        "vLLM builds them unquantized (UnquantizedLinearMethod) although quant_config is passed, and loading stops "
        "with KeyError: 'model.layers.0.feed_forward.down_proj.g_idx'"
    )
    assert "model.layers.0.mlp.down_proj" in found["evidence"]["modules_in_block_to_quantize"]
    # VD314 leaves those layers to it; the quantized attention layers' g_idx, which this hand-written
    # load_weights does not drop as vLLM's AutoWeightsLoader would, is VD302 with that hint
    assert [f["outcome"] for f in _of(report, "VD314")] == ["pass"]
    raised = [f for f in _of(report, "VD302") if f["outcome"] == "fail"]
    assert raised and all(f["subject"].endswith(".g_idx") and "self_attn" in f["subject"] for f in raised)
    assert all("AutoWeightsLoader" in f["hint"] for f in raised)
