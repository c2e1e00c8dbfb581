"""What an unsampled step costs the worker on the doctor's path, in a hot loop (no GPU).

    .venv/bin/python bench/bench_step_path.py [--requests 128] [--steps 3000] [--repeats 5] [--cold [--torch]] [--against REV]

The floor under the doctor's own budget: every step, sampled or not, runs the session's
``execute_model`` and ``sample_tokens`` wrappers (vllm_doctor/engine/session.py) around vLLM's
methods, the profiler's step bookkeeping and, in batches, the counts
(vllm_doctor/engine/steps.py). Here the real wrappers wrap two empty methods (a V2 runner's
``execute_model`` returns None, ``sample_tokens`` the output), the profiler runs on a device-clock
stand-in whose marks are plain objects (the sampled step clock puts an event pair on every 32nd
step: here a mark costs an object, not a CUDA call), no step is due for a sample, and each step
hands the wrappers vLLM 0.32's own ``SchedulerOutput`` of
``--requests`` running requests (bench_step_counts.py's steps), made just before its call, as
vLLM's scheduler makes it just before the worker's (with ``--cold``; the hot loop makes them
first):

  new blocks    every request decoding, 1 in 16 gets a block (an offline batch's decode steps)
  churn         the same, and each step one request finishes and one arrives
  served        a served engine's mix, as bench_footprint.py's served runs on the H100 had it (128
                clients, prompts of about 10 tokens, 256 +- 50 % tokens out): every request
                decoding, 1 in 16 gets a block, a request finishes at a random place in the list
                on half the steps, and a third of the steps are mixed, with one or two arrivals;
                vLLM's request ids ("cmpl-<hex>-0-<hex>") and computed-token counts (distinct ints)

The clock is this thread's CPU time, per step, the median of ``--repeats`` runs. In a serving
engine the same code runs cold between vLLM's own Python: on an H100 host it cost 2.5-3 times
this loop's figure (bench/README.md). ``--cold`` runs a stand-in for vLLM's Python before each
of the two calls (a walk over :data:`COLD_OBJECTS` objects, about 20 MB: what the CPU's caches
held of the doctor is gone) and times the two calls alone (perf_counter around each; the
counting of the last batch included): the cold cost, where a lock or a call costs several
times its hot figure. With ``--torch`` the stand-in first runs 384 small torch operations (torch's
C++ dispatch, as vLLM's step runs it: what it pushes out of the caches is the interpreter's and
torch's machine code too, not only Python objects). The hot loop measures the code's own work;
the cold one what touching it costs. Run it from a tree's root (``PYTHONPATH=. python bench/bench_step_path.py``) to measure
that tree; ``--against REV`` times that revision beside this tree, each run a new process, the
two alternating (a machine whose speed drifts, as this one's does by 10-20 % over minutes, moves
both), the medians side by side.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_step_counts as counts

KINDS = ("new blocks", "churn", "served")


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


def steps(kind: str, requests: int, n: int) -> Iterator[Any]:
    """``n`` SchedulerOutputs of ``kind`` after each request's prompt (bench_step_counts.py's),
    each made when it is asked for: as vLLM's scheduler makes a step's output just before the
    worker's ``execute_model``, its objects are fresh in the CPU's caches there."""
    rng = random.Random(0)
    live = [f"r{i}" for i in range(requests)]
    for rid in list(live):
        yield counts.scheduler_output([counts.NewRequest(rid, rng)], [], [], set())
    yield counts.scheduler_output([], live, [None] * len(live), set())
    if kind == "served":
        yield from served_steps(rng, live, n)
        return
    serial = 0
    for _ in range(n):
        blocks: list[Any] = [([rng.randrange(1, 10**6)],) if rng.random() < 1 / 16 else None for _ in live]
        new, finished = [], set()
        if kind == "churn":
            finished = {live.pop(0)}
            blocks.pop(0)
            serial += 1
            new = [counts.NewRequest(f"n{serial}", rng)]
        yield counts.scheduler_output(new, live, blocks, finished)
        live.extend(x.req_id for x in new)


def served_steps(rng: random.Random, live: list[str], n: int) -> Iterator[Any]:
    """``served``'s steps after the first ``live`` requests' prompts (see the module's text)."""

    def rid() -> str:
        return f"cmpl-{rng.getrandbits(64):016x}-0-{rng.getrandbits(32):08x}"

    computed = {r: 10 + rng.randrange(256) for r in live}
    for _ in range(n):
        finished = set()
        if rng.random() < 0.5:
            gone = live.pop(rng.randrange(len(live)))
            finished.add(gone)
            del computed[gone]
        new = [counts.NewRequest(rid(), rng, 10) for _ in range(rng.choice((1, 1, 2)))] if rng.random() < 0.36 else []
        blocks: list[Any] = [([rng.randrange(1, 10**6)],) if rng.random() < 1 / 16 else None for _ in live]
        yield counts.scheduler_output(new, live, blocks, finished, [computed[r] for r in live])
        for r in live:
            computed[r] += 1
        for x in new:
            live.append(x.req_id)
            computed[x.req_id] = 10


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


_TORCH: list[Any] = []


def vllms_torch() -> int:
    """The stand-in with torch's C++ dispatch first (``--torch``): 384 additions of small tensors."""
    import torch

    if not _TORCH:
        _TORCH.extend(torch.ones(8) for _ in range(65))
    s, ys = _TORCH[0], _TORCH[1:]
    for _ in range(6):
        for y in ys:
            s = torch.add(s, y)
    return vllms_python()


def run(kind: str, requests: int, n: int, cold: bool = False, torch_work: bool = False) -> float:
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
    for so in islice(sos, warm):
        prof._phase_steps = [1 << 20] * 3  # nothing due for a sample
        execute(so)
        sample(None)
    prof.count_pending()
    if cold:
        clock, total = time.perf_counter, 0.0
        stand_in = vllms_torch if torch_work else vllms_python
        while True:
            stand_in()  # (the scheduler's own Python, then its output: fresh)
            so = next(sos, None)
            if so is None:
                break
            t = clock()
            execute(so)
            total += clock() - t
            del so  # the doctor's references only (vLLM lets a step's output go when it ends)
            stand_in()
            t = clock()
            sample(None)
            total += clock() - t
        t = clock()
        prof.count_pending()
        return (total + clock() - t) / n * 1e6
    made = list(sos)  # (the outputs made before the clock starts: the hot loop times the doctor alone)
    # the premade outputs are frozen out of the garbage collector's scans, as vLLM freezes its heap
    # after start-up (freeze_gc_heap): else, in a fresh process, the collector scanning thousands of
    # live outputs in the timed loop is most of the churn's figure (about 100 µs a step, both trees)
    gc.collect()
    gc.freeze()
    try:
        t = time.thread_time()
        for so in made:
            execute(so)
            sample(None)
        prof.count_pending()  # the last batch's counting: the steps' own
        return (time.thread_time() - t) / n * 1e6
    finally:
        gc.unfreeze()


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
    ap.add_argument("--torch", action="store_true", help="with --cold: the stand-in runs torch operations first")
    ap.add_argument("--against", metavar="REV", help="a git revision timed beside this tree: each run a new process, "
                    "the two trees alternating (a machine's drift falls on both)")
    ap.add_argument("--one", metavar="KIND", help=argparse.SUPPRESS)  # (--against's child: one run, its µs printed)
    args = ap.parse_args()
    steps_n = min(args.steps, 600) if args.cold else args.steps
    if args.one:
        print(run(args.one, args.requests, steps_n, args.cold, args.torch))
        return
    clock = "perf_counter around the calls, cold" if args.cold else "thread CPU time"
    clock += ", the stand-in with torch operations" if args.cold and args.torch else ""
    print(
        f"the doctor's path of an unsampled step, {args.requests} running requests, {steps_n} steps, "
        f"medians of {args.repeats} runs ({clock})" + (f", {args.against} against this tree" if args.against else "")
    )
    if args.against:
        against(args, steps_n)
        return
    for kind in KINDS:
        med = statistics.median(run(kind, args.requests, steps_n, args.cold, args.torch) for _ in range(args.repeats))
        print(f"  {kind:<11} {med:6.1f} µs a step")


def against(args: argparse.Namespace, steps_n: int) -> None:
    """Each run in a new process, ``args.against``'s vllm_doctor (git archive into a temporary
    directory) and this tree's alternating; the medians side by side."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.against, "vllm_doctor"], cwd=root, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)

        def one(tree: str, kind: str) -> float:
            cmd = [sys.executable, __file__, "--one", kind, "--requests", str(args.requests), "--steps", str(steps_n)]
            env = {**__import__("os").environ, "PYTHONPATH": tree}
            cmd += (["--cold"] if args.cold else []) + (["--torch"] if args.torch else [])
            out = subprocess.run(cmd, env=env, check=True, capture_output=True,
                                 text=True).stdout
            return float(out.split()[-1])

        for kind in KINDS:
            old: list[float] = []
            new: list[float] = []
            for _ in range(args.repeats):
                old.append(one(tmp, kind))
                new.append(one(str(root), kind))
            print(f"  {kind:<11} {statistics.median(old):6.1f} -> {statistics.median(new):6.1f} µs a step")


if __name__ == "__main__":
    main()
