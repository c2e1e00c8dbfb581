"""Checks by topic: every check has one, and the front ends' code sets come from the catalogue."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_doctor.checks import CATALOGUE, TOPICS, check, codes_for, reads_startup_error
from vllm_doctor.model import Severity, Stage
from vllm_doctor.pytest_plugin.fixtures import KV_TOPICS, PLACEMENT_TOPICS, WEIGHT_TOPICS, assertion_codes


def test_every_check_has_one_known_topic_and_every_topic_a_check() -> None:
    assert {c: m.topic for c, m in ((c, e.meta) for c, e in CATALOGUE.items()) if m.topic not in TOPICS} == {}
    assert {CATALOGUE[c].meta.topic for c in CATALOGUE} == set(TOPICS)


def test_the_assertions_fail_on_the_same_codes_as_their_old_lists() -> None:
    """The pytest plugin kept these lists by hand; the topic queries give the same sets."""
    # and the fused-MoE experts' (VD311, VD312) and the towers' (VD313), in the weights topic since they came
    assert assertion_codes(WEIGHT_TOPICS) == {
        "VD301", "VD302", "VD303", "VD306", "VD307", "VD308", "VD311", "VD312", "VD313", "VD314", "VD315", "VD316",
        "VD317",
    }  # fmt: skip
    # and VD407 (a linear layer left unquantized in a quantized model) since it came
    assert assertion_codes(PLACEMENT_TOPICS) == {"VD401", "VD402", "VD407", "VD500"}
    assert assertion_codes(KV_TOPICS) == {"VD500", "VD501", "VD504"}


def test_the_weights_pass_and_the_kv_pane_take_their_codes_from_the_catalogue() -> None:
    from vllm_doctor.stages.weights import LOAD_CODES, WEIGHT_CODES
    from vllm_doctor.tui.report_sections import KV_CODES

    assert LOAD_CODES == ("VD301", "VD302", "VD303", "VD304", "VD311", "VD312", "VD313", "VD314", "VD315", "VD317")
    assert WEIGHT_CODES == (
        "VD301", "VD302", "VD303", "VD304", "VD305", "VD306", "VD307", "VD308", "VD311", "VD312", "VD313", "VD314",
        "VD315", "VD316", "VD317",
    )  # fmt: skip
    assert KV_CODES == ("VD501", "VD502", "VD504")


def test_the_checks_that_read_vllms_startup_error() -> None:
    assert {c for c in CATALOGUE if reads_startup_error(c)} == {"VD500", "VD501", "VD208"}


def test_codes_for_filters_by_stage_and_severity_and_refuses_an_unknown_topic() -> None:
    assert codes_for("ranks") == ("VD305", "VD406")
    assert codes_for("ranks", stage=Stage.ENGINE) == ("VD406",)
    assert codes_for("kv-cache", at_least=Severity.ERROR) == ("VD501", "VD504")
    assert codes_for() == ()
    with pytest.raises(ValueError, match="unknown topic"):
        codes_for("kv_cache")


def test_a_check_needs_a_known_topic() -> None:
    with pytest.raises(ValueError, match="VD997: unknown topic 'nonsense'"):
        check("VD997", "x", "s", severity=Severity.INFO, stage=Stage.STATIC, what="", why="", example="", fix="",
              topic="nonsense")
    assert "VD997" not in CATALOGUE


def test_rules_show_the_topic() -> None:
    def rules(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "vllm_doctor", "rules", *args], capture_output=True, text=True,
                              check=True).stdout

    data = {r["code"]: r for r in json.loads(rules("--json"))}
    assert data["VD401"]["topic"] == "placement" and data["VD500"]["reads_startup_error"] is True
    assert data["VD101"]["topic"] == "registry" and data["VD101"]["reads_startup_error"] is False
    line = next(line for line in rules().splitlines() if line.startswith("VD501"))
    assert " kv-cache " in line
