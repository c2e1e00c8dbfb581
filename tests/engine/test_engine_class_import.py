"""A model class that fails to import, through the engine stage (issue 47 item 12).

vLLM's registry imports a lazily registered class in a subprocess; when that import fails, vLLM
says only ``Model architectures [...] failed to be inspected. Please check the logs`` and the
ImportError is in its log. ``check`` names it (VD106, the import pass); ``profile`` and
``check --engine`` go through the engine stage, whose VD500 must name the same error and its
line (the child imports the class again, as the import pass does), without an eager re-run that
would fail the same way. The example variant ``model-module-import-error`` imports a module vLLM
0.32 does not have (what a plugin written for another vLLM does).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import make_examples, run_doctor, variant_env

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]
NAME = "model-module-import-error"
ERROR = "ModuleNotFoundError: No module named 'vllm.model_executor.layers.layer_norm'"


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("class-import"), NAME)


def _failing_line(examples: Path) -> str:
    """``file:line`` of the variant's import that fails (the model module's own line)."""
    (module,) = (examples / NAME / "site").glob("*/model.py")
    lines = module.read_text().splitlines()
    (n,) = [i + 1 for i, line in enumerate(lines) if "layers.layer_norm import" in line]
    return f"{module}:{n}"


def _vd500(report: dict) -> dict:
    (f,) = [f for f in report["findings"] if f["code"] == "VD500"]
    return f


def test_profile_names_the_import_error_and_its_line(examples: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_doctor(["profile", str(examples / NAME / "model"), "--out", str(out)], variant_env(examples, NAME),
                      timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = _failing_line(examples)
    cause = f"cannot be imported: {ERROR} (at {line})"
    f = _vd500(json.loads((out / "report.json").read_text()))
    assert f["outcome"] == "fail" and "failed to be inspected" in f["message"]
    assert f["message"].endswith(f"; cause: tiny_doctor_model_module_import_error.model:TinyDoctorForCausalLM {cause}")
    assert ERROR in f["evidence"]["traceback"] and f["hint"].startswith("fix the import; reproduce with: python -c")
    assert cause in proc.stdout  # the terminal says it too, not only the report
    assert "re-run eagerly" not in proc.stdout and "re-running the model in eager mode" not in proc.stderr


def test_check_engine_gives_vd500_the_cause_vd106_gives(examples: Path) -> None:
    proc = run_doctor(["check", str(examples / NAME / "model"), "--engine", "--eager", "--json", "-q",
                       "--import-timeout", "500"], variant_env(examples, NAME), timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (vd106,) = [f for f in report["findings"] if f["code"] == "VD106" and f["outcome"] == "fail"]
    assert vd106["message"].endswith(ERROR)
    assert f"; cause: {vd106['message']} (at {_failing_line(examples)})" in _vd500(report)["message"]
