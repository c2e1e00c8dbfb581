"""The doctor on the MoE example (examples/tiny_moe_plugin) and its broken variants, on the
import and weights passes' recorded replies (tests/fixtures/engine_replies.py,
``tools/record_engine_replies.py --family check-moe``): the weights pass records every call of vLLM's
fused-MoE weight loader (expert id, shard id, checkpoint tensor), so a missing expert is named by
layer and expert (VD311, where VD301 could only count elements) and a mapping that swaps gate and
up, which writes every element, is named with both names (VD312); a router load_weights skips is
VD301 per layer; three experts at --tensor-parallel-size 2 are an info of VD305 (vLLM slices every
expert: it runs); config.json edits of the MoE and quantized examples are one finding each. That
vLLM still answers as recorded: tests/integration/test_check_replies_drift.py; what the real
engine does with the same variants: tests/engine/test_moe_quant_ground_truth.py. Each variant's
EXPECT_CODE (examples/moe/NAME/variant.py) is the code asserted here."""

from __future__ import annotations

import json

import pytest

from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import MOE_BAD_INPUTS, MOE_VARIANTS, Run, check_name

VARIANTS = MOE_VARIANTS


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """``check NAME --json -q`` replayed per variant (``--tensor-parallel-size 2`` where the variant
    is served so) and per config.json edit, in one directory (the examples built once)."""
    workdir = tmp_path_factory.mktemp("moe-replies")
    return {name: engine_replies.replay(check_name(name), workdir) for name in [*VARIANTS, *MOE_BAD_INPUTS]}


@pytest.fixture(scope="module")
def reports(runs: dict[str, Run], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    reports = {}
    for name in VARIANTS:
        run = runs[name]
        assert run.rc in (0, 1), f"{run.case}: exit {run.rc}\n{run.stderr[-3000:]}"
        reports[name] = run.report()
        reports[name]["expect_code"] = json.loads((run.model.parent / "variant.json").read_text())["expect_code"]
    return reports


@pytest.fixture(scope="module")
def bad_inputs(runs: dict[str, Run]) -> dict[str, tuple[Run, dict]]:
    """config.json edits of the MoE and quantized examples a user can make: one finding each, with
    vLLM's words where vLLM has any, exit 1, no traceback."""
    return {name: (runs[name], runs[name].report() if runs[name].stdout else {}) for name in MOE_BAD_INPUTS}


def test_every_case_is_recorded() -> None:
    for name in [*VARIANTS, *MOE_BAD_INPUTS]:
        assert engine_replies.recorded_versions(check_name(name)), f"tools/record_engine_replies.py {check_name(name)}"


def _findings(report: dict, code: str) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code]


def test_working_moe_example_loads_every_expert_as_named(reports: dict[str, dict]) -> None:
    report = reports["moe-ok"]
    (loaded,) = _findings(report, "VD311")
    (named,) = _findings(report, "VD312")
    assert (loaded["outcome"], named["outcome"]) == ("pass", "pass")
    assert "24 expert tensor(s)" in named["message"]  # 2 layers x 4 experts x w1, w2, w3
    assert [f["code"] for f in report["findings"] if f["outcome"] == "fail" and f["severity"] == "error"] == []


def test_gate_and_up_swapped_is_vd312_with_both_names(reports: dict[str, dict]) -> None:
    report = reports["moe-swapped-w1-w3"]
    swapped = _findings(report, "VD312")
    assert [(f["outcome"], f["evidence"]["named"], f["evidence"]["loaded_as"]) for f in swapped] == [
        ("fail", "w1", "w3"),
        ("fail", "w3", "w1"),
    ]
    assert all(f["evidence"]["tensors"] == 8 for f in swapped)  # 2 layers x 4 experts each
    assert "fused_moe_make_expert_params_mapping" in swapped[0]["hint"]
    # every element is written: nothing for the element counts to find
    assert [f["outcome"] for f in _findings(report, "VD301")] in ([], ["pass"])
    assert _findings(report, "VD311")[0]["outcome"] == "pass"


def test_a_missing_expert_is_vd311_by_layer_and_expert(reports: dict[str, dict]) -> None:
    report = reports["moe-missing-expert"]
    missing = [f for f in _findings(report, "VD311") if f["outcome"] == "fail"]
    assert [(f["subject"], f["evidence"]["shards_missing"]) for f in missing] == [
        ("layer 1, expert 3", ["w1", "w3", "w2"])
    ]
    assert "never loaded" in missing[0]["message"]
    # VD301 leaves the fused experts to VD311 (no element counts of w13_weight / w2_weight)
    assert not [f for f in _findings(report, "VD301") if f["outcome"] == "fail"]


def _problems(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")]


def test_each_variant_gets_its_expect_code(reports: dict[str, dict]) -> None:
    for name, report in reports.items():
        codes = {f["code"] for f in _problems(report)}
        assert (report["expect_code"] in codes) if report["expect_code"] else not codes, (name, codes)


def test_a_router_never_loaded_is_vd301_per_layer(reports: dict[str, dict]) -> None:
    report = reports["moe-router-not-loaded"]
    assert {(f["code"], f["subject"]) for f in _problems(report)} == {
        (code, f"model.layers.{layer}.block_sparse_moe.gate.weight") for code in ("VD301", "VD302") for layer in (0, 1)
    }
    assert all("uninitialised memory" in f["message"] for f in _findings(report, "VD301"))
    # the experts themselves are all loaded, as their names say
    assert [f["outcome"] for f in _findings(report, "VD311") + _findings(report, "VD312")] == ["pass", "pass"]


def test_three_experts_at_tp_2_run_sliced_an_info_not_a_failure(reports: dict[str, dict]) -> None:
    """vLLM's FusedMoE slices every expert over the TP ranks (the engine runs it: test_moe_quant_ground_truth);
    only --enable-expert-parallel divides experts, 2 + 1 here."""
    report = reports["moe-experts-not-divisible-by-tp"]
    (info,) = _problems(report)
    assert (info["code"], info["severity"], info["subject"]) == ("VD305", "info", "config.json:num_local_experts")
    assert "each rank holds a 1/2 slice of every expert" in info["message"] and "2 + 1" in info["message"]
    assert info["evidence"]["tensor_parallel_size"] == 2 and info["evidence"]["enable_expert_parallel"] is False


@pytest.mark.parametrize(
    ("name", "code", "says"),
    [
        ("quant-config-a-string", "VD111", "AttributeError: 'str' object has no attribute 'to_dict'"),
        ("quant-method-unknown", "VD111", "Unknown quantization method: frobnicate. Must be one of"),
        ("moe-zero-experts", "VD309", "num_local_experts = 0: must be at least 1"),
    ],
)
def test_bad_moe_and_quantization_configs_are_one_finding(bad_inputs: dict, name: str, code: str, says: str) -> None:
    proc, report = bad_inputs[name]
    assert proc.rc == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (finding,) = _findings(report, code)
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert says in finding["message"]
    if code == "VD309":  # the model is not built on a size no model has: no cascade of weight findings
        assert not [f for f in report["findings"] if f["code"].startswith("VD30") and f["code"] != "VD309"
                    and f["outcome"] == "fail"]  # fmt: skip
