"""One problem repeated thousands of times gives 20 findings and ONE summary (issue 24, item 6.4).

The helper (checks/base.py ``capped_findings``) as pure logic; the checks that repeat a finding per
item (VD301/VD303 per parameter/tensor on the weights pass's plain result, VD103/VD109/VD110 per
plugin registration or entry point); and through the real command line, the fast pass: an index
with 5,000 bad entries (VD306), 5,000 broken shard files (VD308), an auto_map with 5,000 missing
modules (VD105). The weights pass's VD302 with 5,000 unused tensors runs against the real vLLM in
tests/integration/test_leftovers_caps.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures.weights import TINY_LLAMA_CONFIG, TINY_LLAMA_TENSORS, write_raw_safetensors
from vllm_doctor.checks import CATALOGUE, run_checks
from vllm_doctor.checks.base import MAX_REPEATED, Emit, capped_findings
from vllm_doctor.facts.checkpoint import CheckpointFacts, FileHeader, TensorHeader
from vllm_doctor.facts.plugins import PluginInfo, Registration
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Outcome, Severity

N = 5_000
LLAMA = TINY_LLAMA_CONFIG
TENSORS = TINY_LLAMA_TENSORS


def fast_json(model: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "check", str(model), "--fast", "--json", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 1, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def of(report_or_findings: Any, code: str) -> list[dict[str, Any]]:
    findings = report_or_findings["findings"] if isinstance(report_or_findings, dict) else report_or_findings
    return [f if isinstance(f, dict) else f.to_dict() for f in findings if (f["code"] if isinstance(f, dict) else f.code) == code]


def assert_capped(findings: list[dict[str, Any]], what: str, *, outcome: str = "fail", severity: str = "error") -> dict[str, Any]:
    """MAX_REPEATED findings + one summary for the other N - MAX_REPEATED, which names them all."""
    rest = N - MAX_REPEATED
    assert len(findings) == MAX_REPEATED + 1
    summary = [f for f in findings if f["subject"] == f"({rest} more)"]
    assert len(summary) == 1, [f["subject"] for f in findings]
    s = summary[0]
    assert s["message"] == f"... and {rest} more {what} (see the JSON report's evidence)"
    assert (s["outcome"], s["severity"]) == (outcome, severity)
    assert s["evidence"]["not_shown"] == rest and len(s["evidence"]["subjects"]) == rest
    shown = {f["subject"] for f in findings} - {s["subject"]}
    assert len(shown) == MAX_REPEATED and not shown & set(s["evidence"]["subjects"])
    return s


# --- the helper ------------------------------------------------------------------------------------------


def test_capped_findings_shows_the_worst_first_and_sums_up_the_rest() -> None:
    emit = Emit(CATALOGUE["VD302"].meta)
    infos = [emit.warn(f"skip {i}", f"t{i}", severity=Severity.INFO) for i in range(25)]
    errors = [emit.fail(f"raise {i}", f"e{i}", hint="map the name") for i in range(5)]
    got = capped_findings(infos + errors, emit, "tensors")
    assert [f.subject for f in got[:5]] == [f"e{i}" for i in range(5)]  # errors first, in order
    assert [f.subject for f in got[5:20]] == [f"t{i}" for i in range(15)]
    summary = got[20]
    assert (summary.code, summary.outcome, summary.severity) == ("VD302", Outcome.WARN, Severity.INFO)
    assert summary.message == "... and 10 more tensors (see the JSON report's evidence)"
    assert summary.subject == "(10 more)"
    assert summary.evidence == {
        "not_shown": 10,
        "subjects": [f"t{i}" for i in range(15, 25)],
        "severities": {"info": 10},
    }
    assert len(got) == 21
    assert capped_findings(errors, emit, "tensors") == errors  # under the cap: as they are


def test_capped_findings_with_a_total_when_only_the_first_were_built() -> None:
    emit = Emit(CATALOGUE["VD101"].meta)
    first = [emit.fail(f"a{i}", f"config.json:architectures[{i}]") for i in range(20)]
    got = capped_findings(first, emit, "architectures", total=100, subject="config.json:architectures[20:]")
    assert len(got) == 21 and got[-1].evidence == {"not_shown": 80}
    assert (got[-1].outcome, got[-1].subject) == (Outcome.FAIL, "config.json:architectures[20:]")


# --- checks over plain facts -----------------------------------------------------------------------------


def checkpoint(names: list[str]) -> CheckpointFacts:
    tensors = [TensorHeader(n, "BF16", [4], "model.safetensors", (8 * i, 8 * i + 8)) for i, n in enumerate(names)]
    return CheckpointFacts(
        model_dir="/m", format="safetensors", files=[FileHeader("model.safetensors", 8, 8, tensors, ok=True)]
    )


def test_5000_parameters_no_tensor_fills_give_20_vd301_findings_and_a_summary() -> None:
    param = {
        "written": False, "covered": 0, "numel": 4, "shape": [4], "dtype": "bfloat16", "shards_expected": None,
        "shards_loaded": [], "shards_missing": [], "sources": [], "in_returned": False, "vllm_exempt": False,
    }  # fmt: skip
    params = {f"model.p{i:04d}.weight": dict(param) for i in range(N)}
    # as many filled beside them: the module is not a tower never loaded (VD313 would name it once)
    params |= {f"model.q{i:04d}.weight": dict(param, written=True, covered=4) for i in range(N)}
    weight_load = {"params": params, "tensors": {}}
    facts = Facts(model_dir="/m", config=LLAMA, checkpoint=checkpoint(["x"]), weight_load=weight_load)
    findings = of(run_checks(facts, ["VD301"]), "VD301")
    s = assert_capped(findings, "parameters not loaded")
    assert s["evidence"]["subjects"][0] == "model.p0020.weight"


def test_5000_shape_mismatches_give_20_vd303_findings_and_a_summary() -> None:
    names = [f"model.t{i:04d}.weight" for i in range(N)]
    tensors = {
        n: {"status": "shape_mismatch", "shape": [4], "params": [n], "errors": [], "expected_shape": [2, 2]}
        for n in names
    }
    facts = Facts(model_dir="/m", config=LLAMA, checkpoint=checkpoint(names), weight_load={"params": {}, "tensors": tensors})
    assert_capped(of(run_checks(facts, ["VD303"]), "VD303"), "shape mismatches")


def plugin(name: str, regs: list[Registration], allowed: bool = True) -> PluginInfo:
    return PluginInfo(name=name, value=f"{name}:register", distribution=None, allowed=allowed, registrations=regs)


def test_5000_registrations_and_entry_points_are_capped() -> None:
    regs = [Registration(f"Arch{i:04d}", f"pkg.m{i}:Arch{i:04d}", True, f"pkg/__init__.py:{i}") for i in range(N)]
    facts = Facts(model_dir="/m", config={"architectures": ["Arch"], "model_type": "llama"})
    facts.registry = {}
    facts.builtin_archs = {r.arch: "vllm.model_executor.models.x:Builtin" for r in regs}  # every one shadows
    facts.plugins = [plugin("many", regs)]
    assert_capped(of(run_checks(facts, ["VD110"]), "VD110"), "built-in architectures replaced by plugins",
                  outcome="warn", severity="info")  # fmt: skip
    facts.config = {"architectures": ["Arch"], "model_type": "llama"}
    facts.plugins = [plugin("many", [Registration("llama", f"pkg.m{i}:Arch", True, f"p.py:{i}") for i in range(N)])]
    assert_capped(of(run_checks(facts, ["VD103"]), "VD103"), "registrations under another name")
    facts.plugins = [plugin(f"ep{i:04d}", [], allowed=False) for i in range(N)]  # excluded by VLLM_PLUGINS
    facts.vllm_plugins_env = "other"
    assert_capped(of(run_checks(facts, ["VD109"]), "VD109"), "plugin entry points")


# --- the real command line, fast pass ------------------------------------------------------------------


def model(tmp_path: Path, config: dict[str, Any] = LLAMA) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_an_index_with_5000_entries_for_missing_files_gives_20_vd306_findings_and_a_summary(tmp_path: Path) -> None:
    d = model(tmp_path)
    write_raw_safetensors(d / "model.safetensors", TENSORS)
    weight_map = {name: "model.safetensors" for name in TENSORS} | {f"t{i}": f"missing-{i}.safetensors" for i in range(N)}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    s = assert_capped(of(fast_json(d), "VD306"), "shard index problems")
    assert all(subject.startswith("model.safetensors.index.json:missing-") for subject in s["evidence"]["subjects"])


def test_5000_broken_shard_files_give_20_vd308_findings_and_a_summary(tmp_path: Path) -> None:
    d = model(tmp_path)
    for i in range(N):
        (d / f"model-{i:05d}-of-{N:05d}.safetensors").write_bytes(b"\x10\x00")  # shorter than the length field
    s = assert_capped(of(fast_json(d), "VD308"), "unreadable safetensors files")
    assert s["evidence"]["subjects"][0] == f"model-00020-of-{N:05d}.safetensors"


def test_an_auto_map_with_5000_missing_modules_gives_20_vd105_findings_and_a_summary(tmp_path: Path) -> None:
    d = model(tmp_path, {**LLAMA, "auto_map": {f"AutoModel{i}": f"mod{i}.Cls" for i in range(N)}})
    assert_capped(of(fast_json(d), "VD105"), "auto_map entries whose module is missing")
