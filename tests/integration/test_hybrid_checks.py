"""The doctor's finding on each example of the hybrid family before launch (``vllm-doctor check``:
the import and weights passes, no engine), against what vLLM does with each
(tests/fixtures/hybrid_expected.py, recorded on the real engine by tests/engine/test_hybrid_ground_truth.py)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import check_family, make_examples, run_doctor
from tests.fixtures.hybrid_expected import EXPECTED

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``vllm-doctor check --json`` of each variant, its plugin site on PYTHONPATH."""
    return check_family(tmp_path_factory.mktemp("hybrid-examples"), list(EXPECTED))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_doctor_names_the_cause_before_launch(name: str, checks: dict[str, Any]) -> None:
    code, report, proc, variant_code = checks[name]
    assert report is not None, proc.stderr[-3000:]
    expected = EXPECTED[name]
    alarms = [
        (f["code"], f["subject"], f["message"]) for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")
    ]
    if expected.finding is None:
        assert code == 0 and not alarms, alarms
        assert {f["code"]: f["outcome"] for f in report["findings"]}.keys() >= {"VD214", "VD215"}
        return
    want_code, subject, start = expected.finding
    assert code == 1 and variant_code == want_code  # examples/hybrid/NAME/variant.py's EXPECT_CODE
    assert any(c == want_code and s == subject and m.startswith(start) for c, s, m in alarms), alarms


def test_fast_sees_a_malformed_pattern(tmp_path: Path) -> None:
    """--fast (no import pass) still reads config.json's pattern (VD215's config half)."""
    built = make_examples(tmp_path, "hybrid-pattern-unknown-letter")
    env = dict(os.environ, PYTHONPATH=str(built / "hybrid-pattern-unknown-letter" / "site"))
    proc = run_doctor(["check", str(built / "hybrid-pattern-unknown-letter" / "model"), "--fast", "--json"], env=env)
    report = json.loads(proc.stdout)
    (f,) = [f for f in report["findings"] if f["code"] == "VD215"]
    assert f["outcome"] == "fail" and f["subject"] == "config.json:hybrid_override_pattern[2]"
