"""The forward profiler that runs inside a worker: per step always, per layer when eager.

Per step (cheap enough to leave on): prefill/decode tokens, batch size, KV blocks in use, host
time of ``execute_model`` (+ ``sample_tokens``), device time of the step and of the model's
forward (root module hooks). Per layer (eager mode only): forward pre/post hooks on the modules
:func:`select_modules` picks, timed by :mod:`clock` marks. Marks are resolved lazily: on GPU
a step's events are read back only once they completed, or at collection.

Per-layer timing is *sampled*: the first :data:`LAYER_WARMUP_STEPS` steps of each phase
(prefill, decode, mixed) are timed, then every ``layer_every``-th step of that phase
(default :data:`DEFAULT_LAYER_EVERY`; 1 = every step). On the other steps the layer hooks
return at once. Layer shares and per-call times need a sample, not every step, and the cost on
a launch-bound GPU forward is two CUDA-event records per module call (bench/bench_engine.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.engine import DEFAULT_LAYER_EVERY, LAYER_WARMUP_STEPS
from vllm_doctor.engine.clock import CudaEventClock, WallClock
from vllm_doctor.engine.layers import TimedModule
from vllm_doctor.engine.steps import phase_of

MAX_STEP_RECORDS = 20_000  # aggregates keep counting beyond this
DEFAULT_TRACE_STEPS = 64  # steps whose per-layer events are kept for trace.json


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
    layers_timed: bool = False  # this step is one of the per-layer samples


class ForwardProfiler:
    def __init__(self, clock: WallClock | CudaEventClock, timed: list[TimedModule], trace_steps: int = DEFAULT_TRACE_STEPS,
                 layer_every: int = DEFAULT_LAYER_EVERY) -> None:
        self.clock = clock
        self.layers_enabled = False  # set by the session once the layer hooks are installed
        self.layer_every = max(1, int(layer_every))
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
        start = self.clock.mark() if self.clock.marks_outside_forward else None
        self.current = OpenStep(self.step_index, time.perf_counter(), counts, start,
                                layers_timed=self.layers_enabled and self._sample_layers(phase_of(counts)))
        self.step_index += 1
        self._stack.clear()
        self.resolve(block=False)

    def _sample_layers(self, phase: str) -> bool:
        n = self._phase_steps.get(phase, 0)
        self._phase_steps[phase] = n + 1
        return n < LAYER_WARMUP_STEPS or (n - LAYER_WARMUP_STEPS) % self.layer_every == 0

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
        if self.clock.marks_outside_forward:
            step.end = self.clock.mark()
        self.current = None
        self.pending.append(step)

    def abort_step(self) -> None:
        self.current = None
        self._stack.clear()

    # -- module hooks ------------------------------------------------------------------------
    def module_enter(self, name: str, outer: bool = False) -> None:
        step = self.current
        if step is not None:
            mark = self.clock.mark(outer)
            if step.start is None:
                step.start = mark
            self._stack.append((name, mark))

    def module_exit(self, name: str) -> None:
        step = self.current
        if step is None or not self._stack:
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
                               step.host_execute_s, step.host_sample_s, step.layers_timed))
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
        index, host_start, counts, step_s, device_timed, forward_s, logits_s, host_execute_s, host_sample_s, layers_timed = row
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
            "layers_timed": layers_timed,
        }

    def snapshot(self, reset: bool = False) -> dict[str, Any]:
        self.resolve(block=True)
        out = {
            "clock": self.clock.kind,
            "layer_every": self.layer_every,
            "layer_warmup_steps": LAYER_WARMUP_STEPS,
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
