"""The MLA family on the real engine through the doctor: ``check --engine`` names the port whose MLA
wrapper was given a prefix that is no place in the model (VD208: vLLM itself runs it silently,
tests/engine/test_mla_ground_truth.py). Eager (``--eager``): a fast engine. ``profile`` of the
working example is tests/unit/test_mla_profile_replies.py's, on its engine's recorded reply."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.conftest import make_examples, run_doctor
from tests.fixtures.mla_expected import EXPECTED

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]



@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("mla-examples"), "mla-wrong-prefix")


def _env(built: Path, name: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(built / name / "site"))


def test_check_engine_names_a_prefix_that_is_no_place_in_the_model(built: Path) -> None:
    proc = run_doctor(["check", str(built / "mla-wrong-prefix" / "model"), "--engine", "--eager", "--json"],
                      env=_env(built, "mla-wrong-prefix"), timeout=600)  # fmt: skip
    report = json.loads(proc.stdout)
    warned = [(f["subject"], f["message"]) for f in report["findings"] if f["code"] == "VD208" and f["outcome"] == "warn"]
    code, subject, message = EXPECTED["mla-wrong-prefix"].finding or ("", "", "")
    assert code == "VD208" and warned[0] == (subject, message), warned
    assert warned[1] == (
        "model.layers.1.self_attn.attn.attn",
        "attention layer registered as 'model.layers.1.self_attn.attn.attn' sits at "
        "'model.layers.1.self_attn.mla_attn.mla_attn'",
    )
    assert proc.returncode == 1  # a warning
