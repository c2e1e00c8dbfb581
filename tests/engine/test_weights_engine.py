"""Ground truth for VD301-VD308: what the real vLLM CPU engine does with each weight fixture.

Every fixture with an engine expectation (tests/fixtures/weights.py) runs in a fresh engine
process (VLLM_ENABLE_V1_MULTIPROCESSING=0, enforce_eager, 64 MiB KV cache, max_model_len 256,
PYTHONPATH = the fixture's plugin site), two at a time; where the installed vLLM's answers are
recorded (tests/fixtures/ground_truth.py, tools/record_ground_truth.py) only the family's live
few run and must answer as recorded, the others' answers are the recording's. The engine either
fails with the text the doctor's finding quotes as `vllm_error` (tests/unit/test_weights_replies.py checks that
side), or it runs with a parameter left uninitialised, which greedy decoding shows: the tokens
or logprobs differ from the working model's.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest

from tests.fixtures import ground_truth
from tests.fixtures.weights import FIXTURES, built

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]

FAMILY = ground_truth.FAMILIES["weights"]
ENGINE = {name: fx for name, fx in FIXTURES.items() if fx.engine is not None}
FAILS = sorted(n for n, fx in ENGINE.items() if fx.engine is not None and not fx.engine.ok)
DIFFERS = sorted(n for n, fx in ENGINE.items() if fx.engine is not None and fx.engine.differs_from_ok)


@pytest.fixture(scope="session")
def truth(tmp_path_factory: pytest.TempPathFactory) -> ground_truth.Truth:
    return ground_truth.gather(FAMILY, tmp_path_factory.getbasetemp() / "weight-fixtures")


@pytest.fixture(scope="session")
def engines(truth: ground_truth.Truth) -> dict[str, dict[str, Any]]:
    return truth.answers


def test_the_live_fixtures_answer_as_recorded(truth: ground_truth.Truth) -> None:
    """vLLM still does with the family's live fixtures what it did when the family was recorded
    (none: nothing recorded for this vLLM, every fixture ran live)."""
    ground_truth.assert_as_recorded("weights", truth)


def _differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a["tokens"] != b["tokens"]:
        return True
    for xs, ys in zip(a["logprobs"], b["logprobs"], strict=True):
        for x, y in zip(xs, ys, strict=True):
            if math.isnan(x) or math.isnan(y) or abs(x - y) > 1e-3:
                return True
    return False


def test_the_working_model_runs(engines: dict[str, dict[str, Any]]) -> None:
    ok = engines["ok"]
    assert ok["ok"], ok["error"] or ok["log_tail"]
    assert all(len(t) > 0 for t in ok["tokens"])
    assert all(math.isfinite(x) for xs in ok["logprobs"] for x in xs)


@pytest.mark.parametrize("name", FAILS)
def test_engine_fails_the_way_the_finding_says(engines: dict[str, dict[str, Any]], name: str) -> None:
    res = engines[name]
    expected = FIXTURES[name].engine
    assert expected is not None and expected.error
    assert not res["ok"], f"{name}: the engine ran ({res['tokens']})"
    assert expected.error in (res["error"] or ""), res["error"] or res["log_tail"]


@pytest.mark.parametrize("name", DIFFERS)
def test_engine_runs_with_a_parameter_left_uninitialised(truth: ground_truth.Truth, name: str) -> None:
    """vLLM starts without a word, and the outputs are not the working model's."""
    res, ok = truth.answers[name], truth.beside(name, "ok")
    assert res["ok"], res["error"] or res["log_tail"]
    assert ok["ok"]
    assert _differs(res, ok), (res["tokens"], ok["tokens"])
    assert "not initialized" not in res["log_tail"]


SAME = sorted(n for n, fx in ENGINE.items() if fx.engine is not None and fx.engine.same_as_ok)


@pytest.mark.parametrize("name", SAME)
def test_engine_runs_and_matches_the_working_model(truth: ground_truth.Truth, name: str) -> None:
    """Findings that are information, not failures: fp32-checkpoint (VD304: these float32 values
    were bfloat16 to begin with, casting them back changes nothing) and tied-with-lm-head (VD307:
    vLLM 0.32 unties the head at config time and loads the checkpoint's lm_head.weight)."""
    res, ok = truth.answers[name], truth.beside(name, "ok")
    assert res["ok"], res["error"]
    assert not _differs(res, ok), (res["tokens"], ok["tokens"])


def test_tensor_parallel_size_3_is_rejected_by_vllm(engines: dict[str, dict[str, Any]]) -> None:
    res = engines["tp3"]
    assert not res["ok"]
    assert "Total number of attention heads (4) must be divisible by tensor parallel size (3)." in res["error"]


def test_a_worker_that_fails_in_its_own_process_is_named_with_the_models_line(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Multiprocess engine: the model's __init__ raises inside vLLM's worker process, and vLLM's
    front end only says "Engine core initialization failed. See root cause above". VD500 takes
    the cause from the worker's traceback in the engine log: the error, the phase, the line."""
    import json
    import os

    from tests.conftest import run_doctor

    fx = built(str(tmp_path_factory.getbasetemp() / "weight-fixtures"))["init-raises"]
    proc = run_doctor(
        ["check", str(fx.model_dir), "--engine", "--multiprocess", "--eager", "--select", "VD5", "--json", "-q"],
        env={**os.environ, "PYTHONPATH": str(fx.site_dir)},
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (f,) = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "VD500"]
    assert f["outcome"] == "fail" and f["subject"] == "engine start-up / load"
    assert f["message"].startswith("vLLM failed in load (eager): KeyError: 'factor' (in vLLM's Worker")
    # the line the fixture's bug sits on, in the model file the engine ran
    source = (fx.site_dir / "tiny_doctor_model" / "model.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if 'config.rope_scaling["factor"]' in text)
    assert f"tiny_doctor_model/model.py:{line} in __init__" in f["message"]
    assert "<- reported as: RuntimeError: Engine core initialization failed" in f["evidence"]["vllm_error"]
    assert f["hint"].startswith("fix the line named (") and f"model.py:{line} in __init__" in f["hint"]
