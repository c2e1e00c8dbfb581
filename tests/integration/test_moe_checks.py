"""The doctor on the MoE example (examples/tiny_moe_plugin) and its broken variants: the
weights pass records every call of vLLM's fused-MoE weight loader (expert id, shard id,
checkpoint tensor), so a missing expert is named by layer and expert (VD311, where VD301 could
only count elements) and a mapping that swaps gate and up, which writes every element, is named
with both names (VD312); a router load_weights skips is VD301 per layer; three experts at
--tensor-parallel-size 2 are an info of VD305 (vLLM slices every expert: it runs). What the real
engine does with the same variants: tests/engine/test_moe_quant_ground_truth.py. Each variant's
EXPECT_CODE (examples/moe/NAME/variant.py) is the code asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import CHECK_LIMIT, REPO, doctor_json

VARIANTS = (
    "moe-ok",
    "moe-swapped-w1-w3",
    "moe-missing-expert",
    "moe-router-not-loaded",
    "moe-experts-not-divisible-by-tp",
)
# the doctor's flags for a variant (the engine_kwargs it is served with, as the command line spells them)
ARGS = {"moe-experts-not-divisible-by-tp": ("--tensor-parallel-size", "2")}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("moe-examples")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_examples.py"), str(out), "--only", *VARIANTS],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = dict(zip(VARIANTS, pool.map(lambda n: doctor_json(out, n, *ARGS.get(n, ())), VARIANTS), strict=True))
    for name, report in reports.items():
        report["expect_code"] = json.loads((out / name / "variant.json").read_text())["expect_code"]
    return reports


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


BAD_INPUTS = {
    # (the example it edits, the config.json edit)
    "quant-config-a-string": ("quant-ok", lambda c: c.__setitem__("quantization_config", "compressed-tensors")),
    "quant-method-unknown": ("quant-ok", lambda c: c["quantization_config"].__setitem__("quant_method", "frobnicate")),
    "moe-zero-experts": ("moe-ok", lambda c: c.__setitem__("num_local_experts", 0)),
}


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], dict]]:
    """config.json edits of the MoE and quantized examples a user can make: one finding each, with vLLM's words
    where vLLM has any, exit 1, no traceback."""
    import json
    import shutil

    from tests.conftest import run_doctor, variant_env

    out = tmp_path_factory.mktemp("moe-quant-bad")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_examples.py"), str(out), "--only", "quant-ok", "moe-ok"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    for name, (source, edit) in BAD_INPUTS.items():
        shutil.copytree(out / source, out / name, symlinks=True)
        config_path = out / name / "model" / "config.json"
        config = json.loads(config_path.read_text())
        edit(config)
        config_path.write_text(json.dumps(config))

    def run(name: str) -> tuple[subprocess.CompletedProcess[str], dict]:
        proc = run_doctor(["check", str(out / name / "model"), "--json", "-q", *CHECK_LIMIT], variant_env(out, name),
                          timeout=600)
        return proc, json.loads(proc.stdout) if proc.stdout else {}

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(BAD_INPUTS, pool.map(run, BAD_INPUTS), strict=True))


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
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (finding,) = _findings(report, code)
    assert finding["outcome"] == "fail" and finding["severity"] == "error"
    assert says in finding["message"]
    if code == "VD309":  # the model is not built on a size no model has: no cascade of weight findings
        assert not [f for f in report["findings"] if f["code"].startswith("VD30") and f["code"] != "VD309"
                    and f["outcome"] == "fail"]  # fmt: skip
