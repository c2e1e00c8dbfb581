"""`vllm-doctor check` on the weight fixtures (tests/fixtures/weights.py), on the import and
weights passes' recorded replies (tests/fixtures/engine_replies.py, ``tools/record_engine_replies.py
--family check-weights``): every VD30x fires on its fixture with the exact subject, the working example
reports full coverage, and the checks degrade (skip with a reason) when the model class cannot be
built. Each fixture's ``check --json -q`` is replayed once per module in one directory (the
fixtures built once). That vLLM still answers as recorded:
tests/integration/test_check_replies_drift.py; the engine on the same fixtures:
tests/engine/test_weights_engine.py. ``--fast`` (headers only, no pass) and a bad
``--tensor-parallel-size`` run the doctor's command line in a subprocess on the same fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import Run, check_name
from tests.fixtures.weights import FIXTURES

UNBUILDABLE = check_name("weights-untied-without-lm-head", "-no-site")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    workdir = tmp_path_factory.mktemp("weights-replies")
    names = [check_name(f"weights-{n}") for n in FIXTURES] + [UNBUILDABLE]
    return {name: engine_replies.replay(name, workdir) for name in names}


@pytest.fixture(scope="module")
def fixtures_dir(runs: dict[str, Run]) -> Path:
    """{workdir}/weight-fixtures/weights: each fixture's model/ and site/ (built by the first replay)."""
    return runs[check_name("weights-ok")].model.parent.parent


def doctor(fixture: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``vllm-doctor check FIXTURE ARGS`` in a fresh process, as a shell runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(fixture / "site"), str(REPO)])
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "vllm_doctor", "check", str(fixture / "model"), *args],
                          env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture(scope="module")
def reports(runs: dict[str, Run]) -> dict[str, tuple[int, dict[str, Any], str]]:
    """fixture -> (exit code, report, stderr), as tests/integration/test_weights.py had them."""
    return {n: (runs[check_name(f"weights-{n}")].rc, runs[check_name(f"weights-{n}")].report(),
                runs[check_name(f"weights-{n}")].stderr) for n in FIXTURES}  # fmt: skip


def test_every_case_is_recorded() -> None:
    cases = {n for n, c in engine_replies.CASES.items() if c.family == "check-weights"}
    assert cases == {check_name(f"weights-{n}") for n in FIXTURES} | {UNBUILDABLE}
    for name in cases:
        assert engine_replies.recorded_versions(name), f"{name}: tools/record_engine_replies.py {name}"


def vd3(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"].startswith("VD3")]


def vd3_problems(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in vd3(report) if f["outcome"] in ("fail", "warn", "crash")]


BROKEN = [name for name, fx in FIXTURES.items() if fx.expects]


@pytest.mark.parametrize("name", BROKEN)
def test_every_vd30x_fires_on_its_fixture_with_the_exact_subject(reports: dict[str, Any], name: str) -> None:
    rc, report, stderr = reports[name]
    assert report, stderr
    fx = FIXTURES[name]
    found = {(f["code"], f["subject"]): f for f in vd3_problems(report)}
    for exp in fx.expects:
        assert (exp.code, exp.subject) in found, f"{name}: no {exp.code} for {exp.subject}; got {sorted(found)}"
        f = found[(exp.code, exp.subject)]
        assert f["outcome"] == exp.outcome, f
        for key, value in exp.evidence:
            assert f["evidence"].get(key) == value, (key, f["evidence"])
        assert "Traceback" not in f["message"]
    errors = [f for f in vd3_problems(report) if f["severity"] == "error"]
    assert rc == (1 if errors else 0), (rc, errors)
    assert not [f for f in report["findings"] if f["outcome"] == "crash"]


def test_only_the_expected_problems(reports: dict[str, Any]) -> None:
    """No fixture raises VD3xx problems beyond its own (consequences it names are listed in FIXTURES)."""
    extra: dict[str, list[tuple[str, str]]] = {}
    allowed_extra = {"tp3": {("VD305", "config.json:vocab_size"), ("VD305", "config.json:hidden_size")}}
    for name in BROKEN:
        _, report, _ = reports[name]
        expected = {(e.code, e.subject) for e in FIXTURES[name].expects} | allowed_extra.get(name, set())
        got = {(f["code"], f["subject"]) for f in vd3_problems(report)}
        if got - expected:
            extra[name] = sorted(got - expected)
    assert not extra


def test_ok_example_has_full_coverage(reports: dict[str, Any]) -> None:
    _, report, stderr = reports["ok"]
    assert report, stderr
    assert not vd3_problems(report)
    outcomes = {f["code"]: f["outcome"] for f in vd3(report)}
    # VD301-VD310, VD313; the fused-MoE checks have no MoE layer here (tests/unit/test_moe_checks_replies.py)
    assert outcomes == {
        **{f"VD3{i:02d}": "pass" for i in range(1, 11)},
        "VD311": "not_applicable",
        "VD312": "not_applicable",
        "VD313": "pass",
        # the quantization checks: the checkpoint is not quantized (tests/unit/test_quant_checks_replies.py)
        **{code: "not_applicable" for code in ("VD314", "VD315", "VD316", "VD317")},
    }
    weights = report["facts"]["weights"]
    mapping, params = weights["mapping"], weights["params"]
    assert len(mapping) == 21 and all(t["status"] == "loaded" for t in mapping.values())
    assert all(p["written"] for p in params.values()) and len(params) == 15
    # the full tensor -> parameter mapping, with shard ids of fused parameters
    assert mapping["model.layers.0.self_attn.v_proj.weight"]["params"] == ["model.layers.0.self_attn.qkv_proj.weight"]
    assert mapping["model.layers.0.self_attn.v_proj.weight"]["shards"] == ["v"]
    assert mapping["model.layers.1.mlp.up_proj.weight"]["shards"] == ["1"]
    assert params["model.layers.0.self_attn.qkv_proj.weight"]["shards_expected"] == ["q", "k", "v"]
    assert weights["model"]["class"] == "tiny_doctor_model.model.TinyDoctorForCausalLM"


def test_vllm_error_in_the_finding_is_what_the_engine_says(reports: dict[str, Any]) -> None:
    """For fixtures the engine rejects, the finding quotes vLLM's own error text
    (test_weights_engine.py shows the engine failing with exactly that text)."""
    for name, fx in FIXTURES.items():
        if fx.engine is None or fx.engine.ok or not fx.expects:
            continue
        _, report, _ = reports[name]
        texts = [str(f["evidence"].get("vllm_error", "")) for f in vd3_problems(report)]
        assert fx.engine.error and any(fx.engine.error in t for t in texts), (name, texts)


def test_uninitialised_parameters_are_predicted_as_unnoticed_by_vllm(reports: dict[str, Any]) -> None:
    for name in ("qkv-missing-v", "untied-without-lm-head"):
        _, report, _ = reports[name]
        (f,) = [f for f in vd3_problems(report) if f["code"] == "VD301"]
        assert f["evidence"]["vllm_notices"] is False
        assert "does not cover it" in f["message"]
    _, report, _ = reports["loader-skips-norm"]
    assert all(f["evidence"]["vllm_notices"] for f in vd3_problems(report) if f["code"] == "VD301")


def test_fp16_overflow_risk_is_a_warning_bf16_precision_is_info(reports: dict[str, Any]) -> None:
    (fp16,) = [f for f in vd3_problems(reports["fp32-into-fp16"][1]) if f["code"] == "VD304"]
    (bf16,) = [f for f in vd3_problems(reports["fp32-checkpoint"][1]) if f["code"] == "VD304"]
    assert fp16["severity"] == "warn" and "65504" in fp16["message"]
    assert bf16["severity"] == "info"
    assert reports["fp32-checkpoint"][0] == 0  # info/warn only: exit 0 at the default --fail-on error


def test_unreadable_checkpoint_makes_load_checks_skip_and_header_checks_report(reports: dict[str, Any]) -> None:
    for name in ("truncated-header", "header-past-eof", "symlink-outside-dir"):
        _, report, _ = reports[name]
        outcomes = {f["code"]: f["outcome"] for f in vd3(report) if f["code"] in ("VD301", "VD302", "VD303")}
        assert outcomes == {"VD301": "skip", "VD302": "skip", "VD303": "skip"}, (name, outcomes)


def test_model_class_not_buildable_degrades(runs: dict[str, Run]) -> None:
    """Without the plugin on the path the class cannot be built: VD301-303 skip with the reason,
    VD305-VD308 still run from headers and config.json."""
    report = runs[UNBUILDABLE].report()
    by_code: dict[str, list[dict[str, Any]]] = {}
    for f in vd3(report):
        by_code.setdefault(f["code"], []).append(f)
    for code in ("VD301", "VD302", "VD303"):
        (f,) = by_code[code]
        assert f["outcome"] == "skip"
        # the plugin that registers the tiny_doctor config and class is missing: vLLM's own words
        assert "could not be built" in f["message"] and "tiny_doctor" in f["message"], f["message"]
    assert any(f["outcome"] == "fail" for f in by_code["VD305"])
    assert [f["outcome"] for f in by_code["VD307"]] == ["fail"]
    assert [f["outcome"] for f in by_code["VD306"]] == ["pass"]
    assert [f["outcome"] for f in by_code["VD308"]] == ["pass"]
    assert "load_error" in report["facts"]["weights"]


def test_keyerror_names_the_lookup_and_the_nearest_parameter(reports: dict[str, Any]) -> None:
    _, report, _ = reports["renamed-tensor"]
    (f,) = [f for f in vd3_problems(report) if f["code"] == "VD302"]
    assert f["evidence"]["nearest_parameters"][0] == "model.layers.1.mlp.gate_up_proj.weight"
    assert "it looked up 'model.layers.1.mlp.gate_up_projection.weight'" in f["message"]


def test_fast_mode_reads_headers_only(fixtures_dir: Path) -> None:
    proc = doctor(fixtures_dir / "index-outside-dir", "--json", "-q", "--fast")
    report = json.loads(proc.stdout)
    outcomes = {f["code"]: f["outcome"] for f in vd3(report)}
    assert outcomes["VD306"] == "fail"
    assert {outcomes[c] for c in ("VD301", "VD302", "VD303", "VD304")} == {"skip"}
    assert report["timings"]["total_s"] < 10
    assert proc.returncode == 1


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_tensor_parallel_size_is_a_usage_error(fixtures_dir: Path, value: str) -> None:
    proc = doctor(fixtures_dir / "ok", "--fast", "--tensor-parallel-size", value)
    assert proc.returncode == 2 and "--tensor-parallel-size" in proc.stderr
