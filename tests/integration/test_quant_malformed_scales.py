"""Quantization advice for malformed scales (issue 47 item 19), on the weights pass of the real vLLM:
native-FP8 checkpoints of the quantized example (examples/quant/quant-native-fp8) with layer 1's scales
stored wrong, and one whose config's own fp8 ``ignored_layers`` leaves a quantized layer unquantized.

Before: an int64 weight_scale was VD304's "quantized weights loaded into an unquantized model?", a
weight_scale of the wrong shape "never loaded" (VD315: "add the layer's scales to the checkpoint"),
boolean input scales passed, and VD314 asked for quant_config on the layer the config ignores.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import doctor_json, make_examples

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]
BASE = "quant-native-fp8"


def _layer1_scales(weights: dict[str, Any], leaf: str) -> list[str]:
    return [n for n in weights if n.startswith("model.layers.1.") and n.endswith(f".{leaf}")]


def _int64_weight_scale(weights: dict[str, Any], config: dict[str, Any]) -> None:
    import torch

    for name in _layer1_scales(weights, "weight_scale"):
        weights[name] = weights[name].to(torch.int64)


def _bool_input_scale(weights: dict[str, Any], config: dict[str, Any]) -> None:
    import torch

    config["quantization_config"]["activation_scheme"] = "static"  # vLLM's fp8 then takes input_scale
    for name in [n for n in weights if n.endswith(".weight_scale")]:
        bad = name.startswith("model.layers.1.")
        weights[name.replace("weight_scale", "input_scale")] = torch.tensor(True if bad else 0.05)


def _weight_scale_of_three(weights: dict[str, Any], config: dict[str, Any]) -> None:
    for name in _layer1_scales(weights, "weight_scale"):
        weights[name] = weights[name].reshape(1).repeat(3)


def _ignored_by_the_config(weights: dict[str, Any], config: dict[str, Any]) -> None:
    config["quantization_config"]["ignored_layers"] = ["model.layers.0.mlp.down_proj"]  # still fp8 in the checkpoint


CASES: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "scale-int64": _int64_weight_scale,
    "input-scale-bool": _bool_input_scale,
    "scale-shape": _weight_scale_of_three,
    "ignored-layer": _ignored_by_the_config,
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    from safetensors.torch import load_file, save_file

    out = make_examples(tmp_path_factory.mktemp("quant-malformed"), BASE)
    for name, edit in CASES.items():
        shutil.copytree(out / BASE, out / name, symlinks=True)
        model = out / name / "model"
        weights = load_file(str(model / "model.safetensors"))
        config = json.loads((model / "config.json").read_text())
        edit(weights, config)
        save_file(weights, str(model / "model.safetensors"))
        (model / "config.json").write_text(json.dumps(config, indent=2))
    # the plugin's site is the base variant's (variant_env reads <name>/site: the copies carry it)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(CASES, pool.map(lambda n: doctor_json(out, n, "--select", "VD3"), CASES), strict=True))


def _fails(report: dict, code: str) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code and f["outcome"] == "fail"]


def test_an_int64_scale_is_named_with_its_dtype_and_the_one_vllm_wants(reports: dict[str, dict]) -> None:
    report = reports["scale-int64"]
    (finding,) = _fails(report, "VD315")
    assert finding["subject"] == "layer 1"
    assert finding["message"].startswith(
        "layer 1: weight_scale of down_proj, gate_up_proj, o_proj, qkv_proj is stored as I64, but vLLM's "
        "weight_scale is F32: the integers are loaded as floats as they are"
    )
    assert finding["evidence"]["found"]["dtype"] == "I64" and finding["evidence"]["expected"]["dtype"] == "F32"
    assert "re-export weight_scale as F32" in finding["hint"]
    assert "never loaded" not in finding["message"]
    assert _fails(report, "VD304") == []  # no more "quantized weights loaded into an unquantized model?"


def test_boolean_input_scales_are_flagged(reports: dict[str, dict]) -> None:
    (finding,) = _fails(reports["input-scale-bool"], "VD315")
    assert finding["message"].startswith(
        "layer 1: input_scale of down_proj, gate_up_proj, o_proj, qkv_proj is stored as BOOL, but vLLM's input_scale "
        "is F32: the booleans are loaded as 1.0 / 0.0"
    )


def test_a_scale_of_the_wrong_shape_is_named_with_its_shape_not_as_missing(reports: dict[str, dict]) -> None:
    report = reports["scale-shape"]
    (finding,) = _fails(report, "VD315")
    assert "weight_scale of down_proj, gate_up_proj, o_proj, qkv_proj is in the checkpoint with shape [3]" in (
        finding["message"]
    )
    assert "never loaded" not in finding["message"] and "add the layer's scales" not in finding["hint"]
    assert {f["subject"] for f in _fails(report, "VD303")} >= {"model.layers.1.mlp.down_proj.weight_scale"}


def test_vd314_respects_the_configs_own_fp8_ignored_layers(reports: dict[str, dict]) -> None:
    (finding,) = _fails(reports["ignored-layer"], "VD314")
    assert finding["message"].startswith(
        "model.layers.0.mlp.down_proj is left unquantized by the quantization config's own ignore list "
        "('model.layers.0.mlp.down_proj'; vLLM gave it UnquantizedLinearMethod) in a fp8 checkpoint"
    )
    assert finding["hint"] == (
        "export model.layers.0.mlp.down_proj unquantized (float weight, no scales), as the ignore list says"
    )
