"""The MLA family on the real engine through the doctor: ``profile`` runs the working example and
times its MLA layers as ``mla``; ``check --engine`` names the port whose MLA wrapper was given a
prefix that is no place in the model (VD208: vLLM itself runs it silently,
tests/engine/test_mla_ground_truth.py). Both eager (``--eager``): a fast engine, and neither is
about vLLM's compiled mode (the default mode's ``profile`` of mla-ok times the same layers at
``MLAAttention.forward_impl``: docs/attention-kinds.md)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.conftest import make_examples, run_doctor
from tests.fixtures.mla_expected import EXPECTED

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]

PROFILE = ["--eager", "--prompts", "4", "--input-len", "32", "--output-len", "16", "--max-model-len", "512"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("mla-examples"), "mla-ok", "mla-wrong-prefix")


def _env(built: Path, name: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(built / name / "site"))


def test_profile_times_the_mla_layers_as_mla(built: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_doctor(["profile", str(built / "mla-ok" / "model"), "--out", str(out), *PROFILE],
                      env=_env(built, "mla-ok"), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    alarms = [(f["code"], f["message"]) for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")]
    assert not alarms, alarms
    layers = report["profiles"]["engine"]["layers"]
    kinds = {m["name"]: m["kind"] for m in layers["modules"]}
    assert (kinds["model.layers.0.self_attn"], kinds["model.layers.1.self_attn"]) == ("mla", "mla"), kinds
    assert "mla" in layers["by_kind"]
    groups = report["facts"]["engine"]["kv_cache"]["groups"]
    assert [g["kind"] for g in groups] == ["mla"], groups
    assert "one latent head x 576" in proc.stdout


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
