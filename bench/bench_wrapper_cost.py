"""The doctor's own host time per step on a real engine at a large batch (CPU or GPU).

    python bench/bench_wrapper_cost.py [MODEL_DIR] [--requests 256] [--concurrency 64] [--output-len 128]
        [--rounds 3] [--sample-every 8,64] [--execution eager|default] [--step-clock sampled|every]

Starts one engine (single process; without MODEL_DIR a tiny random Llama from
tests/fixtures/engine_models.py), and for each ``--sample-every`` value, ``--rounds`` times,
attaches the doctor (no probe), runs ``--requests`` greedy requests, ``--concurrency`` at a time
(the engine's ``max_num_seqs``; ``--input-len`` in, ``--output-len`` ± 50 % out, the same spread
every round, ignore_eos: requests finish and others start while the rest decode, as on a served
engine under load) and reads ``doctor_overhead``: the doctor's own clock
(``perf_counter`` around its own code inside the worker), per step and per part -- ``wrappers``
(the ``execute_model`` / ``sample_tokens`` wrappers), ``counts`` (the steps' counting, where the
doctor keeps it apart), ``timers`` (forward and logits on sampled steps), ``layer_forwards``
(per-layer timing on sampled steps) -- and its share of the worker's host time of a step. The
medians over rounds are printed as a markdown table with the command.

The engine steps of a tiny model on a CPU are slow, but the doctor's microseconds a step are its
own: what the step wrappers cost with that many requests running. ``--cpu-clock``: the doctor's
own clock reads this thread's CPU time (``time.perf_counter`` is ``time.thread_time`` in this
process once the engine is up: the engine runs in this thread, single process), so time the
thread spent preempted by other work on a loaded machine is not counted as the doctor's. Run it from a tree's root
(``PYTHONPATH=. python bench/bench_wrapper_cost.py``) to measure that tree's doctor.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64, help="the engine's max_num_seqs")
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample-every", default="8,64", help="comma-separated: 8 is profile's and attach's, 64 top's")
    parser.add_argument("--execution", choices=("eager", "default"), default="eager")
    parser.add_argument("--cpu-clock", action="store_true", help="the doctor's clock on this thread's CPU time")
    parser.add_argument("--step-clock", choices=("sampled", "every"), default=None,
                        help="the doctor's step clock (a doctor from before it has none: leave it out)")
    args = parser.parse_args()
    sys.path.insert(0, os.getcwd())  # the tree this runs from, before an editable install
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm_doctor
    from vllm_doctor.analysis.records import EngineProfile
    from vllm_doctor.compat.llm import FAST_ENGINE_KWARGS, EngineHandle, greedy, start_engine
    from vllm_doctor.stages.engine import Workload, make_prompts

    model = args.model
    if model is None:
        from tests.fixtures.engine_models import build_llama_dir

        model = str(build_llama_dir(Path(tempfile.mkdtemp(prefix="bench-wrapper-")) / "tiny-llama", ["LlamaForCausalLM"]))
    extra: dict[str, Any] = dict(FAST_ENGINE_KWARGS)
    if args.execution == "default":
        extra.pop("enforce_eager", None)
    else:
        extra["enforce_eager"] = True
    extra["max_num_seqs"] = args.concurrency
    longest = args.output_len + args.output_len // 2
    llm = start_engine(model, max_model_len=args.input_len + longest + 16, **extra)
    handle = EngineHandle(llm)
    prompts = make_prompts(Workload(args.requests, args.input_len, args.output_len), handle.vocab_size() or 1000)
    rng = random.Random(0)
    params = [
        greedy(max(1, round(args.output_len * (0.5 + rng.random()))), ignore_eos=True) for _ in range(args.requests)
    ]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    if args.cpu_clock:  # the doctor's wrappers read time.perf_counter when they are put on (at attach)
        time.perf_counter = time.thread_time
    options: dict[str, Any] = {} if args.step_clock is None else {"step_clock": args.step_clock}
    rows = []
    wall_clock = time.monotonic
    for every in (int(v) for v in args.sample_every.split(",")):
        per_round: list[dict[str, float]] = []
        for _ in range(args.rounds):
            with vllm_doctor.attach(llm, probe=False, sample_every=every, **options) as doc:
                t = wall_clock()
                llm.generate(prompts, params, use_tqdm=False)
                wall = wall_clock() - t
            engine = doc.report().profiles["engine"]
            over = (engine if isinstance(engine, EngineProfile) else EngineProfile.of(engine)).doctor_overhead
            if over is None or not over.steps:
                raise SystemExit("the doctor recorded no steps")
            per = {k: v / over.steps for k, v in over.host_s.items()}
            per["total"] = sum(per.values())
            per["share"] = over.share or 0.0
            per["steps"] = over.steps
            per["step_ms"] = 1e3 * wall / over.steps
            per_round.append(per)
        rows.append((every, per_round))
    print(f"\ncommand: python bench/bench_wrapper_cost.py {' '.join(sys.argv[1:])}")
    print(f"the doctor's clock: {'thread CPU time' if args.cpu_clock else 'perf_counter (wall)'}; "
          f"load average at the end {os.getloadavg()}")
    print(f"engine: {model} ({args.execution} mode), {args.requests} requests x {args.input_len} in / "
          f"{args.output_len} ± 50 % out, {args.concurrency} at a time, {args.rounds} rounds; "
          f"the doctor from {vllm_doctor.__file__}\n")
    parts = sorted({k for _, runs in rows for r in runs for k in r} - {"total", "share", "steps", "step_ms"})
    print("| sample every | steps | wall ms/step | " + " | ".join(f"{p} µs" for p in parts)
          + " | all µs/step | share of host step |")
    print("|---:|---:|---:|" + "---:|" * len(parts) + "---:|---:|")
    for every, runs in rows:
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in (*parts, "total", "share", "steps", "step_ms")}
        print(f"| {every} | {med['steps']:.0f} | {med['step_ms']:.1f} | "
              + " | ".join(f"{1e6 * med[p]:.1f}" for p in parts)
              + f" | {1e6 * med['total']:.1f} | {100 * med['share']:.2f}% |")


if __name__ == "__main__":
    main()
