"""VD502 on plain data: preemptions counted from a SchedulerOutput, and the check over the counts
(the real engine whose KV cache is too small: tests/engine/test_engine_preemption.py)."""

from __future__ import annotations

from vllm_doctor.checks import run_checks
from vllm_doctor.engine.steps import StepTracker, counts_dict
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.model import Outcome


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
