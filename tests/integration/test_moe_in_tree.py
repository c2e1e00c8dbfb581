"""No false positives on vLLM's own mixture-of-experts classes (issue 33, part 4).

Tiny random checkpoints of in-tree MoE architectures, saved the way published checkpoints hold them
(tests/fixtures/in_tree_moe.py), through `vllm-doctor check` (import and weights passes, no engine):
every expert of every fused-MoE layer is loaded as its name says (VD311, VD312 pass), and no VD3xx
check fails or warns. vLLM's own expert params mappings differ per architecture (Mixtral's w1/w2/w3,
Qwen2-MoE's shared expert, DeepSeek-V2's dense first layer and shared experts), which is what the
sweep covers. PhiMoE, OLMoE and GraniteMoE were swept the same way by hand (docs/moe.md); they are
left out here to keep the suite's time down (about a minute of CPU each).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import doctor_json
from tests.fixtures.in_tree_moe import build_in_tree_moe

SWEPT = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM")
# fused-MoE layers each builds: 2 decoder layers, DeepSeek-V2's first one dense (first_k_dense_replace=1)
MOE_LAYERS = {"MixtralForCausalLM": 2, "Qwen2MoeForCausalLM": 2, "Qwen3MoeForCausalLM": 2, "DeepseekV2ForCausalLM": 1}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    pytest.importorskip("vllm")
    out = tmp_path_factory.mktemp("in-tree-moe")
    for arch in SWEPT:
        build_in_tree_moe(arch, out / arch / "model")

    def check(arch: str) -> dict:
        return doctor_json(Path(out), arch, "--select", "VD3")

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SWEPT, pool.map(check, SWEPT), strict=True))


@pytest.mark.parametrize("arch", SWEPT)
def test_in_tree_moe_has_no_weight_finding(reports: dict[str, dict], arch: str) -> None:
    report = reports[arch]
    problems = [
        (f["code"], f["subject"], f["message"][:200])
        for f in report["findings"]
        if f["code"].startswith("VD3") and f["outcome"] in ("fail", "warn", "crash")
    ]
    assert problems == []
    outcome = {f["code"]: (f["outcome"], f["message"]) for f in report["findings"] if f["code"] in ("VD311", "VD312")}
    assert outcome["VD311"][0] == "pass" and outcome["VD312"][0] == "pass", outcome
    # every expert tensor of the checkpoint (4 experts x w1, w3, w2 per MoE layer) went where its name says
    assert f"{MOE_LAYERS[arch] * 4 * 3} expert tensor(s)" in outcome["VD312"][1]
