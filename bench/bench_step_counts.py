"""What counting one step costs the worker at a large batch (``StepTracker.observe``, no GPU).

    .venv/bin/python bench/bench_step_counts.py [--requests 128] [--steps 2000]

The profiler counts every step's prefill and decode tokens and the KV blocks in use from the
``SchedulerOutput`` vLLM hands to ``execute_model`` (the real class of the installed vLLM). A
served engine under load rarely has a pure decode step at 128 requests: every step some request
gets a new block (one in 16 decode steps each, at vLLM's block size 16), and when requests finish
and others arrive, a request leaves its prompt. Three kinds of step, each timed over ``--steps``
steps of ``--requests`` running requests:

  decode        every request decoding, no new block (the fast path)
  new blocks    the same, and 1 in 16 requests gets a block
  churn         new blocks, and each step one request finishes and one arrives (its prompt in one
                step, then decoding)

The clock is this thread's CPU time (``time.thread_time``): the work itself, whatever else the
machine runs (a wall clock on a shared box mostly measures the others).

``--against REV`` times the tracker of git revision REV (its ``vllm_doctor/engine/steps.py``)
beside this tree's, ``--repeats`` times each, alternating, and prints the medians of both.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import time
import types
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput

from vllm_doctor.engine.steps import StepTracker


class NewRequest:  # the fields StepTracker reads of vLLM's NewRequestData
    def __init__(self, rid: str, rng: random.Random, prompt_len: int = 128) -> None:
        self.req_id = rid
        self.prompt_token_ids = list(range(prompt_len))
        self.block_ids = ([rng.randrange(1, 10**6) for _ in range(-(-prompt_len // 16))],)
        self.num_computed_tokens = 0


def scheduler_output(
    new: list[Any], live: list[str], blocks: list[Any], finished: set[str], computed: list[int] | None = None
) -> Any:
    """vLLM's SchedulerOutput of a step: ``live`` decoding (one token each; ``computed``: their
    tokens computed, distinct ints as vLLM's are, or 200 each), ``new`` arriving (their prompts
    whole)."""
    cached = CachedRequestData(
        req_ids=list(live), resumed_req_ids=set(), new_token_ids=[], all_token_ids={}, new_block_ids=blocks,
        num_computed_tokens=computed if computed is not None else [200] * len(live),
        num_output_tokens=[1] * len(live),
    )  # fmt: skip
    sched = {**{r: 1 for r in live}, **{n.req_id: len(n.prompt_token_ids) for n in new}}
    return SchedulerOutput(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=sched,
        total_num_scheduled_tokens=sum(sched.values()), scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={}, num_common_prefix_blocks=[], finished_req_ids=finished,
        free_encoder_mm_hashes=[],
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--against", metavar="REV", help="a git revision whose StepTracker is timed beside this tree's")
    ap.add_argument("--repeats", type=int, default=6, help="with --against: runs of each, alternating")
    args = ap.parse_args()
    kinds = ("decode", "new blocks", "churn")
    if not args.against:
        print(f"StepTracker.observe, {args.requests} running requests, {args.steps} steps each (thread CPU time)")
        for kind in kinds:
            print(f"  {kind:<11} {run(StepTracker, kind, args.requests, args.steps):6.1f} µs a step")
        return
    before = tracker_at(args.against)
    print(f"StepTracker.observe, {args.requests} running requests, {args.steps} steps each (thread CPU time), "
          f"medians of {args.repeats} runs alternating: {args.against} against this tree")
    for kind in kinds:
        old, new = [], []
        for _ in range(args.repeats):
            old.append(run(before, kind, args.requests, args.steps))
            new.append(run(StepTracker, kind, args.requests, args.steps))
        print(f"  {kind:<11} {statistics.median(old):6.1f} -> {statistics.median(new):6.1f} µs a step")


def tracker_at(rev: str) -> Any:
    """The StepTracker class of ``vllm_doctor/engine/steps.py`` at git revision ``rev``."""
    source = subprocess.run(["git", "show", f"{rev}:vllm_doctor/engine/steps.py"], cwd=Path(__file__).parent,
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    module = types.ModuleType(f"steps_{rev}")
    exec(compile(source, f"{rev}:vllm_doctor/engine/steps.py", "exec"), module.__dict__)
    return module.StepTracker


def run(tracker_class: Any, kind: str, requests: int, steps: int) -> float:
    """µs of this thread's CPU a step: ``steps`` steps of ``kind`` at ``requests`` running requests."""
    rng = random.Random(0)
    tracker = tracker_class()
    live = [f"r{i}" for i in range(requests)]
    for rid in live:  # each request's prompt, then it decodes
        tracker.observe(scheduler_output([NewRequest(rid, rng)], [], [], set()))
    tracker.observe(scheduler_output([], live, [None] * len(live), set()))
    serial = 0
    outputs = []
    for _ in range(steps):
        blocks: list[Any] = [None] * len(live)
        if kind != "decode":
            blocks = [([rng.randrange(1, 10**6)],) if rng.random() < 1 / 16 else None for _ in live]
        new, finished = [], set()
        if kind == "churn":
            finished = {live.pop(0)}
            blocks.pop(0)
            serial += 1
            new = [NewRequest(f"n{serial}", rng)]
        outputs.append(scheduler_output(new, live, blocks, finished))
        live.extend(n.req_id for n in new)
    t = time.thread_time()
    for so in outputs:
        tracker.observe(so)
    return (time.thread_time() - t) / len(outputs) * 1e6


if __name__ == "__main__":
    main()
