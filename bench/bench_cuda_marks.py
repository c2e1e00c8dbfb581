"""What the doctor's per-step CUDA primitives cost in a loop, on a GPU (an idle process).

    PYTHONPATH=. python3 bench/bench_cuda_marks.py

Each primitive called 20,000 times back to back, the wall clock per call: ``perf_counter``, the
current stream's raw handle (what a step's start mark asks first), ``torch.cuda.current_stream()``,
an event record (on an idle stream, and while 50 matmuls run), the doctor's own mark
(:meth:`CudaEventClock.mark` with a refresh, its event given back), ``elapsed_time`` and ``query``.
A loop is the best case: the same calls made once a step inside a serving engine run cold
(bench/README.md, "Where the step wrappers' time goes").
"""

import time
from itertools import pairwise

import torch
from bench_events import per_call_us  # bench/ is the script's own folder on sys.path

from vllm_doctor.engine.clock import CudaEventClock

N = 20_000


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this bench times CUDA calls")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    clock = CudaEventClock()
    clock.reserve(4096)
    torch.cuda.synchronize()
    res = {"perf_counter": per_call_us(time.perf_counter, N)}
    raw = torch._C._cuda_getCurrentRawStream
    res["raw_stream"] = per_call_us(lambda: raw(0), N)
    res["current_stream"] = per_call_us(torch.cuda.current_stream, N)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(N)]
    stream = torch.cuda.current_stream()
    t = time.perf_counter()
    for e in events:
        e.record(stream)
    res["event.record idle"] = (time.perf_counter() - t) / N * 1e6
    torch.cuda.synchronize()
    for _ in range(50):
        x @ x
    t = time.perf_counter()
    for e in events:
        e.record(stream)
    res["event.record busy stream"] = (time.perf_counter() - t) / N * 1e6
    torch.cuda.synchronize()

    def mark() -> None:
        clock.release(clock.mark(True))

    res["clock.mark(True)+release"] = per_call_us(mark, N)
    t = time.perf_counter()
    for a, b in pairwise(events):
        a.elapsed_time(b)
    res["elapsed_time"] = (time.perf_counter() - t) / (N - 1) * 1e6
    res["query"] = per_call_us(lambda: events[-1].query(), N)
    for k, v in res.items():
        print(f"{k:32s} {v:8.2f} us")


if __name__ == "__main__":
    main()
