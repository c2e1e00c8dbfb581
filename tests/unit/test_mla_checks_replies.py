"""The doctor's finding on each example of the MLA family before launch (``vllm-doctor check``:
the import and weights passes, no engine), on the passes' recorded replies
(tests/fixtures/engine_replies.py, ``tools/record_engine_replies.py --family check-mla``), against
what vLLM does with each (tests/fixtures/mla_expected.py, recorded on the real engine by
tests/engine/test_mla_ground_truth.py). That vLLM still answers the passes as recorded:
tests/integration/test_check_replies_drift.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures import engine_replies
from tests.fixtures.engine_replies import check_name
from tests.fixtures.mla_expected import EXPECTED


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``vllm-doctor check --json -q`` of each variant replayed: name -> (exit code, report, the run,
    the variant's ``expect_code``), as tests/conftest.check_family gives them."""
    workdir = tmp_path_factory.mktemp("mla-replies")
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
    outcomes = {f["code"]: f["outcome"] for f in report["findings"]}
    if expected.finding is None or expected.engine_only:
        # mla-ok; a prefix that is no place in the model: vLLM runs it, VD208 on the engine and VD217 before
        # launch warn (exit 0: a warning)
        warned = [a for a in alarms if expected.before_launch and a[0] == expected.before_launch[0]]
        assert code == 0 and alarms == warned, alarms
        if expected.before_launch is not None:
            _, subject, start = expected.before_launch
            assert any(s == subject and m.startswith(start) for _, s, m in warned), warned
            assert len(warned) == 2  # one per layer
        assert outcomes.get("VD216") == "pass", outcomes
        if expected.finding is not None:
            assert variant_code == expected.finding[0]
        return
    want_code, subject, start = expected.finding
    assert code == 1 and variant_code == want_code  # examples/mla/NAME/variant.py's EXPECT_CODE
    assert any(c == want_code and s == subject and m.startswith(start) for c, s, m in alarms), alarms


def test_a_hard_coded_latent_is_named_per_layer_with_both_sizes(checks: dict[str, Any]) -> None:
    """VD216 names every MLA layer built with DeepSeek-V2's sizes, each with its size and config.json's;
    VD303 names the checkpoint tensors that will not fit (vLLM's own load error is one tensor's)."""
    _, report, _, _ = checks["mla-kv-lora-rank-hardcoded"]
    vd216 = [(f["subject"], f["message"]) for f in report["findings"] if f["code"] == "VD216"]
    assert vd216 == [
        (f"model.layers.{i}.self_attn.mla_attn.mla_attn",
         f"model.layers.{i}.self_attn.mla_attn.mla_attn: MLA latent with kv_lora_rank 512 (config.json: 256)")
        for i in range(2)
    ]  # fmt: skip
    vd303 = {f["subject"] for f in report["findings"] if f["code"] == "VD303" and f["outcome"] == "fail"}
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in vd303


def test_a_model_type_vllm_does_not_read_as_mla_says_vllms_error(checks: dict[str, Any]) -> None:
    _, report, _, _ = checks["mla-model-type-unknown"]
    (f,) = [f for f in report["findings"] if f["code"] == "VD216"]
    assert f["outcome"] == "fail"
    assert "a head of 32, not the latent's 576 (kv_lora_rank 512 + qk_rope_head_dim 64)" in f["message"]
    assert f["message"].endswith("'Head dimension 32 is not supported by MLA.'")
    assert "MODEL_ARCH_CONFIG_CONVERTORS" in f["hint"]
