"""The forward profiler that runs inside a worker: per step always, per layer on samples.

Per step (cheap enough to leave on): prefill/decode tokens, batch size, KV blocks in use, host
time of ``execute_model`` (+ ``sample_tokens``) and the step's time: on CPU the wall clock (the
host is the device); on GPU the device's clock, a CUDA event pair on the current stream from
``execute_model``'s entry to ``sample_tokens``' return (under async scheduling the host's time
is enqueue time, not the step), on the steps :data:`~vllm_doctor.constants.STEP_CLOCKS` says: ``sampled`` (the default)
puts the pair on the sampled steps, on the step after each (its untimed neighbour: the
device-clock step time of a step the doctor does not time inside) and on every
:data:`~vllm_doctor.constants.STEP_CLOCK_STRIDE`-th step of each phase (so that a window holds
device-clock steps of each phase it ran 32 steps of, where the own budget leaves few samples)
and on the first step of each phase after a reader's window begins (so that every window holds
one of each phase it ran, however few), the others carry their host
span (``device_timed`` false); ``every`` puts it on every step (the doctor's behaviour before
the sampled clock; each pair and its reading cost the host tens of µs a step on an H200). On
sampled steps also the model's forward and the logits processor.

The KV counts wait: on the step's path :meth:`~vllm_doctor.engine.steps.StepTracker.quick`
tells the step's tokens and requests of each phase from a few attribute reads (the step's total,
and the requests it follows through their prompts), and keeps what
:meth:`~vllm_doctor.engine.steps.StepTracker.settle` reads later: the running ids, their new
blocks, the ids that finished, the new requests' blocks (not the ``SchedulerOutput``: vLLM frees
it when its step ends). The steps are settled in batches of :data:`COUNT_BATCH`, in step order,
in one warm loop (and before any sampled step, or a reader's collection); a step is a record once
settled and finished. Where its total does not add up (a request resumed, or first seen mid-run
in a prompt chunk) a step is counted at once. Most steps of a serving engine are decode steps
with nothing to time (and mixed steps whose arrivals' prompts end in them): the session's
wrappers open and finish those on a short path of their own
(``WorkerSession._execute_wrapper``: a few attribute reads of the ``SchedulerOutput``, one
list, no call into the profiler), up to the phase's next step due for a sample or the device
clock (:meth:`ForwardProfiler._fast_next`), on the fields the profiler keeps for it in slots (two
cache lines); tests/unit/test_decode_path.py holds that path to begin_step's records.

Per layer: in eager mode the modules :func:`select_modules` picks (timing ``forward``
wrappers); in compiled modes the attention calls, the compiled graph's only Python calls, split
the forward into layers (:meth:`ForwardProfiler.boundary`). Marks are resolved lazily: on GPU a
step's events are read back only once they completed, or at collection.

Detailed timing is *sampled*: the first :data:`SAMPLE_WARMUP_STEPS` steps of each phase
(prefill, decode, mixed), then every ``sample_every``-th step of that phase (default
:data:`DEFAULT_SAMPLE_EVERY`; 1 = every step). Every step gets its counts, host times and a
step time (the step clock's, or its host span); a sampled step also gets the model's forward and logits time and
per-layer timing. Shares and per-call times need a sample, not every step; every piece of
Python on a launch-bound step's path costs throughput (bench/bench_engine.py), so an unsampled
step pays for keeping its ``SchedulerOutput`` to count later (and, on GPU, two events where the
step clock puts them on it) only.

In eager mode per-layer timing has two grains (:data:`DEFAULT_DETAIL_EVERY`): a step timed per
layer times the decoder layers' boundaries (``layers_timed``), and every ``detail_every``-th of
them per phase the modules inside each layer too (``layers_detail``). At the boundaries one mark
per module is enough (:meth:`ForwardProfiler.module_mark`, ``BOUNDARY_MARKS``): the embedding,
each decoder layer and the final norm run one after the other, so each one's span ends where the
next one's begins, the last one's where the model's forward returns; half the events and half the
Python of an enter/exit pair. A detailed step times each module from its entry to its return
(nested: a layer holds its attention, MLP and norms). Each module's statistics count the steps it
was timed on (``prefill_steps`` / ``decode_steps``), so a reader scales the inner modules' totals
to the steps timed per layer.
"""

from __future__ import annotations

import base64
import sys
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from operator import itemgetter
from typing import Any

from vllm_doctor.constants import (
    DEFAULT_DETAIL_EVERY,
    DEFAULT_OWN_BUDGET,
    DEFAULT_STEP_CLOCK,
    OWN_BUDGET_HORIZON_S,
    OWN_BUDGET_MARGIN,
    STEP_CLOCK_STRIDE,
    STEP_COLUMN_TYPES,
    STEP_COLUMNS,
    STEP_SUMMARY_COLUMNS,
)
from vllm_doctor.engine import DEFAULT_SAMPLE_EVERY, SAMPLE_WARMUP_STEPS, graphs
from vllm_doctor.engine.clock import CudaEventClock, WallClock
from vllm_doctor.engine.graphs import Fixed
from vllm_doctor.engine.layers import TimedModule
from vllm_doctor.engine.steps import Counts, StepTracker, phase_of

# step records held for the readers' windows; when full, the oldest go (a reader whose window
# still held them is told how many: ``dropped_steps``), never the newest, so one reader that
# falls behind (a ``top --once`` slow to read) costs the others nothing. Layer sums and the
# encoder's counts are aggregates: they keep counting whatever is dropped.
MAX_STEP_RECORDS = 20_000
EVICT_STEPS = MAX_STEP_RECORDS // 16  # let go at once, so the list is not shifted every step
DEFAULT_TRACE_STEPS = 64  # steps whose per-layer events are kept for trace.json
# finished steps are turned into records in batches (one warm loop instead of a cold call per
# step); on GPU a batch holds at most this many sampled steps' events
RESOLVE_BATCH = 32
# unsampled steps are settled this many at a time (StepTracker.settle in one loop)
COUNT_BATCH = 64
# an unsampled step's list (ForwardProfiler.begin_step: a list, not an OpenStep, where a few
# slots are all it needs): its index, host start, counts (None until counted), host times of
# execute_model and sample_tokens, start and previous end marks, encoder marks, what
# StepTracker.settle reads (until counted), and its step and idle times once it finished (until counted)
PLAIN_SLOTS = (
    "index", "host_start", "counts", "host_execute_s", "host_sample_s", "start", "prev_end", "encoder",
    "pending", "step_s", "idle_s",
)  # fmt: skip
# a multimodal model's encoder calls: items and embedding rows they returned, and the runner's
# encoder cache at its fullest (entries, rows, bytes); the budget is the session's to set
ENCODER_USE_ZERO = {"calls": 0, "items": 0, "rows": 0, "peak_entries": 0, "peak_rows": 0, "peak_bytes": 0}
NAN = float("nan")  # a time a step has not (not sampled), in a packed column
NOT_QUICK = object()  # begin_step: StepTracker.quick not asked yet
# compiled modes' timed names: the forward before the first attention call, and a decoder layer's
# work after its attention (the name of the layer + this suffix)
BEFORE_LAYERS = "[before the first attention]"
DENSE_SUFFIX = " [after attention]"
# the class text of an MoE layer's span after its attention (the fused-MoE op splits no graph)
MOE_SPAN = "projections, norms, MoE router and experts (the fused-MoE op) until the next mixer"
# how eager mode's boundary grain marks a module (the snapshot says it, for the reader's correction
# of the doctor's own cost): "entry", one mark where each module is entered
BOUNDARY_MARKS = "entry"


@dataclass(slots=True)
class OpenStep:
    """A sampled step while it runs and until its marks are resolved.

    Unsampled steps are plain lists ``[index, host_start, counts, host_execute_s,
    host_sample_s, start mark, previous step's end mark, encoder marks or None]`` (a list costs
    less than an object):
    on the wall clock they are records when they finish, on GPU once their end event has
    completed.
    """

    index: int
    host_start: float  # perf_counter
    counts: Counts
    start: Any = None  # clock marks: execute_model entered, sample_tokens returned
    end: Any = None
    # (start, end) marks of the root forward and of the logits processor, (name, start, end) of
    # each timed module
    forward: list[tuple[Any, Any]] = field(default_factory=list)
    logits: list[tuple[Any, Any]] = field(default_factory=list)
    layers: list[tuple[str, Any, Any]] = field(default_factory=list)
    # compiled modes: (attention layer's name, entered?, mark) at each attention call
    bounds: list[tuple[str, bool, Any]] = field(default_factory=list)
    # eager boundary grain: (module name, mark) where each boundary module was entered, then
    # ("", the root forward's end mark): each span runs to the next mark
    entries: list[tuple[str, Any]] = field(default_factory=list)
    graph_reads: list[Any] = field(default_factory=list)  # FULL graphs replayed (engine/graphs.py)
    host_execute_s: float = 0.0
    host_sample_s: float = 0.0
    layers_timed: bool = False  # per-layer timing on this step (eager, layers on)
    layers_detail: bool = False  # and inside the decoder layers (eager's finer grain; compiled: always)
    prev_end: Any = None  # the previous step's end mark: the device's idle time before this step
    encoder: list[tuple[Any, Any]] | None = None  # (start, end) marks of each encoder call (embed_multimodal)


class ForwardProfiler:
    # the fields the step wrappers' short path reads and writes on every step (session.py), as
    # slots: inside the object, next to each other (two cache lines, which the step's path finds
    # cold after vLLM's Python); the rest, off that path, in the instance's dict
    __slots__ = (
        "__dict__", "_fast_mixed", "_fast_open", "_fast_until", "_last_end", "_phase_steps", "_wall", "current",
        "graph_s", "hold_fast", "step_index", "to_count",
    )  # fmt: skip

    def __init__(
        self,
        clock: WallClock | CudaEventClock,
        timed: list[TimedModule],
        trace_steps: int = DEFAULT_TRACE_STEPS,
        sample_every: int = DEFAULT_SAMPLE_EVERY,
        detail_every: int = DEFAULT_DETAIL_EVERY,
        step_clock: str = DEFAULT_STEP_CLOCK,
        own_budget: float = DEFAULT_OWN_BUDGET,
    ) -> None:
        self.clock = clock
        self._wall = clock.domain == "host"  # marks are perf_counter floats (no events to resolve)
        # the doctor's own budget (constants.OWN_BUDGET_ENV): a share of the worker's time, on the
        # device clock only (0: the cadence alone); its leaky bucket: credit in seconds, and the
        # time and the doctor's own total when it was last brought up to date (_over_budget)
        self.own_budget = 0.0 if self._wall else max(0.0, float(own_budget))
        self._credit = 0.0
        # (time, own total with the calls, step index, sampled, own total of the steps alone) at
        # the last due step: the bucket starts at the first step of the profiler's first phase,
        # before its forced sample (which it pays for)
        self._credit_at: tuple[float, float, int, bool, float] | None = None
        # what a sample is expected to cost on top of the steps around it (its events, retargets,
        # reads and sums), and what an unsampled step costs: a due step is sampled only while the
        # credit covers the sample's expected cost, so the doctor's time stays within the budget
        # rather than going into debt by a sample at a time (estimates from the due steps so far)
        self._sample_cost = 0.0
        self._plain_cost: float | None = None
        self.samples_skipped = 0  # steps due for a sample that the budget left unsampled (cumulative)
        # the doctor's time in the calls it served between steps (the session's rpc_s: a reader's
        # collection resolves the samples of its window), which the budget counts too
        self.calls_s: Any = _no_calls
        self._now = time.perf_counter  # the bucket's clock (a test's own clock drives it)
        self.tracker = StepTracker()
        # the decode step count below which a decode step may take the wrappers' short path
        # (session.py, WorkerSession._execute_wrapper): the next due sample's or device-clock
        # step's (0: none may; _fast_next sets it, and whatever the path must not pass zeroes it);
        # the same for a mixed step whose new requests' prompts all end in it (a served engine's
        # arrivals), in the mixed phase's count
        self._fast_until = self._fast_mixed = 0
        # the step the short path opened, while its end may take the short path too (no mark to
        # give back): the sample_tokens wrapper finishes it in place of finish_plain
        self._fast_open: list[Any] | None = None
        # the session's reasons to keep every step off the short path (a fault a test injected, a
        # probe waiting for its phases, the step bookkeeping switched off by a crash)
        self.hold_fast = False
        # the step clock on every step (True) or on the sampled steps and their next ones
        self._clock_every = step_clock == "every"
        self._step_clocks: dict[Any, str] = {}  # reader -> the step clock it asked for ("every" wins)
        self._clock_next = False  # the next step is a sampled step's untimed neighbour: device clock
        # per phase, the phase's step count from which its next unsampled step is on the device clock:
        # the next multiple of STEP_CLOCK_STRIDE, or 0 after a reader's window began (so every window
        # holds a device-clock step of each phase it ran, however few its steps)
        self._clock_due = [0, 0, 0]
        # unsampled steps not counted yet, in step order (their lists: PLAIN_SLOTS); those that
        # finished on the wall clock or the host's become records once counted
        self.to_count: list[list[Any]] = []
        # the doctor's own-time counters (the session's ``own_s``): counting adds to "counts"
        self.own: dict[str, float] = {"counts": 0.0}
        # the doctor's time inside vLLM's replays of CUDA graphs (engine/graphs.py's parts of
        # ``own``, summed): one attribute the step wrapper reads twice a step
        self.graph_s = 0.0
        self.layers_enabled = False  # set by the session once its per-layer timing forwards exist
        self._sample_every = max(1, int(sample_every))
        self._cadences: dict[Any, int] = {}  # reader -> the sample_every it asked for (the finest wins)
        self._phase_steps = [0, 0, 0]  # steps seen per phase: decode, prefill, mixed
        # per phase, a sample owed to a reader whose window began (open_window; the profiler's start
        # begins one: the first step of each phase): its next due step is sampled whatever the
        # budget says, so every reader's window holds a sample of each phase it ran due steps of
        self._owed = [True, True, True]
        # of the steps timed per layer, which are timed inside the layers too (1: all of them)
        self.detail_every = max(1, int(detail_every))
        self._phase_layer_steps = [0, 0, 0]  # steps timed per layer so far, per phase
        self.timed = {m.name: m for m in timed}
        self._logits_names = frozenset(m.name for m in timed if m.kind == "logits")
        self.trace_steps = trace_steps
        self.t0 = time.perf_counter()
        self.step_index = 0
        self.current: OpenStep | list[Any] | None = None
        self.pending: deque[OpenStep] = deque()  # finished samples whose marks are not resolved yet
        self.pending_plain: deque[tuple[list[Any], Any, float]] = deque()  # GPU: (step, end event, host end)
        # compiled modes: attention layer name -> (decoder layer's name, layer index), in forward order
        self.boundary_layers: dict[str, tuple[str, int | None]] = {}
        self.steps: list[tuple[Any, ...]] = []  # a tuple per step: STEP_COLUMNS, the counts as one tuple
        self.dropped_steps = 0  # records let go because the buffer was full (the oldest first)
        self.evicted_to = 0  # the sequence number past the last record let go that way
        self.encoder_use: dict[str, Any] = dict(ENCODER_USE_ZERO)
        self.encoder_budget: dict[str, Any] = {}  # budget_rows, budget_source (the session's)
        # cumulative since the profiler started (never reset): each reader's window is the
        # difference from where it last reset (``windows``)
        self.layer_stats: dict[str, dict[str, Any]] = {}
        self.layer_trace: list[dict[str, Any]] = []
        # the readers' windows: several readers (top, attach, the /metrics exporter) each see the
        # steps since their own last reset; records no reader still needs are let go
        self.windows: dict[Any, Window] = {}
        self.steps_base = 0  # the sequence number of steps[0] (steps held since the oldest window)
        self.trace_base = 0  # ... and of layer_trace[0]
        self._stack: list[tuple[str, Any]] = []
        self._after_forward: Any = None  # the root forward's end mark, until another module is timed
        # the newest finished step's end mark, until the next step takes it as its prev_end; on GPU
        # such a mark has two owners (its step and the next), and the one resolved second gives the
        # event back (``_shared`` holds the ids of end marks neither owner is done with)
        self._last_end: Any = None
        self._shared: set[int] = set()
        self._recycles = hasattr(clock, "release")  # marks are events given back for reuse

    @property
    def sample_every(self) -> int:
        """A sample every this many steps of a phase (after its first SAMPLE_WARMUP_STEPS)."""
        return self._sample_every

    @sample_every.setter
    def sample_every(self, every: int) -> None:
        self._sample_every = every
        self.close_short_path()

    @property
    def clock_every(self) -> bool:
        """Every step on the device clock (else the sampled steps, their next ones and every
        STEP_CLOCK_STRIDE-th of each phase)."""
        return self._clock_every

    @clock_every.setter
    def clock_every(self, every: bool) -> None:
        self._clock_every = every
        self.close_short_path()

    # -- step boundaries (called from the execute_model / sample_tokens wrappers) ----------
    def close_short_path(self) -> None:
        """No step takes the wrappers' short path, of either phase, until begin_step's path opens
        it again (_fast_next)."""
        self._fast_until = self._fast_mixed = 0

    def hold_short_path(self, held: bool) -> None:
        """The session's reasons to keep every step off the wrappers' short path (``held``), or
        none any more (the next decode step on begin_step's path opens it again: _fast_next)."""
        self.hold_fast = held
        if held:
            self.close_short_path()
            self._fast_open = None

    def _fast_next(self, phase: int = 0) -> None:
        """Where the wrappers' short path may run from in ``phase`` (0: decode, 2: mixed): up to
        the phase's next step due for a sample (the cadence's: the budget and a reader's owed
        sample decide on due steps only) or, on a GPU, on the device clock; nowhere with the
        device clock on every step, on a sampled step's neighbour, (under a budget) with a sample
        to resolve, with a request in its prompt (the tracker follows it step by step) or while
        the session holds it off."""
        if (
            (not self._wall and (self._clock_every or self._clock_next))
            or (self.pending and self.own_budget)  # (finish_plain resolves it as soon as it can)
            or not self.tracker._layout
            or self.tracker.in_prompt
            or self.hold_fast
        ):
            self.close_short_path()
            return
        n = self._phase_steps[phase]
        due = n if n < SAMPLE_WARMUP_STEPS else n + (SAMPLE_WARMUP_STEPS - n) % self._sample_every
        until = due if self._wall else min(due, self._clock_due[phase])
        if phase:
            self._fast_mixed = until
        else:
            self._fast_until = until

    def begin_step(self, so: Any, quick: Any = NOT_QUICK) -> OpenStep | list[Any] | None:
        """Open the step of one ``SchedulerOutput``: a sample (:class:`OpenStep`, counted now) or
        not (a list, counted later: ``to_count``). The hot path of every step. None when nothing
        is scheduled (not a step; counted at once: its finished requests free their blocks).
        ``quick``: what StepTracker.quick already said of this step (the wrappers' short path
        asked it of a mixed step it then left to this one), else it is asked here."""
        if self.current is not None:  # the previous step never reached sample_tokens
            self.finish_step()
        tracker = self.tracker
        pending = tracker.quick(so) if quick is NOT_QUICK else quick
        counts: Any = None
        if pending is None:
            counts = self.count_now(tracker.count_at_once, so)
            if not counts[4]:  # total tokens
                return None
            phase = (2 if counts[1] else 1) if counts[0] else 0
        else:
            phase = (2 if pending[6] else 1) if pending[5] else 0
        if tracker.in_prompt:  # a request in its prompt: no step takes the short path until it left it
            self.close_short_path()
        prev, self._last_end = self._last_end, None
        n = self._phase_steps[phase]
        self._phase_steps[phase] = n + 1
        index = self.step_index
        self.step_index = index + 1
        if (n >= SAMPLE_WARMUP_STEPS and (n - SAMPLE_WARMUP_STEPS) % self._sample_every) or (
            self.own_budget and self._over_budget(phase)
        ):
            start = None
            if not self._wall and (self._clock_next or self._clock_every or n >= self._clock_due[phase]):
                start = self.clock.mark(True)
                self._clock_due[phase] = n - n % STEP_CLOCK_STRIDE + STEP_CLOCK_STRIDE
            self._clock_next = False
            # (PLAIN_SLOTS: what StepTracker.settle reads, until counted; the step and idle times
            # once it finished on the host's clock, until counted)
            plain = [index, time.perf_counter(), counts, 0.0, 0.0, start, prev, None, pending, None, NAN]
            if counts is None:
                to_count = self.to_count
                to_count.append(plain)
                if len(to_count) >= COUNT_BATCH:
                    self.count_pending()
            self.current = plain
            # its end may take the sample_tokens wrapper's short path (finish_plain's for a step on
            # the host's clock, with no mark to give back and no sample to resolve at once)
            self._fast_open = (
                plain if start is None and prev is None and not self._wall and not (self.pending and self.own_budget)
                else None
            )  # fmt: skip
            if phase != 1:  # where the phase's next steps may take the wrappers' short path
                self._fast_next(phase)
            return plain
        if counts is None:
            counts = self.count_now(self.tracker.settle, pending)
        self._clock_next = not self._wall  # the next step: this one's untimed neighbour on the device clock
        self.close_short_path()
        self._stack.clear()
        self._after_forward = None
        detail = False
        if self.layers_enabled:
            k = self._phase_layer_steps[phase]
            self._phase_layer_steps[phase] = k + 1
            detail = not k % self.detail_every
        start = self.clock.mark(True)
        step: OpenStep = OpenStep(
            index,
            time.perf_counter(),
            counts,
            start,
            layers_timed=self.layers_enabled,
            layers_detail=detail,
            prev_end=prev,
        )
        self.current = step
        return step

    def _over_budget(self, phase: int) -> bool:
        """A step of ``phase`` is due for a sample: is the doctor over its own budget? The
        bucket's credit accrues at ``own_budget`` of the time since it was last brought up to date
        (at most :data:`OWN_BUDGET_HORIZON_S` worth: an idle engine saves no more for a burst of
        samples), and the doctor's own time since then (every part of ``own``: counts, wrappers,
        timers, layers, the graphs' retargets and reads) and in the calls it served
        (:attr:`calls_s`) spends it. The bucket starts empty at the profiler's first step. The
        first due step of each phase after a reader's window began (:attr:`_owed`; the
        profiler's start begins one, so the first step of each phase) is always sampled, on
        credit; any other due step only while the credit covers what a sample is expected to
        cost (:attr:`_sample_cost`): so the doctor stays within the budget instead of overrunning
        it by a sample at a time. Over: the step is not sampled, and counted in
        :attr:`samples_skipped`. Runs on due steps only."""
        now, stepped, index = self._now(), sum(self.own.values()), self.step_index
        own = stepped + self.calls_s()
        last = self._credit_at
        if last is None:  # the first step: the bucket starts here, empty
            self._credit_at = (now, own, index, True, stepped)
            self._owed[phase] = False
            return False
        budget = self.own_budget * (1.0 - OWN_BUDGET_MARGIN)
        capacity = budget * OWN_BUDGET_HORIZON_S
        spent, steps = own - last[1], max(1, index - last[2])
        credit = min(capacity, self._credit + budget * (now - last[0])) - spent
        self._credit = credit
        # the estimates read the steps' own time only: a reader's calls (its start-up's can take
        # 150 ms) are the budget's to pay, not a sample's cost; and a sample is never expected to
        # cost more than half the bucket holds, so no one-off stretch can stop the sampling for good
        on_steps, plain = stepped - last[4], self._plain_cost
        if not last[3]:  # no sample since the last due step: what the unsampled steps cost
            rate = on_steps / steps
            plain = self._plain_cost = rate if plain is None else 0.5 * (plain + rate)
        elif plain is not None:  # a sample since: what it cost on top of its steps
            cost = min(max(0.0, on_steps - plain * steps), 0.5 * capacity)
            self._sample_cost = cost if not self._sample_cost else 0.5 * (self._sample_cost + cost)
        over = not self._owed[phase] and credit < self._sample_cost
        self._owed[phase] = False
        self._credit_at = (now, own, index, not over, stepped)
        if over:
            self.samples_skipped += 1
        return over

    def after_execute(self, host_s: float, output_is_final: bool) -> None:
        step = self.current
        if step.__class__ is list:
            step[3] += host_s  # type: ignore[index]
        elif step is not None:
            step.host_execute_s += host_s  # type: ignore[union-attr]
        else:
            return
        if output_is_final:
            self.finish_step()

    def after_sample(self, host_s: float) -> None:
        step = self.current
        if step.__class__ is list:
            step[4] += host_s  # type: ignore[index]
        elif step is not None:
            step.host_sample_s += host_s  # type: ignore[union-attr]
        else:
            return
        self.finish_step()

    def finish_step(self) -> None:
        step = self.current
        if step is None:
            return
        self.current = None
        if isinstance(step, OpenStep):
            step.end = self._end_mark()
            pending = self.pending
            pending.append(step)
            if len(pending) >= RESOLVE_BATCH:
                self.resolve(block=False)
            return
        self.finish_plain(step, time.perf_counter())

    def finish_plain(self, step: list[Any], end: float) -> None:
        """An unsampled step ended (``end``: perf_counter when its last method returned). On GPU
        with a start event (or an encoder call's events) its end event is recorded and it becomes
        a record once that event completed (:meth:`resolve`); else (the wall clock, or the host's
        on GPU) it is a record once counted.

        Under a budget a finished sample is resolved as soon as its events have completed (a
        step or two later), not in a batch: its resolution (the event reads, the layers' sums)
        is then the doctor's own time before the budget decides on the next due step, not after
        the run, in a reader's collection."""
        self.current = None
        if step[5] is not None or (step[7] and not self._wall):  # device events to read once completed
            pending = self.pending_plain
            pending.append((step, self._end_mark(), end))
            if len(pending) >= 4 * RESOLVE_BATCH or (self.pending and self.own_budget):
                self.resolve(block=False)
            return
        if self._wall:
            self._last_end = end
            idle = self._idle(step[6], step[1])
        else:  # the host's clock: no device idle time (and none for the next step)
            if step[6] is not None:
                self._give_back(step[6])
            idle = NAN
        if step[2] is None:  # a record once counted (count_pending: it waits in to_count)
            step[9] = end - step[1]
            step[10] = idle
        else:
            self._plain_record(step, end - step[1], idle)
        if self.pending and self.own_budget:
            self.resolve(block=False)

    def count_now(self, count: Any, step: Any) -> Any:
        """``count(step)`` now, after the steps still waiting (the tracker counts in step order):
        StepTracker.count_at_once of a step quick could not count, or StepTracker.settle of one it
        did (a sample's: its counts now)."""
        self.count_pending()
        t = time.perf_counter()
        counts = count(step)
        self.own["counts"] += time.perf_counter() - t
        return counts

    def count_pending(self) -> None:
        """Count the unsampled steps that wait (in step order, one loop), and make records of
        those that finished: the doctor's own time, in ``own["counts"]``."""
        to_count = self.to_count
        if not to_count:
            return
        t = time.perf_counter()
        settle, record = self.tracker.settle, self._plain_record
        for step in to_count:
            step[2] = settle(step[8])
            step[8] = None
            if step[9] is not None:  # finished on the host's clock (or the wall clock)
                record(step, step[9], step[10])
        to_count.clear()
        self.own["counts"] += time.perf_counter() - t

    def want_step_clock(self, reader: Any, step_clock: str) -> None:
        """``reader`` asks for the device clock on every step (``every``) or on the sampled ones
        and their next steps (``sampled``): every step while any present reader asks for it."""
        self._step_clocks[reader] = step_clock
        self.clock_every = "every" in self._step_clocks.values()

    @property
    def step_clock(self) -> str:
        """Which steps carry the device clock's step time (``every``, ``sampled``; on the wall clock every step)."""
        return "every" if self.clock_every or self._wall else "sampled"

    def _plain_record(self, step: list[Any], step_s: float, idle_s: float) -> None:
        steps = self.steps
        encoder = step[7]
        encoder_s = NAN if encoder is None else self._encoder_seconds(encoder)
        if len(steps) >= MAX_STEP_RECORDS:
            self._evict()
        steps.append(
            (
                step[0], step[1], step[2], step_s, self._wall or step[5] is not None, None, None, step[3], step[4],
                False, False, False, idle_s, encoder_s,
            )
        )  # fmt: skip

    def _evict(self) -> None:
        """The buffer is full: the oldest records go (the readers whose windows held them are
        told how many in their next snapshot)."""
        n = min(len(self.steps), max(1, EVICT_STEPS))
        del self.steps[:n]
        self.steps_base += n
        self.evicted_to = self.steps_base
        self.dropped_steps += n

    def _encoder_seconds(self, marks: list[tuple[Any, Any]]) -> float:
        """The encoder calls' time in a step (their marks given back on GPU)."""
        sec = self.clock.seconds
        total = sum(sec(a, b) for a, b in marks)
        release = getattr(self.clock, "release", None)
        if release is not None:
            release(*(m for pair in marks for m in pair))
        return total

    # -- the multimodal encoder (session: a wrapper on the model's embed_multimodal) ----------
    def encoder_enter(self) -> Any:
        """An encoder call begins in the current step (any step, sampled or not): its start mark."""
        if self.current is None:
            return None
        return self.clock.mark(True)

    def encoder_output(self, output: Any, cache: dict[str, Any] | None) -> None:
        """An encoder call returned ``output`` (one tensor of embedding rows per item): count the
        items and rows, and the runner's encoder cache as it holds them once the runner stores
        this call's (what it held, plus these: it only grows at these calls)."""
        import torch  # the worker's (this module is also read where torch is not loaded)

        use = self.encoder_use
        items = [t for t in output if isinstance(t, torch.Tensor)] if isinstance(output, (list, tuple)) else []
        rows = sum(t.size(0) for t in items if t.dim() >= 1)
        nbytes = sum(t.numel() * t.element_size() for t in items)
        use["calls"] += 1
        use["items"] += len(items)
        use["rows"] += rows
        if cache is not None:
            held = [t for t in list(cache.values()) if isinstance(t, torch.Tensor)]
            entries = len(held) + len(items)
            tokens = sum(t.size(0) for t in held if t.dim() >= 1) + rows
            size = sum(t.numel() * t.element_size() for t in held) + nbytes
            use["peak_entries"] = max(use["peak_entries"], entries)
            use["peak_rows"] = max(use["peak_rows"], tokens)
            use["peak_bytes"] = max(use["peak_bytes"], size)

    def encoder_exit(self, start: Any) -> None:
        step = self.current
        if start is None or step is None:
            return
        pair = (start, self.clock.mark())
        if step.__class__ is list:
            if step[7] is None:  # type: ignore[index]
                step[7] = []  # type: ignore[index]
            step[7].append(pair)  # type: ignore[index]
        else:
            if step.encoder is None:  # type: ignore[union-attr]
                step.encoder = []  # type: ignore[union-attr]
            step.encoder.append(pair)  # type: ignore[union-attr]

    def _idle(self, prev: Any, start: Any) -> float:
        """The device's idle time from the previous step's end mark to this step's start mark
        (NaN without both, or where the two cannot be compared)."""
        if prev is None or start is None:
            return NAN
        try:
            return max(0.0, self.clock.seconds(prev, start))
        except RuntimeError:  # marks on two streams, one not complete: no idle time for this step
            return NAN

    def _end_mark(self) -> Any:
        """A step's end mark, which the next step takes as its prev_end: on GPU an event with two
        owners from the start (the next step may begin after this one was resolved)."""
        mark = self._last_end = self.clock.mark()
        if self._recycles:
            self._shared.add(id(mark))
        return mark

    def _give_back(self, mark: Any) -> None:
        """GPU: a step is done with a mark it may share with the step after it (its end mark,
        the next step's prev_end): the owner done second releases it."""
        if mark is None or not self._recycles:
            return
        key = id(mark)
        if key in self._shared:
            self._shared.discard(key)
        else:
            self.clock.release(mark)  # type: ignore[union-attr]

    def abort_step(self) -> None:
        """``execute_model`` raised: the step leaves no record (and the next one no idle time)."""
        step = self.current
        self.current = None
        self._stack.clear()
        self._last_end = None
        self._give_back(step.prev_end if isinstance(step, OpenStep) else step[6] if isinstance(step, list) else None)

    # -- module hooks ------------------------------------------------------------------------
    def module_enter(self, name: str, outer: bool = False) -> None:
        step = self.current
        if step.__class__ is OpenStep:
            after = self._after_forward
            if after is not None and name in self._logits_names:
                mark = after  # the logits time starts where the model's forward ended (one event fewer)
            else:
                mark = self.clock.mark(outer)
            self._after_forward = None
            if step.start is None:  # type: ignore[union-attr]
                step.start = mark  # type: ignore[union-attr]
            self._stack.append((name, mark))

    def module_mark(self, name: str) -> None:
        """Eager's boundary grain: module ``name`` is entered (its span ends at the next mark)."""
        step = self.current
        if step.__class__ is OpenStep:
            self._after_forward = None
            step.entries.append((name, self.clock.mark()))  # type: ignore[union-attr]

    def module_exit(self, name: str) -> None:
        step = self.current
        stack = self._stack
        if step.__class__ is not OpenStep or not stack:
            return
        # pop to the matching entry (a module that raised may have left its children behind)
        while stack:
            top, start = stack.pop()
            if top == name:
                end = self.clock.mark()
                if name == "":
                    step.forward.append((start, end))  # type: ignore[union-attr]
                    self._after_forward = end
                    entries = step.entries  # type: ignore[union-attr]
                    if entries and entries[-1][0]:
                        entries.append(("", end))  # the last boundary module's span ends here
                    return
                self._after_forward = None
                if name in self._logits_names:
                    step.logits.append((start, end))  # type: ignore[union-attr]
                step.layers.append((name, start, end))  # type: ignore[union-attr]
                return

    # -- resolution ----------------------------------------------------------------------------
    def newest_end(self) -> Any:
        """The end mark of the newest recorded sample or unsampled step (None if none): once it
        completed, every earlier one has too (one stream). Called behind the worker's doctor gate."""
        if self.pending:
            return self.pending[-1].end
        if self.pending_plain:
            return self.pending_plain[-1][1]
        return None

    def resolve(self, block: bool) -> None:
        """Turn finished samples into records, in order; on GPU stop at one whose events are
        still running unless ``block``. Events recorded on one stream complete in order: when
        the newest sample's last event has completed, so have all before it (one query)."""
        pending, clock = self.pending, self.clock
        self._resolve_plain(block)
        newest = next((step.end for step in reversed(pending) if step.end is not None), None)
        if newest is not None and (self._wall or getattr(clock, "one_stream", False)):
            if block:
                clock.wait(newest)
            if block or clock.ready(newest):
                while pending:
                    self._account(pending.popleft())
                return
        while pending:
            step = pending[0]
            if step.end is not None and not clock.ready(step.end):
                if not block:
                    return
                clock.wait(step.end)
            pending.popleft()
            self._account(step)

    def _resolve_plain(self, block: bool) -> None:
        """GPU: unsampled steps whose end event completed become records (their step time is
        the event pair's); all of them when ``block``. The steps that wait for their counts are
        counted first."""
        self.count_pending()
        pending, clock = self.pending_plain, self.clock
        if not pending:
            return
        if block or (getattr(clock, "one_stream", False) and clock.ready(pending[-1][1])):
            ready = len(pending)
            if block:
                clock.wait(pending[-1][1])
        else:
            ready = 0
            for _, end, _ in pending:
                if not clock.ready(end):
                    break
                ready += 1
        sec, release, give_back = clock.seconds, getattr(clock, "release", None), self._give_back
        for _ in range(ready):
            step, end, host_end = pending.popleft()
            start, prev = step[5], step[6]
            if start is None:  # on the host's clock, with an encoder call's events to read
                self._plain_record(step, host_end - step[1], NAN)
            else:
                self._plain_record(step, sec(start, end), self._idle(prev, start))
            if release is not None:
                release(start)
            give_back(prev)
            give_back(end)

    # -- compiled modes: the attention calls split the forward into layers ------------------
    def set_boundaries(
        self,
        layers: list[tuple[str, str, int | None, str]],
        moe_layers: frozenset[str] = frozenset(),
        kinds: dict[str, str] | None = None,
    ) -> None:
        """The token mixers whose calls are timed, in forward order: (mixer's name, its decoder
        layer's name, layer index, class), and the timed names of :meth:`_segments` with their
        kinds; ``moe_layers``: the decoder layers whose span after the mixer holds an MoE
        block's router and experts (named so in its class text); ``kinds``: each mixer's kind
        (attention, mla, state: :data:`vllm_doctor.facts.mixers.FAMILY`; attention if not given)."""
        self.boundary_layers = {attn: (layer, index) for attn, layer, index, _ in layers}
        self.timed[BEFORE_LAYERS] = TimedModule(BEFORE_LAYERS, "embedding", None, "embedding, layer 0's input work")
        for attn, layer, index, cls in layers:
            self.timed[attn] = TimedModule(attn, (kinds or {}).get(attn, "attention"), index, cls)
            self.timed[layer + DENSE_SUFFIX] = TimedModule(
                layer + DENSE_SUFFIX,
                "dense",
                index,
                MOE_SPAN if layer in moe_layers else "projections, norms, MLP until the next mixer",
            )
            if layer not in self.timed:
                self.timed[layer] = TimedModule(layer, "layer", index, "")

    def boundary(self, name: str, enter: bool) -> None:
        """An attention call of layer ``name`` begins (``enter``) or returns, inside the
        compiled forward of a sampled step."""
        step = self.current
        if step.__class__ is OpenStep:
            step.bounds.append((name, enter, self.clock.mark()))  # type: ignore[union-attr]

    def _segments(
        self, step: OpenStep, at: list[float], fwd: tuple[float, float] | None
    ) -> list[tuple[str, float, float]]:
        """A step's attention calls as (timed name, start, end) spans, in seconds since the step's
        start (``at``: each of ``step.bounds`` read once; ``fwd``: the root forward's span).

        Each attention layer's calls (KV-cache write, attention) are one group, from its first
        entry to its last return. Layer i is timed from its attention's start to layer i+1's
        (or the forward's end): its attention, then its output projection, residual, norms and
        MLP and layer i+1's input norm, QKV projection and rotary embedding (kind "dense");
        before the first attention: the embedding and layer 0's input work.
        """
        groups: list[list[Any]] = []  # [name, first enter, last exit]
        last: list[Any] = [None]
        for (name, enter, _), s in zip(step.bounds, at, strict=True):
            if last[0] == name:
                if not enter:
                    last[2] = s
            elif enter:
                last = [name, s, s]
                groups.append(last)
        out: list[tuple[str, float, float]] = []
        if fwd is not None and groups:
            out.append((BEFORE_LAYERS, fwd[0], groups[0][1]))
        layers_of = self.boundary_layers
        n = len(groups)
        for i, (name, start, end) in enumerate(groups):
            layer_name = layers_of.get(name, (name, None))[0]
            nxt = groups[i + 1][1] if i + 1 < n else (fwd[1] if fwd is not None else None)
            out.append((name, start, end))
            if nxt is not None:
                out.append((layer_name + DENSE_SUFFIX, end, nxt))
                out.append((layer_name, start, nxt))
        return out

    def _account(self, step: OpenStep) -> None:
        """Turn a sampled step's marks into seconds (a tuple per step, dicts at collection).

        Every mark is read once, as its time since the step's first mark (on GPU each reading
        is a CUDA call); durations and trace offsets are differences of those.
        """
        for marks in step.graph_reads:  # the graph's events, before it replays again
            graphs.read(marks, block=True)
        sec, origin, wall = self.clock.seconds, step.start, self._wall
        since: dict[Any, float] = {origin: 0.0}

        def t(mark: Any) -> float:
            if mark.__class__ is Fixed:
                return mark.s  # type: ignore[no-any-return]
            v = since.get(mark)
            if v is None:
                v = since[mark] = sec(origin, mark)
            return v

        fwd, logits = step.forward, step.logits
        # the layers' spans in seconds: (name, start, end)
        spans = [(name, t(a), t(b)) for name, a, b in step.layers]
        if self.boundary_layers:  # compiled modes: a step whose forward ran no Python (a FULL graph) has none
            step.layers_timed = step.layers_timed and bool(step.bounds)
            if step.bounds:
                if wall:  # one subtraction a mark (a graph's events are read already: Fixed)
                    at = [m - origin if m.__class__ is not Fixed else m.s for _, _, m in step.bounds]
                else:
                    at = [t(m) for _, _, m in step.bounds]
                spans.extend(self._segments(step, at, (t(fwd[0][0]), t(fwd[0][1])) if fwd else None))
        if step.entries:
            spans.extend((name, t(a), t(b)) for name, a, b in _entry_spans(step.entries))
        device_timed = origin is not None and step.end is not None
        forward_s = sum(t(b) - t(a) for a, b in fwd) if fwd else None
        logits_s = sum(t(b) - t(a) for a, b in logits) if logits else None
        step_s = t(step.end) if device_timed else step.host_execute_s + step.host_sample_s
        prev = step.prev_end
        idle_s = self._idle(prev, origin)
        if len(self.steps) >= MAX_STEP_RECORDS:
            self._evict()
        self.steps.append(
            (
                step.index,
                step.host_start,
                step.counts,
                step_s,
                device_timed,
                forward_s,
                logits_s,
                step.host_execute_s,
                step.host_sample_s,
                True,
                step.layers_timed,
                step.layers_timed and step.layers_detail,
                idle_s,
                sum(t(b) - t(a) for a, b in step.encoder) if step.encoder else NAN,
            )
        )
        if spans:  # per-layer (and logits-processor) timings
            self._account_layers(step, spans, step_s, device_timed, t)
        release = getattr(self.clock, "release", None)
        if release is not None:
            marks = {m for m in (step.start, step.end) if m is not None}
            for a, b in fwd + logits:
                marks.update((a, b))
            for _, a, b in step.layers:
                marks.update((a, b))
            marks.update(m for _, _, m in step.bounds if m.__class__ is not Fixed)
            marks.update(m for _, m in step.entries)
            for a, b in step.encoder or ():
                marks.update((a, b))
            marks.discard(step.end)  # shared with the next step (its prev_end)
            release(*(m for m in marks if m.__class__ is not Fixed))
            self._give_back(step.end)
            self._give_back(step.prev_end)

    def _account_layers(
        self, step: OpenStep, spans: list[tuple[str, float, float]], step_s: float, device_timed: bool, t: Any
    ) -> None:
        """Add a sampled step's layer spans (name, start, end: seconds since the step's start) to
        the layers' sums, and to the trace while it has room."""
        phase = phase_of(step.counts)
        keep_trace = len(self.layer_trace) < self.trace_steps
        events = []
        bucket = "decode" if phase == "decode" else "prefill"
        steps_key, calls_key, s_key = f"{bucket}_steps", f"{bucket}_calls", f"{bucket}_s"
        detail, detail_key = step.layers_detail, f"{bucket}_detail_s"
        counted: set[str] = set()
        layer_stats = self.layer_stats
        for name, a, b in spans:
            dur = b - a
            stats = layer_stats.get(name)
            if stats is None:
                stats = layer_stats[name] = self._new_stats(name)
            if name not in counted:
                counted.add(name)
                stats[steps_key] += 1
            stats[calls_key] += 1
            stats[s_key] += dur
            if detail:
                stats[detail_key] += dur
            if keep_trace:
                events.append({"name": name, "offset_s": a if device_timed else 0.0, "dur_s": dur})
        if keep_trace:
            fwd = [{"offset_s": t(a) if device_timed else 0.0, "dur_s": t(b) - t(a)} for a, b in step.forward]
            self.layer_trace.append(
                {
                    "index": step.index,
                    "t": round(step.host_start - self.t0, 6),
                    "step_s": step_s,
                    "phase": phase,
                    "forward": fwd,
                    "layers": events,
                }
            )

    def _new_stats(self, name: str) -> dict[str, Any]:
        tm = self.timed.get(name)
        return {
            "name": name,
            "kind": tm.kind if tm else "?",
            "layer": tm.layer if tm else None,
            "class": tm.cls if tm else "?",
            "prefill_calls": 0,
            "prefill_s": 0.0,
            "decode_calls": 0,
            "decode_s": 0.0,
            # the steps it was timed on (eager's inner modules: the detailed ones only)
            "prefill_steps": 0,
            "decode_steps": 0,
            # its time on the detailed steps: a decoder layer's there against its time on
            # all timed steps scales the modules inside it (eager's two grains)
            "prefill_detail_s": 0.0,
            "decode_detail_s": 0.0,
        }

    def step_arrays(self, names: tuple[str, ...] = STEP_COLUMNS, steps: Any = None) -> dict[str, Any]:
        """The step records in step order, each field (``names`` of :data:`STEP_COLUMNS`) one
        packed array: ``{"n", "byteorder", "columns": {name: [type code, base64 bytes]}}``.

        Runs in the engine between two steps when the doctor collects: transposing the records'
        tuples and packing them are C-level passes, where a dict per step cost milliseconds per
        thousand steps (and the API server as long again to write them as JSON numbers).
        :class:`vllm_doctor.facts.steps.StepTable` reads them.
        """
        rows = sorted(self.steps if steps is None else steps, key=itemgetter(0))
        columns: Any = ((name, ()) for name in STEP_COLUMNS)
        if rows:
            index, host_start, counts, *rest = zip(*rows, strict=True)
            columns = zip(STEP_COLUMNS, (index, host_start, *zip(*counts, strict=True), *rest), strict=True)
        packed = {}
        for name, values in columns:
            if name not in names:
                continue
            code = STEP_COLUMN_TYPES[name]
            if code == "d" and None in values:  # the forward and logits times of steps not sampled
                values = [NAN if v is None else v for v in values]
            packed[name] = [code, base64.b64encode(array(code, values)).decode("ascii")]
        return {"n": len(rows), "byteorder": sys.byteorder, "columns": packed}

    def open_window(self, reader: Any = None) -> None:
        """``reader``'s window starts now, after the steps finished so far (a reader that has one
        keeps it)."""
        if reader not in self.windows:
            self.resolve(block=True)
            self.windows[reader] = self._window_now()
            self._clock_due = [0, 0, 0]
            self._owed = [True, True, True]  # the new window's first due step of each phase: a sample
            self.close_short_path()

    def want_sample_every(self, reader: Any, every: int) -> None:
        """``reader`` asks for a sample every ``every`` steps: the profiler samples at the finest
        cadence any present reader asked for (``top``'s panel at 64 beside an ``attach`` at 8
        gets 8 while both are there, whichever came last), and goes back when that reader leaves."""
        self._cadences[reader] = max(1, int(every))
        self.sample_every = min(self._cadences.values())

    def close_window(self, reader: Any) -> None:
        """``reader`` is gone: the records only it still needed are let go, and the cadence is the
        finest of the readers left."""
        if self._cadences.pop(reader, None) is not None and self._cadences:
            self.sample_every = min(self._cadences.values())
        if self._step_clocks.pop(reader, None) is not None:
            self.clock_every = "every" in self._step_clocks.values()
        if self.windows.pop(reader, None) is not None:
            self._trim()

    def _window_now(self) -> Window:
        return Window(
            step=self.steps_base + len(self.steps),
            trace=self.trace_base + len(self.layer_trace),
            layers={name: {k: stats[k] for k in LAYER_SUMS} for name, stats in self.layer_stats.items()},
            encoder={k: self.encoder_use[k] for k in ENCODER_SUMS},
            skipped=self.samples_skipped,
        )

    def _trim(self) -> None:
        ends = (self.steps_base + len(self.steps), self.trace_base + len(self.layer_trace))
        step = min((w.step for w in self.windows.values()), default=ends[0])
        trace = min((w.trace for w in self.windows.values()), default=ends[1])
        if step > self.steps_base:
            del self.steps[: step - self.steps_base]
            self.steps_base = step
        if trace > self.trace_base:
            del self.layer_trace[: trace - self.trace_base]
            self.trace_base = trace

    def snapshot(self, reset: bool = False, timeline: bool = True, reader: Any = None) -> dict[str, Any]:
        """What was recorded in ``reader``'s window: since its last reset, or since its window
        opened (:meth:`open_window`; one that has none opens at the profiler's start).
        ``timeline=False`` leaves out the per-layer trace and the step columns only a timeline
        needs (top's windows draw none): :data:`STEP_SUMMARY_COLUMNS`. ``reset``: this reader's
        window starts again after this snapshot; the other readers' windows are theirs.

        Such a summary read does not wait on the device: a step whose events have not completed
        yet is in the reader's next window. It runs behind the worker's doctor gate (the channel
        waits for the device before it takes it: ``session.settle``), and a wait there, for the
        step the host launched meanwhile, holds the worker's next step. A timeline's read (a
        report's) waits for every step recorded."""
        self.resolve(block=timeline)
        window = self.windows.get(reader) or Window()
        steps = self.steps[max(0, window.step - self.steps_base) :]
        trace = self.layer_trace[max(0, window.trace - self.trace_base) :] if timeline else []
        layers = []
        for name, stats in self.layer_stats.items():
            base = window.layers.get(name)
            if base is None:
                layers.append(dict(stats))
            elif stats["prefill_calls"] + stats["decode_calls"] > base["prefill_calls"] + base["decode_calls"]:
                layers.append({**stats, **{k: stats[k] - base[k] for k in LAYER_SUMS}})
        encoder = {**self.encoder_use, **{k: self.encoder_use[k] - window.encoder.get(k, 0) for k in ENCODER_SUMS}}
        out = {
            "clock": self.clock.kind,
            # which steps carry that clock's step time (the others: the host's, device_timed false)
            "step_clock": self.step_clock,
            "sample_every": self.sample_every,
            "sample_warmup_steps": SAMPLE_WARMUP_STEPS,
            # the doctor's own budget (0: the cadence alone) and the due samples it left out in the window
            "own_budget": self.own_budget,
            "samples_skipped": self.samples_skipped - window.skipped,
            "detail_every": self.detail_every,
            "boundary_marks": BOUNDARY_MARKS if self.layers_enabled and not self.boundary_layers else None,
            # unsampled steps are records when they finish, samples once resolved
            "t0": self.t0,
            "step_arrays": self.step_arrays(STEP_COLUMNS if timeline else STEP_SUMMARY_COLUMNS, steps),
            # records of this window let go because the buffer was full (a reader with no
            # window of its own: every record let go that way)
            "dropped_steps": max(0, self.evicted_to - window.step) if reader in self.windows else self.dropped_steps,
            "encoder_cache": {**encoder, **self.encoder_budget} if encoder["calls"] else None,
            "layers": layers,
            "trace": trace,
            "timed_modules": [
                {"name": m.name, "kind": m.kind, "layer": m.layer, "class": m.cls} for m in self.timed.values()
            ],
            # compiled modes: the token mixers whose calls mark the layers' spans (set_boundaries)
            "mixers": list(self.boundary_layers),
        }
        if reset:  # this reader's records start again; the sampling cadence goes on (no second warm-up)
            self.windows[reader] = self._window_now()
            self._clock_due = [0, 0, 0]  # the new window's first step of each phase: on the device clock
            self._trim()
        return out


@dataclass
class Window:
    """Where one reader's window starts: the sequence numbers of its first step record and trace
    entry, and the cumulative sums as they were then (its window is the difference)."""

    step: int = 0
    trace: int = 0
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    encoder: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0  # the profiler's samples_skipped then


# a layer's sums and the encoder's counts (its peaks are the profiler's, not per window)
LAYER_SUMS = (
    "prefill_calls", "prefill_s", "decode_calls", "decode_s",
    "prefill_steps", "decode_steps", "prefill_detail_s", "decode_detail_s",
)  # fmt: skip
ENCODER_SUMS = ("calls", "items", "rows")


def _no_calls() -> float:
    return 0.0


def _entry_spans(entries: list[tuple[str, Any]]) -> list[tuple[str, Any, Any]]:
    """Eager's boundary grain: each module entered runs until the next mark (the next module's
    entry, or the forward's end, ``("", mark)``); a module with no mark after it has no span."""
    return [(name, a, b) for (name, a), (_, b) in pairwise(entries) if name]
