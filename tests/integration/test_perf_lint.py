"""The performance lint (VD6xx) on real module trees: the slow-port example, the fused working
example, and every vLLM text architecture that builds on the meta device (no false positives).

The module trees come from vLLM's own builder (``initialize_model`` under the meta device, as
``check``'s weights pass builds a user's model); no engine starts here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, doctor_json, make_examples

pytest.importorskip("vllm")

MIN_IN_TREE = 40  # architectures that build from transformers' default configs here (vLLM 0.32: 47)


@pytest.fixture(scope="module")
def perf_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("perf-examples"), "ok", "slow-port")


@pytest.fixture(scope="module")
def lint(perf_examples: Path) -> dict[str, dict[str, Any]]:
    return {name: doctor_json(perf_examples, name, "--select", "VD6") for name in ("ok", "slow-port")}


def problems(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in report["findings"]:
        if f["outcome"] in ("fail", "warn", "crash"):
            out.setdefault(f["code"], []).append(f)
    return out


def test_the_slow_port_gets_each_finding_it_was_built_to_show(perf_examples: Path, lint: dict[str, Any]) -> None:
    expected = json.loads((perf_examples / "slow-port" / "variant.json").read_text())["expect_perf_codes"]
    got = problems(lint["slow-port"])
    assert sorted(got) == sorted(expected), {c: [f["message"] for f in fs] for c, fs in got.items()}
    fused = {f["subject"]: f for f in got["VD601"]}
    assert set(fused) == {"model.layers.*.self_attn", "model.layers.*.mlp"}
    assert fused["model.layers.*.self_attn"]["evidence"]["modules"] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj",
    ]
    assert "QKVParallelLinear (qkv_proj)" in fused["model.layers.*.self_attn"]["message"]
    plain = {f["subject"] for f in got["VD602"]}
    assert plain == {"model", "model.layers.*.self_attn", "model.layers.*.mlp"}
    (uncompiled,) = got["VD603"]
    assert uncompiled["subject"] == "tiny_doctor_slow_port.model.TinyDoctorForCausalLM"
    (loop,) = got["VD604"]
    assert loop["evidence"]["over"] == "heads" and loop["evidence"]["function"] == "rotate"
    assert loop["subject"].endswith("tiny_doctor_slow_port/model.py:66")
    source = (perf_examples / "slow-port" / "site" / "tiny_doctor_slow_port" / "model.py").read_text().splitlines()
    assert source[65].strip() == loop["evidence"]["code"] == "for h in range(heads):"
    assert lint["slow-port"]["facts"]["perf"]["source"] == "meta-device build"


def test_the_working_example_gets_no_performance_finding(lint: dict[str, Any]) -> None:
    """vLLM's fused layers and @support_torch_compile on the inner model, as vLLM's Llama has them."""
    report = lint["ok"]
    outcomes = {f["code"]: f["outcome"] for f in report["findings"]}
    assert all(outcomes[c] == "pass" for c in ("VD601", "VD602", "VD603", "VD604", "VD606")), outcomes
    assert problems(report) == {}
    (compiled,) = [f for f in report["findings"] if f["code"] == "VD603"]
    assert compiled["message"] == "vLLM compiles model (@support_torch_compile)"


def test_the_lint_finds_nothing_on_vllms_own_text_architectures(tmp_path: Path) -> None:
    out = tmp_path / "in_tree.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "fixtures" / "in_tree_perf.py"), str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    built = data["built"]
    print(f"\nperformance lint: {len(built)} in-tree architectures built on the meta device, "
          f"{len(data['not_built'])} did not build from transformers' default config")  # fmt: skip
    assert len(built) >= MIN_IN_TREE, data["not_built"]
    assert "LlamaForCausalLM" in built and "Qwen3ForCausalLM" in built
    read = data["read"]
    # the lint read every tree: model classes with their source, projections, attention layers
    assert all(r["classes"] >= 2 and r["sources_read"] == r["classes"] and r["projections"] > 0 for r in read.values()), read
    assert read["LlamaForCausalLM"]["compiled"] and read["LlamaForCausalLM"]["attention_layers"] == 2
    flagged = {arch: [(f["code"], f["message"]) for f in found] for arch, found in built.items() if found}
    assert flagged == {}
