"""What an unsampled step costs the worker on the doctor's path, in a hot loop (no GPU).

    .venv/bin/python bench/bench_step_path.py [--requests 128] [--steps 3000] [--repeats 5] [--cold]

The floor under the doctor's own budget: every step, sampled or not, runs the session's
``execute_model`` and ``sample_tokens`` wrappers (vllm_doctor/engine/session.py) around vLLM's
methods, the profiler's step bookkeeping and, in batches, the counts
(vllm_doctor/engine/steps.py). Here the real wrappers wrap two empty methods (a V2 runner's
``execute_model`` returns None, ``sample_tokens`` the output), the profiler runs on a device-clock
stand-in whose marks are plain objects (the sampled step clock puts an event pair on every 32nd
step: here a mark costs an object, not a CUDA call), no step is due for a sample, and each step
hands the wrappers vLLM 0.32's own ``SchedulerOutput`` of
``--requests`` running requests (bench_step_counts.py's steps):

  new blocks    every request decoding, 1 in 16 gets a block (an offline batch's decode steps)
  churn         the same, and each step one request finishes and one arrives (a served engine)

The clock is this thread's CPU time, per step, the median of ``--repeats`` runs. In a serving
engine the same code runs cold between vLLM's own Python: on an H100 host it cost 2.5-3 times
this loop's figure (bench/README.md). ``--cold`` runs a stand-in for vLLM's Python before each
of the two calls (a walk over :data:`COLD_OBJECTS` objects, about 20 MB: what the CPU's caches
held of the doctor is gone) and times the two calls alone (perf_counter around each; the
counting of the last batch included): the cold cost, where a lock or a call costs several
times its hot figure. The hot loop measures the code's own work; the cold one what touching it
costs. Run it from a tree's root (``PYTHONPATH=. python bench/bench_step_path.py``) to measure
that tree.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_step_counts as counts


class Events:
    """A device clock whose marks are plain objects, all completed at once."""

    kind, domain, one_stream = "cuda_events", "device", True

    def mark(self, refresh: bool = False) -> Any:
        return object()

    @staticmethod
    def capturing() -> bool:
        return False

    def ready(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        return None

    def seconds(self, start: Any, end: Any) -> float:
        return 0.0


def steps(kind: str, requests: int, n: int) -> list[Any]:
    """``n`` SchedulerOutputs of ``kind`` after each request's prompt (bench_step_counts.py's)."""
    rng = random.Random(0)
    live = [f"r{i}" for i in range(requests)]
    out = [counts.scheduler_output([counts.NewRequest(rid, rng)], [], [], set()) for rid in live]
    out.append(counts.scheduler_output([], live, [None] * len(live), set()))
    serial = 0
    for _ in range(n):
        blocks: list[Any] = [([rng.randrange(1, 10**6)],) if rng.random() < 1 / 16 else None for _ in live]
        new, finished = [], set()
        if kind == "churn":
            finished = {live.pop(0)}
            blocks.pop(0)
            serial += 1
            new = [counts.NewRequest(f"n{serial}", rng)]
        out.append(counts.scheduler_output(new, live, blocks, finished))
        live.extend(x.req_id for x in new)
    return out


COLD_OBJECTS = 100_000
_JUNK: list[dict[str, Any]] = []


def vllms_python() -> int:
    """A stand-in for vLLM's own Python between the doctor's calls: a walk over many objects."""
    if not _JUNK:
        _JUNK.extend({"a": i, "b": [i], "c": str(i)} for i in range(3 * COLD_OBJECTS))
    s = 0
    for d in _JUNK[::3]:
        s += d["a"]
    return s


def run(kind: str, requests: int, n: int, cold: bool = False) -> float:
    """µs a step on the doctor's path (vLLM's methods empty): this thread's CPU time in a hot
    loop, or (``cold``) perf_counter around each call, with vLLM's stand-in before each."""
    from vllm_doctor.engine.profiler import ForwardProfiler
    from vllm_doctor.engine.session import WorkerSession

    session = WorkerSession(SimpleNamespace())
    prof = ForwardProfiler(Events(), [], sample_every=1 << 30, **budget_off())  # type: ignore[arg-type]
    prof.own = session.own_s
    session.profiler = prof
    execute = session._execute_wrapper(lambda so: None)
    sample = session._sample_wrapper(lambda grammar: "output")
    sos = steps(kind, requests, n)
    warm = requests + 1 + 2 * 8  # the prompts and the warm-up samples of both phases
    for so in sos[:warm]:
        prof._phase_steps = [1 << 20] * 3  # nothing due for a sample
        execute(so)
        sample(None)
    prof.count_pending()
    if cold:
        clock, total = time.perf_counter, 0.0
        for so in sos[warm:]:
            vllms_python()
            t = clock()
            execute(so)
            total += clock() - t
            vllms_python()
            t = clock()
            sample(None)
            total += clock() - t
        t = clock()
        prof.count_pending()
        return (total + clock() - t) / (len(sos) - warm) * 1e6
    t = time.thread_time()
    for so in sos[warm:]:
        execute(so)
        sample(None)
    prof.count_pending()  # the last batch's counting: the steps' own
    return (time.thread_time() - t) / (len(sos) - warm) * 1e6


def budget_off() -> dict[str, Any]:
    """The profiler without a budget where it has one (a tree from before it has none)."""
    import inspect

    from vllm_doctor.engine.profiler import ForwardProfiler

    return {"own_budget": 0.0} if "own_budget" in inspect.signature(ForwardProfiler).parameters else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="vLLM's stand-in before each call; the calls timed alone")
    args = ap.parse_args()
    steps_n = min(args.steps, 600) if args.cold else args.steps
    clock = "perf_counter around the calls, cold" if args.cold else "thread CPU time"
    print(
        f"the doctor's path of an unsampled step, {args.requests} running requests, {steps_n} steps, "
        f"medians of {args.repeats} runs ({clock})"
    )
    for kind in ("new blocks", "churn"):
        med = statistics.median(run(kind, args.requests, steps_n, args.cold) for _ in range(args.repeats))
        print(f"  {kind:<11} {med:6.1f} µs a step")


if __name__ == "__main__":
    main()
