"""What a CUDA timing event's record costs the host, against a small kernel launch (GPU only).

    python bench/bench_events.py

The per-layer profiler records an event pair per timed module on the host that launches an
eager step's kernels: on a launch-bound host each one lengthens the step. torch creates the CUDA
event at its first record, so a fresh event costs more than a reused one (the profiler's clock
creates its events ahead, at install).
"""

from __future__ import annotations

import time

import torch


def per_call_us(fn, n: int = 2000) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        raise SystemExit("bench_events: needs a CUDA GPU")
    stream = torch.cuda.current_stream()
    fresh = iter([torch.cuda.Event(enable_timing=True) for _ in range(2000)])
    print(f"record of a fresh event: {per_call_us(lambda: next(fresh).record(stream)):.2f} us")
    reused = torch.cuda.Event(enable_timing=True)
    print(f"record of a reused event: {per_call_us(lambda: reused.record(stream)):.2f} us")
    x = torch.zeros(1024, device="cuda")
    print(f"a small kernel launch: {per_call_us(lambda: x.add_(1)):.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
