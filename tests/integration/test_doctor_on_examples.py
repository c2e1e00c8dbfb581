"""The doctor on the example whose model is registered only under ``if __name__ == "__main__":``
(examples/broken/script-only-registration): what needs a live import pass of the author's own
script or of the caller's process (VD102).

Every other variant's findings are asserted on the import and weights passes' recorded replies
(tests/unit/test_doctor_on_examples_replies.py), that vLLM still answers as recorded in
tests/integration/test_check_replies_drift.py, the real engine on the same variants in
tests/engine/test_ground_truth.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import doctor_json, make_examples, variant_env

VARIANT = "script-only-registration"


@pytest.fixture(scope="module")
def examples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one variant these tests check (examples/make_examples.py --only)."""
    return make_examples(tmp_path_factory.mktemp("script-only"), VARIANT)


def problems(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")]


def test_script_flag_finds_registration_under_main_guard(examples_dir: Path) -> None:
    base = examples_dir / "script-only-registration"
    report = doctor_json(examples_dir, "script-only-registration", "--script", str(base / "serve.py"))
    (f,) = [f for f in problems(report) if f["code"] == "VD102"]
    assert f["subject"].startswith(str(base / "serve.py") + ":")
    assert "`if __name__ == '__main__':` block" in f["message"]


def test_python_api_compares_the_callers_registry_with_a_fresh_process(examples_dir: Path, tmp_path: Path) -> None:
    """VD102 through vllm_doctor.check() called from the script that registered the model."""
    base = examples_dir / "script-only-registration"
    script = tmp_path / "check_from_script.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        import vllm_doctor
        if __name__ == "__main__":
            from tiny_doctor_script_only_registration import register
            register()
            report = vllm_doctor.check({str(base / "model")!r}, select=["VD102"])
            print(json.dumps(report.to_dict()))
    """))
    proc = subprocess.run([sys.executable, str(script)], env=variant_env(examples_dir, "script-only-registration"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    (f,) = report["findings"]
    assert (f["code"], f["outcome"], f["subject"]) == ("VD102", "fail", "config.json:architectures[0]")
    assert f["evidence"]["caller_target"] == "tiny_doctor_script_only_registration.model:TinyDoctorForCausalLM"
