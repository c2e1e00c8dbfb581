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
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput

from vllm_doctor.engine.steps import StepTracker


class NewRequest:  # the fields StepTracker reads of vLLM's NewRequestData
    def __init__(self, rid: str, rng: random.Random) -> None:
        self.req_id = rid
        self.prompt_token_ids = list(range(128))
        self.block_ids = ([rng.randrange(1, 10**6) for _ in range(8)],)


def scheduler_output(new: list[Any], live: list[str], blocks: list[Any], finished: set[str]) -> Any:
    cached = CachedRequestData(
        req_ids=list(live), resumed_req_ids=set(), new_token_ids=[], all_token_ids={}, new_block_ids=blocks,
        num_computed_tokens=[200] * len(live), num_output_tokens=[1] * len(live),
    )  # fmt: skip
    sched = {**{r: 1 for r in live}, **{n.req_id: 128 for n in new}}
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
    args = ap.parse_args()
    rng = random.Random(0)
    tracker = StepTracker()
    live = [f"r{i}" for i in range(args.requests)]
    for rid in live:  # each request's prompt, then it decodes
        tracker.observe(scheduler_output([NewRequest(rid, rng)], [], [], set()))
    tracker.observe(scheduler_output([], live, [None] * len(live), set()))
    serial = 0

    def step(kind: str) -> Any:
        nonlocal serial
        blocks: list[Any] = [None] * len(live)
        if kind != "decode":
            blocks = [([rng.randrange(1, 10**6)],) if rng.random() < 1 / 16 else None for _ in live]
        new, finished = [], set()
        if kind == "churn":
            finished = {live.pop(0)}
            blocks.pop(0)
            serial += 1
            new = [NewRequest(f"n{serial}", rng)]
        so = scheduler_output(new, live, blocks, finished)
        live.extend(n.req_id for n in new)
        return so

    print(f"StepTracker.observe, {args.requests} running requests, {args.steps} steps each (thread CPU time)")
    for kind in ("decode", "new blocks", "churn"):
        outputs = [step(kind) for _ in range(args.steps)]
        t = time.thread_time()
        for so in outputs:
            tracker.observe(so)
        print(f"  {kind:<11} {(time.thread_time() - t) / len(outputs) * 1e6:6.1f} µs a step")


if __name__ == "__main__":
    main()
