"""One answer per question: ``vllm-doctor check --engine``, ``vllm_doctor.check_engine`` and the
pytest fixture run the same engine stage (stages/engine.py:diagnose_engine) with the same default
(vLLM's own execution mode) and give the same engine-stage findings for the bundled example.

Each front end starts its own real engine (three engines, vLLM's default mode: the example carries
``@support_torch_compile``, so each compiles its inner model with inductor on CPU); the test
compares what they found, the mode they say they ran in, and what each compiled.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_examples, run_doctor, variant_env

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]
AUTHOR_TEST = '''
import json, os

def test_engine(vllm_doctor):
    report = vllm_doctor.engine_report(vllm_doctor.model_dir())
    with open(os.environ["FRONT_END_REPORT"], "w") as fh:
        json.dump(report.to_dict(), fh)
    vllm_doctor.assert_on_device()
    vllm_doctor.assert_kv_cache_fits()
'''


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("front-ends"), "ok")


def engine_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """What must agree: each engine-stage finding's code, subject and outcome, the mode, what was compiled."""
    findings = sorted(
        (f["code"], f["subject"], f["outcome"]) for f in report["findings"] if f["code"][:3] in ("VD4", "VD5")
    )
    compile_state = report["facts"]["engine"]["compile"]
    return {"findings": findings, "mode": report["facts"]["engine_mode"], "mode_text": report["facts"]["engine_mode_text"],
            "compiled": (compile_state["compiled_modules"], compile_state["eager"])}


def via_cli(example: Path) -> dict[str, Any]:
    proc = run_doctor(["check", str(example / "ok" / "model"), "--engine", "--json", "-q"],
                      variant_env(example, "ok"), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def via_api(example: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import vllm_doctor

    for key, value in variant_env(example, "ok").items():  # the engine child finds the example's plugin
        monkeypatch.setenv(key, value)
    return vllm_doctor.check_engine(str(example / "ok" / "model")).to_dict()


def via_pytest_fixture(example: Path, tmp_path: Path) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    from tests.fixtures.entry_points import doctor_entry_point, entry_point_installed

    (tmp_path / "test_author.py").write_text(AUTHOR_TEST)
    out = tmp_path / "fixture-report.json"
    plugin = [] if entry_point_installed("pytest11") else ["-p", doctor_entry_point("pytest11")]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, str(tmp_path / "test_author.py"),
         "--vllm-doctor-model", str(example / "ok" / "model")],
        env=variant_env(example, "ok", FRONT_END_REPORT=str(out)), capture_output=True, text=True, timeout=900,
        cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.is_file(), proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads(out.read_text()), proc


def test_cli_api_and_pytest_fixture_give_the_same_engine_findings_in_vllms_default_mode(
    example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = engine_verdict(via_cli(example))
    api = engine_verdict(via_api(example, monkeypatch))
    fixture_report, proc = via_pytest_fixture(example, tmp_path)
    fixture = engine_verdict(fixture_report)
    assert proc.returncode == 0, proc.stdout[-4000:]
    # the default everywhere is the mode vLLM itself serves with, said the same way
    assert cli["mode"]["requested"] == "vllm-default" and cli["mode"]["enforce_eager"] is False
    assert cli["mode_text"].startswith("execution mode: ") and "(vLLM's default; --eager forces eager)" in cli["mode_text"]
    assert api["mode"] == cli["mode"] and fixture["mode"] == cli["mode"]
    assert api["mode_text"] == cli["mode_text"] == fixture["mode_text"]
    # vLLM really compiled the example's inner model (@support_torch_compile), through every front end
    assert cli["compiled"] == (["model"], False) and api["compiled"] == fixture["compiled"] == cli["compiled"]
    # the same checks, subjects and outcomes, whichever way in
    codes = {code for code, _, _ in cli["findings"]}
    assert {"VD401", "VD403", "VD404", "VD500", "VD501", "VD503"} <= codes, codes
    assert api["findings"] == cli["findings"]
    assert fixture["findings"] == cli["findings"]
    assert all(outcome != "fail" for _, _, outcome in cli["findings"]), cli["findings"]
    assert "execution mode: " in proc.stdout  # the plugin's terminal summary names the mode
