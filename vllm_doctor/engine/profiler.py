"""The forward profiler that runs inside a worker: per step always, per layer when eager.

Per step (cheap enough to leave on): prefill/decode tokens, batch size, KV blocks in use, host
time of ``execute_model`` (+ ``sample_tokens``), device time of the step and of the model's
forward (root module hooks). Per layer (eager mode only): the modules :func:`select_modules`
picks, timed by :mod:`clock` marks from the session's timing ``forward`` wrappers. Marks are resolved lazily: on GPU
a step's events are read back only once they completed, or at collection.

Detailed timing is *sampled*: the first :data:`SAMPLE_WARMUP_STEPS` steps of each phase
(prefill, decode, mixed), then every ``sample_every``-th step of that phase (default
:data:`DEFAULT_SAMPLE_EVERY`; 1 = every step). Every step gets its counts and host times; a
sampled step also gets per-layer timing (eager mode) and, on GPU, CUDA-event device times (on
CPU the wall clock costs nothing, so every step is timed). Shares and per-call times need a
sample, not every step; a CUDA-event record costs microseconds of host time inside a busy
engine, which a launch-bound forward pays in full (bench/bench_engine.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.engine import DEFAULT_SAMPLE_EVERY, SAMPLE_WARMUP_STEPS
from vllm_doctor.engine.clock import CudaEventClock, WallClock
from vllm_doctor.engine.layers import TimedModule
from vllm_doctor.engine.steps import phase_of

MAX_STEP_RECORDS = 20_000  # aggregates keep counting beyond this
DEFAULT_TRACE_STEPS = 64  # steps whose per-layer events are kept for trace.json
# finished steps are turned into records in batches (one warm loop instead of a cold call per
# step); on GPU a batch holds at most this many sampled steps' events
RESOLVE_BATCH = 32


@dataclass(slots=True)
class OpenStep:
    index: int
    host_start: float  # perf_counter
    counts: dict[str, Any]
    start: Any  # clock mark (None on GPU until the first timed module starts)
    end: Any = None  # on GPU: the end of the last timed module
    forward: list[tuple[Any, Any]] = field(default_factory=list)  # (start, end) marks of root forward
    logits: list[tuple[Any, Any]] = field(default_factory=list)
    layers: list[tuple[str, Any, Any]] = field(default_factory=list)
    host_execute_s: float = 0.0
    host_sample_s: float = 0.0
    executed: bool = False
    sampled: bool = False  # one of the samples (see the module docstring)
    timed: bool = True  # the clock marks this step (every step on CPU, the samples on GPU)
    layers_timed: bool = False  # per-layer timing on this step (a sample, eager, layers on)


class ForwardProfiler:
    def __init__(self, clock: WallClock | CudaEventClock, timed: list[TimedModule], trace_steps: int = DEFAULT_TRACE_STEPS,
                 sample_every: int = DEFAULT_SAMPLE_EVERY) -> None:
        self.clock = clock
        self.layers_enabled = False  # set by the session once its per-layer timing forwards exist
        self.sample_every = max(1, int(sample_every))
        self._phase_steps: dict[str, int] = {}
        self.timed = {m.name: m for m in timed}
        self.trace_steps = trace_steps
        self.t0 = time.perf_counter()
        self.step_index = 0
        self.current: OpenStep | None = None
        self.pending: deque[OpenStep] = deque()
        self.steps: list[tuple[Any, ...]] = []  # see _record
        self.dropped_steps = 0
        self.layer_stats: dict[str, dict[str, Any]] = {}
        self.layer_trace: list[dict[str, Any]] = []
        self._stack: list[tuple[str, Any]] = []

    # -- step boundaries (called from the execute_model / sample_tokens wrappers) ----------
    def begin_step(self, counts: dict[str, Any]) -> None:
        if self.current is not None:  # the previous step never reached sample_tokens
            self.finish_step()
        sampled = self._sample(phase_of(counts))
        timed = sampled or self.clock.cheap
        start = self.clock.mark() if timed and self.clock.marks_outside_forward else None
        self.current = OpenStep(self.step_index, time.perf_counter(), counts, start, sampled=sampled, timed=timed,
                                layers_timed=sampled and self.layers_enabled)
        self.step_index += 1
        self._stack.clear()
        if len(self.pending) >= RESOLVE_BATCH:
            self.resolve(block=False)

    def _sample(self, phase: str) -> bool:
        n = self._phase_steps.get(phase, 0)
        self._phase_steps[phase] = n + 1
        return n < SAMPLE_WARMUP_STEPS or (n - SAMPLE_WARMUP_STEPS) % self.sample_every == 0

    def after_execute(self, host_s: float, output_is_final: bool) -> None:
        step = self.current
        if step is None:
            return
        step.host_execute_s += host_s
        step.executed = True
        if output_is_final:
            self.finish_step()

    def after_sample(self, host_s: float) -> None:
        step = self.current
        if step is None:
            return
        step.host_sample_s += host_s
        self.finish_step()

    def finish_step(self) -> None:
        step = self.current
        if step is None:
            return
        if step.timed and self.clock.marks_outside_forward:
            step.end = self.clock.mark()
        self.current = None
        self.pending.append(step)

    def abort_step(self) -> None:
        self.current = None
        self._stack.clear()

    # -- module hooks ------------------------------------------------------------------------
    def module_enter(self, name: str, outer: bool = False) -> None:
        step = self.current
        if step is not None and step.timed:
            mark = self.clock.mark(outer)
            if step.start is None:
                step.start = mark
            self._stack.append((name, mark))

    def module_exit(self, name: str) -> None:
        step = self.current
        if step is None or not step.timed or not self._stack:
            return
        # pop to the matching entry (a module that raised may have left its children behind)
        while self._stack:
            top, start = self._stack.pop()
            if top == name:
                end = self.clock.mark()
                if not self.clock.marks_outside_forward:
                    step.end = end
                if name == "":
                    step.forward.append((start, end))
                elif self.timed.get(name) is not None and self.timed[name].kind == "logits":
                    step.logits.append((start, end))
                    step.layers.append((name, start, end))
                else:
                    step.layers.append((name, start, end))
                return

    # -- resolution ----------------------------------------------------------------------------
    def resolve(self, block: bool) -> None:
        while self.pending:
            step = self.pending[0]
            if step.end is not None and not self.clock.ready(step.end):
                if not block:
                    return
                self.clock.wait(step.end)
            self.pending.popleft()
            self._account(step)

    def _account(self, step: OpenStep) -> None:
        """Turn a finished step's marks into seconds (the hot path: a tuple per step, dicts later)."""
        sec = self.clock.seconds
        device_timed = step.start is not None and step.end is not None
        fwd = step.forward
        forward_s = (sec(*fwd[0]) if len(fwd) == 1 else sum(sec(a, b) for a, b in fwd)) if fwd else None
        # no timed module ran (CUDA-graph replay skips Python hooks): fall back to host time
        step_s = sec(step.start, step.end) if device_timed else step.host_execute_s + step.host_sample_s
        logits_s = sum(sec(a, b) for a, b in step.logits) if step.logits else None
        if len(self.steps) < MAX_STEP_RECORDS:
            self.steps.append((step.index, step.host_start, step.counts, step_s, device_timed, forward_s, logits_s,
                               step.host_execute_s, step.host_sample_s, step.sampled, step.layers_timed))
        else:
            self.dropped_steps += 1
        if step.layers:  # a per-layer sample
            self._account_layers(step, step_s, device_timed)
        release = getattr(self.clock, "release", None)
        if release is not None:
            marks = [m for m in (step.start, step.end) if m is not None]
            for a, b in step.forward + step.logits:
                marks += [a, b]
            for _, a, b in step.layers:
                marks += [a, b]
            release(*set(marks))

    def _account_layers(self, step: OpenStep, step_s: float, device_timed: bool) -> None:
        sec = self.clock.seconds
        phase = phase_of(step.counts)
        keep_trace = len(self.layer_trace) < self.trace_steps
        events = []
        bucket = "decode" if phase == "decode" else "prefill"
        origin = step.start if device_timed else None
        for name, a, b in step.layers:
            dur = sec(a, b)
            stats = self.layer_stats.get(name)
            if stats is None:
                tm = self.timed.get(name)
                stats = self.layer_stats[name] = {
                    "name": name, "kind": tm.kind if tm else "?", "layer": tm.layer if tm else None,
                    "class": tm.cls if tm else "?", "prefill_calls": 0, "prefill_s": 0.0,
                    "decode_calls": 0, "decode_s": 0.0,
                }
            stats[f"{bucket}_calls"] += 1
            stats[f"{bucket}_s"] += dur
            if keep_trace:
                events.append({"name": name, "offset_s": sec(origin, a) if origin is not None else 0.0, "dur_s": dur})
        if keep_trace:
            fwd = [{"offset_s": sec(origin, a) if origin is not None else 0.0, "dur_s": sec(a, b)} for a, b in step.forward]
            self.layer_trace.append({"index": step.index, "t": round(step.host_start - self.t0, 6), "step_s": step_s,
                                     "phase": phase, "forward": fwd, "layers": events})

    def _record(self, row: tuple[Any, ...]) -> dict[str, Any]:
        (index, host_start, counts, step_s, device_timed, forward_s, logits_s, host_execute_s, host_sample_s,
         sampled, layers_timed) = row
        return {
            "index": index,
            "t": round(host_start - self.t0, 6),
            "phase": phase_of(counts),
            **counts,
            "step_s": step_s,
            "step_clock": self.clock.kind if device_timed else "host",
            "forward_s": forward_s,
            "logits_s": logits_s,
            "host_execute_s": host_execute_s,
            "host_sample_s": host_sample_s,
            "sampled": sampled,
            "layers_timed": layers_timed,
        }

    def snapshot(self, reset: bool = False) -> dict[str, Any]:
        self.resolve(block=True)
        out = {
            "clock": self.clock.kind,
            "sample_every": self.sample_every,
            "sample_warmup_steps": SAMPLE_WARMUP_STEPS,
            "steps": [self._record(row) for row in self.steps],
            "dropped_steps": self.dropped_steps,
            "layers": list(self.layer_stats.values()),
            "trace": list(self.layer_trace),
            "timed_modules": [
                {"name": m.name, "kind": m.kind, "layer": m.layer, "class": m.cls} for m in self.timed.values()
            ],
        }
        if reset:
            self.steps.clear()
            self.layer_stats.clear()
            self.layer_trace.clear()
            self.dropped_steps = 0
            self._phase_steps.clear()
        return out
