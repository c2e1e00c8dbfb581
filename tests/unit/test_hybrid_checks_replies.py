"""The doctor's finding on each example of the hybrid family before launch (``vllm-doctor check``:
the import and weights passes, no engine), on the passes' recorded replies
(tests/fixtures/engine_replies.py, ``tools/record_engine_replies.py --family check-hybrid``), against
what vLLM does with each (tests/fixtures/hybrid_expected.py, recorded on the real engine by
tests/engine/test_hybrid_ground_truth.py). That vLLM still answers the passes as recorded:
tests/integration/test_check_replies_drift.py."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.conftest import run_doctor
from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import check_name
from tests.fixtures.hybrid_expected import EXPECTED


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``vllm-doctor check --json -q`` of each variant replayed: name -> (exit code, report, the run,
    the variant's ``expect_code``), as tests/conftest.check_family gives them."""
    workdir = tmp_path_factory.mktemp("hybrid-replies")
    got = {}
    for name in EXPECTED:
        run = engine_replies.replay(check_name(name), workdir)
        expect = json.loads((run.model.parent / "variant.json").read_text())["expect_code"]
        got[name] = (run.rc, run.report() if run.stdout.strip().startswith("{") else None, run, expect)
    return got


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


def test_fast_sees_a_malformed_pattern(checks: dict[str, Any]) -> None:
    """--fast (no import pass) still reads config.json's pattern (VD215's config half)."""
    variant = checks["hybrid-pattern-unknown-letter"][2].model.parent
    env = dict(os.environ, PYTHONPATH=str(variant / "site"))
    proc = run_doctor(["check", str(variant / "model"), "--fast", "--json"], env=env)
    report = json.loads(proc.stdout)
    (f,) = [f for f in report["findings"] if f["code"] == "VD215"]
    assert f["outcome"] == "fail" and f["subject"] == "config.json:hybrid_override_pattern[2]"
