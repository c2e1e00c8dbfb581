"""VD502: preemptions counted from the SchedulerOutput, on plain data and on a real engine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.checks import run_checks
from vllm_doctor.engine.steps import StepTracker, counts_dict
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.model import Outcome

REPO_ROOT = Path(__file__).resolve().parent.parent


class _Cached:
    def __init__(self, req_ids: list[str], resumed: set[str]) -> None:
        self.req_ids = req_ids
        self.resumed_req_ids = resumed
        self.new_block_ids = [None] * len(req_ids)
        self.num_computed_tokens = [10] * len(req_ids)


class _SchedulerOutput:
    def __init__(self, cached: _Cached, preempted: set[str]) -> None:
        self.scheduled_new_reqs: list[object] = []
        self.scheduled_cached_reqs = cached
        self.num_scheduled_tokens = {rid: 1 for rid in cached.req_ids}
        self.preempted_req_ids = preempted
        self.finished_req_ids: set[str] = set()


def test_step_tracker_counts_preempted_and_resumed_requests() -> None:
    counts = counts_dict(StepTracker().observe(_SchedulerOutput(_Cached(["a", "b"], resumed={"b"}), preempted={"c", "d"})))
    assert (counts["preempted_reqs"], counts["resumed_reqs"]) == (2, 1)


def _facts(steps: list[dict]) -> EngineFacts:
    return EngineFacts(workers=[WorkerFacts(rank=0, parts={"profile": {"steps": steps, "num_blocks": 5}})])


def test_vd502_warns_with_counts_and_peak_usage() -> None:
    steps = [{"kv_blocks_used": 2}, {"kv_blocks_used": 4, "preempted_reqs": 1}, {"kv_blocks_used": 3, "resumed_reqs": 1}]
    (f,) = run_checks(_facts(steps), ["VD502"])
    assert f.outcome is Outcome.WARN
    assert f.message == "1 request(s) preempted and recomputed; KV cache peaked at 100% of 4 usable blocks"
    assert f.evidence["steps_with_preemption"] == 2


def test_vd502_passes_without_preemption_and_skips_without_steps() -> None:
    (ok,) = run_checks(_facts([{"kv_blocks_used": 1}]), ["VD502"])
    assert ok.outcome is Outcome.PASS and "25% of 4" in ok.message
    (skip,) = run_checks(_facts([]), ["VD502"])
    assert skip.outcome is Outcome.SKIP


@pytest.mark.engine
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vd502_on_a_real_engine_whose_kv_cache_is_too_small(tmp_path: Path) -> None:
    """Four 200-token generations in a 3-block (384-token) KV cache: vLLM must preempt."""
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.fixtures.preemption_child", str(out)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert out.exists(), proc.stderr[-4000:]
    data = json.loads(out.read_text())
    (f,) = data["vd502"]
    assert f["outcome"] == "warn"
    assert f["evidence"]["preempted"] >= 1 and f["evidence"]["peak_usage"] == 1.0
    assert data["generated"] == [200, 200, 200, 200]  # preemption costs time, not tokens
