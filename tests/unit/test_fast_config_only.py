"""``check --fast`` sees config-only mistakes (issue 47 item 18): from config.json alone, without
vLLM, under the code the full check gives each (tests/fixtures/config_only.py's cases; the full
check's side: tests/integration/test_fast_config_only_codes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_doctor
from tests.fixtures.config_only import CASES, build_bases, build_case
from vllm_doctor.stages.static import CheckOptions, diagnose

FAST = "check --fast: read from config.json, vLLM not imported"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_bases(tmp_path_factory.mktemp("config-only-bases"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_names_the_config_mistake_with_the_full_checks_code(name: str, bases: dict[str, Path], tmp_path: Path) -> None:
    report = diagnose(str(build_case(name, bases, tmp_path)), CheckOptions(fast=True))
    problems = [(f.code, f.subject, f.severity.value) for f in report.findings if f.is_problem]
    expect = CASES[name].expect
    assert problems == ([expect] if expect else []), [f.message for f in report.findings if f.is_problem]
    if expect:
        (f,) = [f for f in report.findings if f.code == expect[0] and f.is_problem]
        assert f.evidence["from"] == FAST and f.hint


def test_the_command_line_exits_1_on_it(bases: dict[str, Path], tmp_path: Path) -> None:
    proc = run_doctor(["check", str(build_case("quant-list", bases, tmp_path)), "--fast", "--json", "-q"])
    assert proc.returncode == 1, proc.stderr[-2000:]
    (f,) = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "VD111"]
    assert f["message"] == (
        "config.json's quantization_config is a list, not an object: vLLM refuses config.json as it loads it "
        "(`AttributeError: 'list' object has no attribute 'to_dict'`)"
    )
