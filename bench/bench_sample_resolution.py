"""What a sampled step's bookkeeping costs the host in compiled modes, without a GPU.

    .venv/bin/python bench/bench_sample_resolution.py [--layers 32] [--requests 128] [--steps 400]

Drives the forward profiler (``vllm_doctor.engine.profiler.ForwardProfiler``, the wall clock's
marks: no CUDA event is read here) through ``--steps`` sampled decode steps of ``--requests``
requests, each with the forward's marks and the two attention calls of each of ``--layers``
layers (what vLLM's attention ops call in a compiled forward, or a FULL CUDA graph's captured
events give once read), and times ``after_sample``: the step's end, and the resolution of the
sampled steps into records (in batches of 32: the layers' spans, their sums, the trace). On a
GPU each of those marks is also a CUDA event read (``elapsed_time``, about 4 µs each on the
H200: bench_cuda_marks.py), two per layer. The clock is this thread's CPU time.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace
from typing import Any

from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.profiler import ForwardProfiler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    attn = [f"model.layers.{i}.self_attn.attn" for i in range(args.layers)]
    prof = ForwardProfiler(WallClock(), [], sample_every=1)
    prof.layers_enabled = True
    prof.set_boundaries([(a, a.rsplit(".self_attn", 1)[0], i, "FlashAttentionImpl") for i, a in enumerate(attn)])
    rids = [f"r{i}" for i in range(args.requests)]

    def step(first: bool) -> Any:
        new = [SimpleNamespace(req_id=r, prompt_token_ids=[1] * 4, block_ids=([i + 1],), num_computed_tokens=0)
               for i, r in enumerate(rids)] if first else []  # fmt: skip
        cached = SimpleNamespace(req_ids=[] if first else rids, num_computed_tokens=[] if first else [4] * len(rids),
                                 new_block_ids=[] if first else [None] * len(rids), resumed_req_ids=set())  # fmt: skip
        sched = dict.fromkeys(rids, 4 if first else 1)
        return SimpleNamespace(scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=sched,
                               total_num_scheduled_tokens=sum(sched.values()), scheduled_spec_decode_tokens={},
                               finished_req_ids=set(), preempted_req_ids=set())  # fmt: skip

    spent = 0.0
    for i in range(args.steps):
        prof.begin_step(step(i == 0))
        prof.module_enter("", True)
        for name in attn:
            for _ in ("do_kv_cache_update", "forward"):
                prof.boundary(name, True)
                prof.boundary(name, False)
        prof.module_exit("")
        prof.module_enter("logits_processor", True)
        prof.module_exit("logits_processor")
        prof.after_execute(0.001, output_is_final=False)
        t = time.thread_time()
        prof.after_sample(0.0005)
        spent += time.thread_time() - t
    t = time.thread_time()
    prof.resolve(block=True)
    spent += time.thread_time() - t
    print(f"{args.layers} layers, {args.requests} requests: a sampled step's end and resolution "
          f"{spent / args.steps * 1e6:.1f} µs of CPU each ({args.steps} steps), without reading any CUDA event")


if __name__ == "__main__":
    main()
