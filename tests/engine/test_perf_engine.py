"""The performance lint confirmed by the engine stage: ``check --engine`` on the slow-port example
reads the worker's real model (not the meta-device build) and the op probe's per-class op counts
put a measured cost on the Python loop (VD604). One real engine (eager: the probe needs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, doctor_json, make_examples, variant_env

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = make_examples(tmp_path_factory.mktemp("perf-engine"), "slow-port")
    return out, doctor_json(out, "slow-port", "--engine", "--eager", "--select", "VD6")


def test_the_engine_stage_reads_the_workers_model_and_keeps_one_finding_per_subject(slow: tuple[Path, dict[str, Any]]) -> None:
    _, report = slow
    assert report["facts"]["perf"]["source"] == "engine worker"
    problems = [f for f in report["findings"] if f["outcome"] == "warn"]
    assert sorted({f["code"] for f in problems}) == ["VD601", "VD602", "VD603", "VD604"]
    subjects = [(f["code"], f["subject"]) for f in problems]
    assert len(subjects) == len(set(subjects)), "the static run's findings were replaced, not repeated"


def test_the_op_probe_counts_the_loops_ops_in_the_probed_step(slow: tuple[Path, dict[str, Any]]) -> None:
    _, report = slow
    (loop,) = [f for f in report["findings"] if f["code"] == "VD604"]
    measured = loop["evidence"]["measured"]
    assert measured["instances"] == 2 and measured["step"] in ("decode", "prefill", "mixed")
    # per call of the attention module: q and k rotated head by head (4 + 2 heads, >= 5 ops each)
    assert measured["per_call"] >= 30, measured
    assert f"aten ops per TinyDoctorAttention call in one {measured['step']} step" in loop["message"]
    counts = report["facts"]["perf"]["op_counts"]
    assert counts["tiny_doctor_slow_port.model.TinyDoctorAttention"] == measured["aten_ops"]


def _greedy(examples: Path, name: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "fixtures" / "greedy_tokens.py"), str(examples / name / "model")],
        env=variant_env(examples, name),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("TOKENS ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("TOKENS ") :])


def test_the_slow_port_is_correct_the_same_greedy_tokens_as_the_working_example(tmp_path: Path) -> None:
    """Its findings are about speed only: vLLM's default mode gives both the same tokens."""
    examples = make_examples(tmp_path, "ok", "slow-port")
    ok, slow = _greedy(examples, "ok"), _greedy(examples, "slow-port")
    assert [s["tokens"] for s in slow] == [s["tokens"] for s in ok]
    # bf16 GEMMs of torch.nn.Linear and of vLLM's layers round differently
    worst = max(abs(a - b) for x, y in zip(ok, slow, strict=True) for a, b in zip(x["logprobs"], y["logprobs"], strict=True))
    assert worst < 0.1
