"""One doctor session per worker: what it installed, how to take it all back out.

Installed pieces (each optional, each removed by :meth:`WorkerSession.detach`):
- wrappers around ``model_runner.execute_model`` / ``sample_tokens`` (instance attributes that
  shadow the class methods; detach deletes them, restoring vLLM's own methods): the only thing
  of the doctor's on the path of an unsampled step;
- timing ``forward`` wrappers (instance attributes shadowing the class's ``forward``) on the
  logits processor, and in eager mode on the root model and each timed module, present only
  while a sampled step (or a probe step) runs;
- the forward probe (VD403/VD404): hooks on every module + function/dispatch modes, only for
  the probe steps (the root model's timing forward opens and closes the modes).

Every piece of doctor code on the forward path runs under :meth:`_safely`: an exception is
recorded as a crash, that piece is switched off, and vLLM's own call goes on untouched.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any

from torch import nn

from vllm_doctor.compat import mixers
from vllm_doctor.compat import worker as wv
from vllm_doctor.constants import (
    DEFAULT_OWN_BUDGET,
    DEFAULT_STEP_CLOCK,
    GRAPH_TIMING_ENV,
    OWN_BUDGET_ENV,
    STEP_CLOCK_ENV,
    STEP_CLOCKS,
    SWITCH_ON,
)
from vllm_doctor.engine import DEFAULT_SAMPLE_EVERY, SAMPLE_WARMUP_STEPS, graphs
from vllm_doctor.engine.clock import clock_for
from vllm_doctor.engine.gate import StepGate
from vllm_doctor.engine.layers import decoder_layer_name, layer_index, moe_parts, select_modules
from vllm_doctor.engine.probe import ProbeModes, ProbeRecorder
from vllm_doctor.engine.profiler import (
    COUNT_BATCH,
    DEFAULT_TRACE_STEPS,
    DENSE_SUFFIX,
    NAN,
    NOT_QUICK,
    RESOLVE_BATCH,
    ForwardProfiler,
    OpenStep,
)
from vllm_doctor.engine.steps import phase_of

SESSION_ATTR = "_vllm_doctor_session"
LOCK_ATTR = "_vllm_doctor_lock"
_LOCK_GUARD = threading.Lock()


class _CallThread(threading.local):
    """Which clock the doctor's calls between steps are on, per thread. A reader's thread (the
    private channel's) runs beside the engine's: while it waits for the GIL (the engine's thread
    runs vLLM's Python between steps) or for the device (a CUDA call that lets the GIL go), the
    engine goes on, so only its CPU time is the doctor's (``time.thread_time``). On the engine's
    own thread (vLLM's ``collective_rpc``) the steps wait for the whole call: its wall time."""

    side = False  # this thread is a reader's (engine/channel.py marks its request threads)
    # the CPU time of this thread not to add as the rest of its request: its calls' (counted in a
    # session's rpc_s) and its waits for the device (CUDA's wait may spin on the CPU, GIL let go)
    counted = 0.0


CALL_THREAD = _CallThread()


def call_clock() -> Any:
    """The clock of a call served on this thread (:class:`_CallThread`)."""
    return time.thread_time if CALL_THREAD.side else time.perf_counter


def worker_lock(worker: Any) -> StepGate:
    """The worker's doctor gate (engine/gate.py): the doctor's ``execute_model`` /
    ``sample_tokens`` wrappers pass it as a step while they run, and every doctor call into the
    worker (``collective_rpc`` on the worker's own thread, the private channel's thread) holds it
    (``with worker_lock(worker):``, or ``acquire(timeout=...)``), so a call from the channel never
    reads or changes the session in the middle of a step's bookkeeping. Kept on the worker, not
    the session: a detach drops the session, the gate stays the one the wrappers pass."""
    gate = worker.__dict__.get(LOCK_ATTR)
    if gate is None:
        with _LOCK_GUARD:
            gate = worker.__dict__.setdefault(LOCK_ATTR, StepGate())
    return gate


# a timing wrapper: (object, attribute it shadows, the wrapper, the previous instance attribute or None)
Armed = tuple[Any, str, Any, Any]
WRAPPED_METHODS = ("execute_model", "sample_tokens")


class InjectedFault(RuntimeError):
    """Raised on purpose by a test (``session.faults``: tests/fixtures/faults.py) to prove crashes are contained."""


class NoWindow(RuntimeError):
    """A collect from a reader that has no window open in this worker (its reply's error type)."""


def settle(worker: Any) -> None:
    """Wait, outside the worker's doctor gate, until the device has run what the profiler
    recorded so far: a collect from the channel's thread then resolves its events under the
    lock without waiting on the device, so the worker's next step never waits for the device
    on the reader's behalf."""
    session = worker.__dict__.get(SESSION_ATTR)
    if session is None or session.profiler is None:
        return
    with worker_lock(worker):
        profiler = session.profiler
        mark = profiler.newest_end() if profiler is not None else None
    if mark is not None:
        profiler.clock.wait(mark)  # type: ignore[union-attr]


def session_for(worker: Any) -> WorkerSession:
    sess = worker.__dict__.get(SESSION_ATTR)
    if sess is None:
        sess = WorkerSession(worker)
        worker.__dict__[SESSION_ATTR] = sess
    return sess


class WorkerSession:
    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.faults: set[str] = set()
        self.crashes: list[dict[str, Any]] = []
        self.disabled: set[str] = set()
        self.profiler: ForwardProfiler | None = None
        # the doctor's own host time while attached (measured inside its wrappers and hooks; "counts":
        # the steps' counting, which waits for a batch and runs in a wrapper or a reader's collect) ...
        self.own_s: dict[str, float] = {"wrappers": 0.0, "counts": 0.0, "timers": 0.0, "layer_forwards": 0.0}
        # ... and in the watchers' calls between steps (extension.TIMED_RPCS; on a reader's thread
        # its CPU time, on the engine's the wall: call_clock) with the rest of a reader's request
        # around them (the channel's thread: its settle, its reply's encoding and sending, on
        # that thread's CPU clock: ``side_s``, added under ``_side_lock`` by that thread), and the
        # calls' wall time apart (``rpc_wall_s``: what a reader waited, GIL waits included); all
        # cumulative: each reader's window is the difference from where it last reset (``windows``)
        self.rpc_s = 0.0
        self.side_s = 0.0
        self.rpc_wall_s = 0.0
        self._side_lock = threading.Lock()
        # reader -> (its window's start: perf_counter, own_s then, calls_s() then, rpc_wall_s then)
        self.windows: dict[Any, tuple[float, dict[str, float], float, float]] = {}
        self.layers_on = False
        self.layers_reason = ""
        self._saved_methods: dict[str, Any] = {}  # name -> previous instance attribute or None
        # timing forwards, each (module, timing forward, previous instance forward or None):
        # the root model's and the logits processor's (per-step forward and logits time) ...
        # each (object, attribute, wrapper, previous instance attribute or None)
        self._timers: list[Armed] = []
        # ... and the timed modules' (per-layer time; in compiled modes the attention calls'):
        # in eager mode a step timed per layer arms the decoder layers' and the top-level modules'
        # (``_boundary_wrappers_only``), a detailed one the inner modules' too (all of them)
        self._layer_wrappers: list[Armed] = []
        self._boundary_wrappers_only: list[Armed] = []
        self._armed: list[Armed] = []  # those on their objects now
        # a multimodal model's encoder timer (its embed_multimodal), on the model while attached:
        # every step that runs the encoder is timed (few steps, one event pair a call)
        self._encoder: list[Armed] = []
        # a multimodal model's merge (its embed_input_ids), checked on its first calls with
        # image embeddings: are they on the placeholder rows of the output? (VD213)
        self._merge: list[Armed] = []
        # a V2 runner's FULL graph replay not there yet at the install (vLLM makes its graph manager
        # with the KV cache: a reader that attached while the engine started, as the /metrics
        # exporter does): looked for again on each sampled step until found
        self._replay_later = False
        self.merge_calls: list[dict[str, Any]] = []
        self._armed_layers: list[Armed] = []
        self.probe: ProbeRecorder | None = None
        self.probe_modes: ProbeModes | None = None
        self.probe_plan: list[str] = []  # phases still to probe: "prefill", "decode", "any"
        self.probe_refused: str | None = None  # why arm_probe could not arm (not eager)
        self.probe_step = False
        self.probe_result: dict[str, Any] | None = None

    # -- safety ----------------------------------------------------------------------------
    def fault(self, where: str) -> None:
        if where in self.faults:
            raise InjectedFault(f"fault injected by vllm-doctor's test at {where!r}")

    def _safely(self, component: str, fn: Any, *args: Any) -> Any:
        if component in self.disabled:
            return None
        try:
            self.fault(component)
            return fn(*args)
        except Exception as exc:
            self._crashed(component, exc)
            return None

    def _crashed(self, component: str, exc: Exception) -> None:
        """Switch ``component`` off and record why (called from an ``except`` block)."""
        self.disabled.add(component)
        self.crashes.append(
            {
                "component": component,
                "type": type(exc).__name__,
                "message": str(exc)[:500],
                "traceback": traceback.format_exc()[-4000:],
                "step": self.profiler.step_index if self.profiler else None,
            }
        )
        if component == "probe":
            self._end_probe_step()
        self.hold_short_path()

    def hold_short_path(self) -> None:
        """Keep every step off the wrappers' short path (which checks none of these) while a test's
        fault is injected, a probe waits for its phases or the step bookkeeping is switched off."""
        if self.profiler is not None:
            self.profiler.hold_short_path(bool(self.faults or self.probe_plan or "steps" in self.disabled))

    # -- install / detach --------------------------------------------------------------------
    def calls_s(self) -> float:
        """The doctor's time in the calls it served between steps, so far (cumulative)."""
        return self.rpc_s + self.side_s

    def add_side(self, seconds: float) -> None:
        """A reader's thread spent ``seconds`` of its CPU around its call (engine/channel.py)."""
        with self._side_lock:
            self.side_s += seconds

    def status(self) -> dict[str, Any]:
        mr = wv.runner(self.worker)
        return {
            "wrapped_methods": sorted(n for n in WRAPPED_METHODS if _is_doctor_wrapper(vars(mr).get(n))),
            "timers": len(self._timers),
            # what each timer times, as "Class.attribute" (the root model's or logits processor's
            # forward, the V2 runner's run_fullgraph, the V1 runner's _model_forward)
            "timer_targets": [f"{type(obj).__name__}.{attr}" for obj, attr, _, _ in self._timers],
            "layer_wrappers": len(self._layer_wrappers),
            "armed": len(self._armed) + len(self._armed_layers),
            "probe_hooks": len(self.probe._handles) if self.probe else 0,
            "probe_armed": list(self.probe_plan),
            "profiling": self.profiler is not None,
            "steps": self.profiler.step_index if self.profiler is not None else 0,
            "layers_on": self.layers_on,
            "disabled": sorted(self.disabled),
            "crashes": len(self.crashes),
            "model_hook_counts": _hook_counts(wv.model(self.worker)),
            "doctor_forwards": _doctor_forwards(wv.model(self.worker)),
        }

    def install(
        self,
        layers: bool = True,
        trace_steps: int = DEFAULT_TRACE_STEPS,
        sample_every: int = DEFAULT_SAMPLE_EVERY,
        reader: Any = None,
        step_clock: str | None = None,
    ) -> dict[str, Any]:
        """Start the profiler (or keep the one running), and open ``reader``'s window: what it
        collects counts from here (each reader of the private channel has its own; callers
        through vLLM's ``collective_rpc`` share the one of ``None``). ``step_clock``: which steps
        carry the device clock on GPU (:data:`~vllm_doctor.constants.STEP_CLOCKS`; None:
        ``VLLM_DOCTOR_STEP_CLOCK`` in the worker's environment, else ``sampled``)."""
        model = wv.model(self.worker)
        if model is None:
            raise RuntimeError("the worker has no model loaded yet")
        step_clock = step_clock_of(step_clock)
        own_budget = own_budget_of()
        state = wv.compile_state(self.worker)
        if self.profiler is None:
            lm = wv.language_model(model)
            timed = select_modules(
                model,
                lm,
                () if lm is not None else wv.encoder_prefixes(model),
                mixers.mixer_paths(model, wv.forward_context(self.worker)),
            )
            clock = clock_for(wv.device(self.worker))
            clock.reserve(RESOLVE_BATCH * (2 * len(timed) + 8))  # a batch of samples' marks (capped)
            self.profiler = ForwardProfiler(
                clock, timed, trace_steps, sample_every, step_clock=step_clock, own_budget=own_budget
            )
            self.profiler.own = self.own_s
            self.profiler.calls_s = self.calls_s
            self.hold_short_path()
            self._wrap_runner()
            # the root model's forward where it runs Python: eager mode, or a root class that
            # vLLM does not compile (vLLM's own models compile their inner model: the root's
            # forward calls it); a compiled root's __call__ hands ``self.forward`` to the compiler.
            # A FULL CUDA graph replays the whole forward without either: the V2 runner's replay
            # is timed; in compiled modes the V1 runner's call of the (graph-wrapped) model
            # (``_model_forward``: a replay, or the compiled forward) is timed in place of the
            # root's forward (the two would nest). The logits processor runs eagerly outside the
            # compiled forward either way
            replay = wv.full_graph_replay(self.worker)
            model_call = None if state["eager"] or replay is not None else wv.model_forward_call(self.worker)
            if model_call is not None:
                self._timers.append(self._timing_call(*model_call, "", "timers", "steps"))
            elif state["eager"] or not wv.compiled_root(model):
                self._timers.append(self._timing_forward(model, "", "timers", "steps", outer=True, probe=True))
            if replay is not None:
                self._timers.append(self._timing_call(*replay, "", "timers", "steps"))
            self._replay_later = replay is None and model_call is None and wv.runner_kind(self.worker) == "v2"
            self._timers += [
                self._timing_forward(model.get_submodule(tm.name), tm.name, "timers", "steps", outer=True)
                for tm in timed
                if tm.kind == "logits"
            ]
            encoder = wv.encoder_method(model)
            if encoder is not None:
                rows, source = wv.encoder_cache_budget(self.worker)
                self.profiler.encoder_budget = {"budget_rows": rows, "budget_source": source}
                self._encoder = [self._encoder_call(model, encoder)]
                for obj, attr, fn, _ in self._encoder:
                    obj.__dict__[attr] = fn
            merge = wv.merge_method(model)
            if merge is not None:
                self._merge = [self._merge_call(model, merge)]
                for obj, attr, fn, _ in self._merge:
                    obj.__dict__[attr] = fn
        self.open_window(reader, sample_every, step_clock)
        if layers and not self.layers_on:
            if state["eager"]:
                boundaries: list[Armed] = []
                entries: list[Armed] = []
                inner: list[Armed] = []
                for tm in self.profiler.timed.values():
                    if tm.kind in ("model", "logits"):
                        continue
                    module = model.get_submodule(tm.name)
                    armed = self._timing_forward(module, tm.name, "layer_forwards", "layers")
                    # a decoder layer, or a module outside the layers (embedding, final norm): on a
                    # detailed step timed from entry to return, on the others marked at entry only
                    if tm.kind == "layer" or tm.layer is None:
                        boundaries.append(armed)
                        entries.append(self._entry_forward(module, tm.name))
                    else:
                        inner.append(armed)
                self._layer_wrappers = boundaries + inner
                self._boundary_wrappers_only = entries
                moe = self._moe_layers()
                self.layers_on = True
                self.profiler.layers_enabled = True
                every, detail = self.profiler.sample_every, self.profiler.detail_every
                why = (
                    "eager mode"
                    if state["enforce_eager"]
                    else ("vLLM runs this model uncompiled (no @support_torch_compile on its classes), eager")
                )
                self.layers_reason = (
                    why
                    + ": the decoder layers, the embedding and the final norm are timed on "
                    + (
                        "every step"
                        if every == 1
                        else f"the first {SAMPLE_WARMUP_STEPS} steps of each phase, then every {every}-th"
                    )
                    + (
                        ""
                        if not inner
                        else "; the modules inside each layer ("
                        + ("attention, MoE router and experts, norms" if moe else "attention, MLP, norms")
                        + ") "
                        + ("on each of those" if detail == 1 else f"on every {detail}-th of those per phase")
                        + " (a mark where each layer is entered; inside, marks at each module's entry and return:"
                        + " each mark is host time an eager step's launches wait for, taken out of the figures)"
                    )
                )
            else:
                self._layer_wrappers = self._boundary_wrappers_only = self._boundary_wrappers()
                self.profiler.detail_every = 1  # each timed step's attention calls give the whole split
                if self._layer_wrappers:
                    self.layers_on = True
                    self.profiler.layers_enabled = True
                    graphs.TIMING.active = self.profiler
                    how = (
                        "compiled mode: timed at the token mixers' calls (attention, MLA, Mamba / linear "
                        "attention: the ops vLLM splits its graph at, the compiled forward's only Python calls; "
                        "layer i = its mixer, then everything until the next layer's mixer)"
                    )
                    timed_graphs = graphs.TIMING.timed_graphs()
                    if timed_graphs:
                        how += f"; inside FULL CUDA graphs by events captured into {timed_graphs} graph(s)"
                        how += graphs.TIMING.how_read()
                    elif state["cudagraphs"]:
                        how += (
                            "; steps that replay a FULL CUDA graph run no Python inside the forward: their "
                            "forward is timed, not their layers (events captured into the graphs need "
                            f"{GRAPH_TIMING_ENV}={SWITCH_ON} when the engine starts)"
                        )
                    moe = self._moe_layers()
                    if moe:
                        how += (
                            f"; {len(moe)} MoE layer(s): the router and the experts (vLLM's fused-MoE op is no "
                            "graph-splitting op) run inside each one's span after its attention "
                            f"('{moe[0]}{DENSE_SUFFIX}'), not timed apart (eager mode times them apart)"
                        )
                    self.layers_reason = how
                else:
                    self.layers_reason = (
                        "per-layer timing in compiled mode times the calls of vLLM's token mixers (the layers "
                        "of its forward context: attention, MLA, Mamba / linear attention), and this model has "
                        "none that can be timed (its attention runs outside vLLM's layers); eager mode "
                        "(enforce_eager=True) times each module"
                    )
        elif not layers:
            self.layers_reason = "per-layer timing not requested"
        return {
            "installed": True,
            "clock": self.profiler.clock.kind,
            "step_clock": self.profiler.step_clock,
            "layers_on": self.layers_on,
            "sample_every": self.profiler.sample_every,
            "layers_reason": self.layers_reason,
            "compile": state,
            "timed_modules": len(self.profiler.timed),
        }

    def detach(self) -> dict[str, Any]:
        restored = self._unwrap_runner()
        self._disarm()
        _restore(self._encoder)
        self._encoder = []
        _restore(self._merge)
        self._merge = []
        removed = len(self._timers) + len(self._layer_wrappers)  # the entry marks shadow the same forwards
        self._timers = []
        self._replay_later = False
        self._layer_wrappers = []
        self._boundary_wrappers_only = []
        self._stop_probe()
        self.layers_on = False
        if graphs.TIMING.active is self.profiler:
            graphs.TIMING.active = None
        self.profiler = None
        self.worker.__dict__.pop(SESSION_ATTR, None)
        return {"restored_methods": restored, "removed_timing_forwards": removed, "status": self.status()}

    def _timing_forward(
        self, module: nn.Module, name: str, part: str, component: str, outer: bool = False, probe: bool = False
    ) -> Armed:
        """A timing ``forward`` for one module, put on the module only for a sampled step.

        An instance attribute ``forward`` shadows the class's for exactly those steps (nn.Module
        calls ``self.forward``); on every other step the module has nothing of the doctor's, not
        even an idle hook (PyTorch's hook path costs microseconds per call on its own). ``part``
        names the doctor's own-cost counter, ``component`` what a crash switches off. The root
        model's (``probe``) also opens and closes the forward probe's modes on a probe step.
        """
        prof = self.profiler
        assert prof is not None
        previous = module.__dict__.get("forward")  # someone else's instance forward, restored after
        original = module.forward
        disabled, faults, own, clock = self.disabled, self.faults, self.own_s, time.perf_counter

        def forward(*args: Any, **kwargs: Any) -> Any:
            if probe and self.probe_step:
                self._safely("probe", self._probe_enter)
            step = prof.current
            timing = step.__class__ is OpenStep and component not in disabled
            if timing:
                t = clock()
                try:
                    if faults:
                        self.fault(component)
                    prof.module_enter(name, outer)
                except Exception as exc:
                    self._crashed(component, exc)
                own[part] += clock() - t
            try:
                return original(*args, **kwargs)
            finally:
                if probe and self.probe_modes is not None and self.probe_modes.active:
                    self._safely("probe", self.probe_modes.exit)
                if timing and component not in disabled:
                    t = clock()
                    try:
                        prof.module_exit(name)
                    except Exception as exc:
                        self._crashed(component, exc)
                    own[part] += clock() - t

        forward.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return module, "forward", forward, previous

    def _encoder_call(self, model: nn.Module, attr: str) -> Armed:
        """A multimodal model's encoder (``embed_multimodal``: vision tower and projector), which
        the runner calls inside ``execute_model`` before the forward on a step with new images:
        each call's span on the step clock, on any step (``encoder_s``)."""
        prof = self.profiler
        assert prof is not None
        previous = model.__dict__.get(attr)
        original = getattr(model, attr)
        disabled, own, clock, worker = self.disabled, self.own_s, time.perf_counter, self.worker

        def call(*args: Any, **kwargs: Any) -> Any:
            if "encoder" in disabled or prof.current is None:
                return original(*args, **kwargs)
            t = clock()
            start = None
            try:
                if self.faults:
                    self.fault("encoder")
                start = prof.encoder_enter()
            except Exception as exc:
                self._crashed("encoder", exc)
            own["timers"] += clock() - t
            output = None
            try:
                output = original(*args, **kwargs)
                return output
            finally:
                if start is not None and "encoder" not in disabled:
                    t = clock()
                    try:
                        prof.encoder_exit(start)
                        prof.encoder_output(output, wv.encoder_cache(worker))
                    except Exception as exc:
                        self._crashed("encoder", exc)
                    own["timers"] += clock() - t

        call.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return model, attr, call, previous

    def _merge_call(self, model: nn.Module, attr: str) -> Armed:
        """A multimodal model's merge (``embed_input_ids(input_ids, multimodal_embeddings=...,
        is_multimodal=mask)``): on its first :data:`MERGE_CALLS_CHECKED` calls with image
        embeddings, one comparison of the output's masked rows with the embeddings, concatenated
        in order (what vLLM's own default merge writes there); then vLLM's call only."""
        previous = model.__dict__.get(attr)
        original = getattr(model, attr)
        calls, disabled = self.merge_calls, self.disabled

        def call(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if len(calls) < MERGE_CALLS_CHECKED and "merge" not in disabled:
                embeds = kwargs.get("multimodal_embeddings", args[1] if len(args) > 1 else None)
                mask = kwargs.get("is_multimodal")
                if embeds is not None and len(embeds) > 0 and mask is not None:
                    record = self._safely("merge", _compare_merge, out, embeds, mask)
                    if record is not None:
                        calls.append(record)
            return out

        call.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return model, attr, call, previous

    def _entry_forward(self, module: nn.Module, name: str) -> Armed:
        """Eager's boundary grain: a ``forward`` that marks where ``module`` is entered and calls
        the module's own (nothing after it returns: its span ends at the next mark, see
        :meth:`ForwardProfiler.module_mark`). One event and one profiler call per module."""
        prof = self.profiler
        assert prof is not None
        previous = module.__dict__.get("forward")
        original = module.forward
        disabled, faults, own, clock = self.disabled, self.faults, self.own_s, time.perf_counter

        def forward(*args: Any, **kwargs: Any) -> Any:
            if prof.current.__class__ is OpenStep and "layers" not in disabled:
                t = clock()
                try:
                    if faults:
                        self.fault("layers")
                    prof.module_mark(name)
                except Exception as exc:
                    self._crashed("layers", exc)
                own["layer_forwards"] += clock() - t
            return original(*args, **kwargs)

        forward.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return module, "forward", forward, previous

    def _boundary_wrappers(self) -> list[Armed]:
        """Compiled modes: a wrapper on each vLLM attention layer's implementation (its
        ``do_kv_cache_update`` and ``forward``, which the compiled graph's attention ops call
        from Python), marking where each call begins and returns."""
        prof = self.profiler
        assert prof is not None
        wrappers: list[Armed] = []
        layers: list[tuple[str, str, int | None, str]] = []
        kinds: dict[str, str] = {}
        for call in mixers.mixer_calls(wv.forward_context(self.worker)):
            wrappers += [self._boundary_call(call.obj, attr, call.name) for attr in call.attrs]
            layers.append((call.name, decoder_layer_name(call.name), layer_index(call.name), call.cls))
            kinds[call.name] = mixers.FAMILY.get(call.kind or "attention", "attention")
        prof.set_boundaries(layers, frozenset(self._moe_layers()), kinds)
        return wrappers

    def _moe_layers(self) -> list[str]:
        """The decoder layers (names) that hold an MoE block's experts, in model order."""
        model = wv.model(self.worker)
        if model is None:
            return []
        names = [decoder_layer_name(n) for n, kind in moe_parts(model).items() if kind == "experts"]
        return list(dict.fromkeys(names))

    def _boundary_call(self, impl: Any, attr: str, name: str) -> Armed:
        prof = self.profiler
        assert prof is not None
        previous = impl.__dict__.get(attr)
        original = getattr(impl, attr)
        disabled, own, clock, capturing = self.disabled, self.own_s, time.perf_counter, prof.clock.capturing

        def call(*args: Any, **kwargs: Any) -> Any:
            timing = "layers" not in disabled and not capturing()
            if timing:
                t = clock()
                try:
                    prof.boundary(name, True)
                except Exception as exc:
                    self._crashed("layers", exc)
                own["layer_forwards"] += clock() - t
            try:
                return original(*args, **kwargs)
            finally:
                if timing and "layers" not in disabled:
                    t = clock()
                    try:
                        prof.boundary(name, False)
                    except Exception as exc:
                        self._crashed("layers", exc)
                    own["layer_forwards"] += clock() - t

        call.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return impl, attr, call, previous

    def _timing_call(self, obj: Any, attr: str, name: str, part: str, component: str) -> Armed:
        """A timing wrapper on a method of a vLLM object (an instance attribute shadowing it while
        a sampled step runs): the FULL CUDA graph's replay, timed as the model's forward."""
        prof = self.profiler
        assert prof is not None
        previous = obj.__dict__.get(attr)
        original = getattr(obj, attr)
        disabled, own, clock = self.disabled, self.own_s, time.perf_counter

        def call(*args: Any, **kwargs: Any) -> Any:
            timing = component not in disabled and prof.current.__class__ is OpenStep
            if timing:
                t = clock()
                try:
                    prof.module_enter(name, True)
                except Exception as exc:
                    self._crashed(component, exc)
                own[part] += clock() - t
            try:
                return original(*args, **kwargs)
            finally:
                if timing and component not in disabled:
                    t = clock()
                    try:
                        prof.module_exit(name)
                    except Exception as exc:
                        self._crashed(component, exc)
                    own[part] += clock() - t

        call.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return obj, attr, call, previous

    def _arm(self, layers: bool, detail: bool = True) -> None:
        if self.profiler is not None:  # (a sampled or probed step: off the short path until disarmed)
            self.profiler.close_short_path()
        for obj, attr, fn, _ in self._timers:
            obj.__dict__[attr] = fn
        self._armed = self._timers
        if layers:
            chosen = self._layer_wrappers if detail else self._boundary_wrappers_only
            for obj, attr, fn, _ in chosen:
                obj.__dict__[attr] = fn
            self._armed_layers = chosen

    def _disarm_layers(self) -> None:
        """The layers' timing forwards come off once ``execute_model`` returns (the forward ran
        inside it; a drafter model that shares modules may run in ``sample_tokens``)."""
        _restore(self._armed_layers)
        self._armed_layers = []

    def _disarm(self) -> None:
        """Everything comes off at the end of the step (V2 runners compute logits in ``sample_tokens``)."""
        _restore(self._armed)
        _restore(self._armed_layers)
        self._armed = self._armed_layers = []

    # -- runner wrappers -----------------------------------------------------------------------
    def _wrap_runner(self) -> None:
        mr = wv.runner(self.worker)
        for method in WRAPPED_METHODS:
            original = getattr(mr, method, None)
            if original is None or _is_doctor_wrapper(original):
                continue
            self._saved_methods[method] = vars(mr).get(method)
            wrapper = self._execute_wrapper(original) if method == "execute_model" else self._sample_wrapper(original)
            setattr(mr, method, wrapper)

    def _unwrap_runner(self) -> list[str]:
        mr = wv.runner(self.worker)
        restored = []
        for method, previous in self._saved_methods.items():
            if _is_doctor_wrapper(vars(mr).get(method)):
                if previous is None:
                    delattr(mr, method)
                else:
                    setattr(mr, method, previous)
                restored.append(method)
        self._saved_methods.clear()
        return restored

    def _execute_wrapper(self, original: Any) -> Any:
        # the hot path of every step: _safely's checks inlined, and the body inside the worker's
        # doctor gate in one frame, its step side inlined (StepGate.enter_step / leave_step: two
        # attribute accesses each way where a lock's cold acquire and release cost 3-5 µs).
        #
        # Most steps of a serving engine are decode steps with nothing to time or probe (and mixed
        # steps whose arrivals' prompts end in them): the short path opens those here, with no
        # call into the profiler (ForwardProfiler's slots: the step counts, the index, the open
        # step, the list of steps to count), up to the step its _fast_next allows. Every field it
        # touches is cold after vLLM's own work: on the cold bench (bench_step_path.py --cold)
        # each object and frame fewer is time off the step (on an H100 engine not yet measured
        # against the code before it: bench/README.md, fourteenth session). The rest takes
        # begin_step; tests/unit/test_decode_path.py holds the two to the same records
        own, disabled, clock, prof = self.own_s, self.disabled, time.perf_counter, self.profiler
        assert prof is not None
        gate = worker_lock(self.worker)
        dummy = wv.DUMMY_RUN_KWARG

        def execute_model(*args: Any, **kwargs: Any) -> Any:
            if kwargs and kwargs.get(dummy):  # the engine's start-up runs (a reader that attached early): no step
                return original(*args, **kwargs)
            d = gate.depth
            gate.depth = d + 1
            locked = gate.waiting > 0 and not d
            if locked:  # a doctor call is in: it ends first, and none starts until this step leaves
                gate.depth = d
                gate.lock.acquire()
            try:
                t0 = clock()
                counted = own["counts"]  # counting done in here is its own part
                # a CUDA graph's replay inside vLLM's call may read a sampled replay's events
                # (graphs.py): the doctor's time, not vLLM's
                reads = prof.graph_s
                step: Any = None
                quick: Any = NOT_QUICK
                steps = prof._phase_steps
                n = steps[0]
                if (n < prof._fast_until or steps[2] < prof._fast_mixed) and prof.current is None and args:
                    try:  # the short path (begin_step's for such a step; the counts wait: steps.Pending)
                        so = args[0]
                        cached = so.scheduled_cached_reqs
                        total = so.total_num_scheduled_tokens
                        req_ids = cached.req_ids
                        new_reqs = so.scheduled_new_reqs
                        pending: Any = None
                        if not (
                            new_reqs
                            or cached.resumed_req_ids
                            or so.scheduled_spec_decode_tokens
                            or total != len(req_ids)
                            or not total
                        ):  # a decode step: its counts from its total
                            if n < prof._fast_until:
                                steps[0] = n + 1
                                pending = (
                                    req_ids, cached.new_block_ids, so.finished_req_ids, so.preempted_req_ids, (),
                                    0, total, 0, total, total,
                                )  # fmt: skip
                        elif new_reqs and req_ids and steps[2] < prof._fast_mixed:
                            # a mixed step (a served engine's arrivals): StepTracker.quick counts
                            # it; one whose arrivals' prompts all end in it is opened here, any
                            # other is begin_step's, with what quick said
                            quick = prof.tracker.quick(so)
                            if quick is not None and quick[5] and quick[6] and not prof.tracker.in_prompt:
                                steps[2] += 1
                                pending = quick
                        if pending is not None:
                            index = prof.step_index
                            prof.step_index = index + 1
                            # the step before's end mark (a device event after a step on the device
                            # clock; the wall clock's time on the CPU build): finish_plain gives it
                            # back or reads the idle time from it; without one, the end is the
                            # sample_tokens wrapper's own
                            prev = prof._last_end
                            prof._last_end = None
                            step = [index, t0, None, 0.0, 0.0, None, prev, None, pending, None, NAN]
                            prof.current = step
                            prof._fast_open = step if prev is None and not prof._wall else None
                            to_count = prof.to_count
                            to_count.append(step)
                            if len(to_count) >= COUNT_BATCH:
                                prof.count_pending()
                    except Exception as exc:
                        self._crashed("steps", exc)
                if step is None and "steps" not in disabled:
                    try:
                        so = args[0] if args else kwargs.get("scheduler_output")
                        if self.faults:
                            self.fault("steps")
                        if self._armed or self._armed_layers:  # the previous step never finished
                            self._disarm()
                        step = prof.begin_step(so, quick)
                        if self.probe_plan or step.__class__ is not list:
                            self._begin_special(step)
                    except Exception as exc:
                        self._crashed("steps", exc)
                t = clock()
                try:
                    out = original(*args, **kwargs)
                except BaseException:
                    self._safely("steps", self._abort_step)
                    raise
                t1 = clock()
                inner = t1 - t - (prof.graph_s - reads)
                if "steps" not in disabled:
                    try:
                        step = prof.current
                        if step.__class__ is list and out is None:  # an unsampled step, sample_tokens follows
                            step[3] += inner  # type: ignore[index]
                        else:
                            if self._armed_layers:  # the forward ran inside execute_model
                                self._disarm_layers()
                            prof.after_execute(inner, out is not None)
                            if out is not None and (self._armed or self.probe is not None):
                                self._end_special()
                    except Exception as exc:
                        self._crashed("steps", exc)
                own["wrappers"] += (t - t0) + (clock() - t1) - (own["counts"] - counted)
                return out
            finally:
                if locked:
                    gate.lock.release()
                else:
                    gate.depth = d
                    if gate.waiting:
                        gate.left.set()

        execute_model.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return execute_model

    def _sample_wrapper(self, original: Any) -> Any:
        own, disabled, clock, prof = self.own_s, self.disabled, time.perf_counter, self.profiler
        assert prof is not None
        gate = worker_lock(self.worker)

        def sample_tokens(*args: Any, **kwargs: Any) -> Any:
            d = gate.depth  # the gate's step side, as in execute_model
            gate.depth = d + 1
            locked = gate.waiting > 0 and not d
            if locked:
                gate.depth = d
                gate.lock.acquire()
            try:
                t = clock()
                try:
                    return original(*args, **kwargs)
                finally:
                    t1 = clock()
                    step = prof.current
                    # a step the short path opened, not counted yet (a reader's collection may
                    # count it between the two methods), with no encoder call's marks: its end on
                    # the host's clock (finish_plain's for it)
                    if step is not None and step is prof._fast_open and step[2] is None and step[7] is None:
                        prof.current = prof._fast_open = None
                        step[4] += t1 - t
                        step[9] = t1 - step[1]
                        own["wrappers"] += clock() - t1
                    else:
                        counted = own["counts"]
                        if "steps" not in disabled:
                            try:
                                if step.__class__ is list:  # an unsampled step
                                    step[4] += t1 - t  # type: ignore[index]
                                    prof.finish_plain(step, t1)  # type: ignore[arg-type]
                                else:
                                    prof.after_sample(t1 - t)
                                if self._armed or self.probe is not None:
                                    self._end_special()
                            except Exception as exc:
                                self._crashed("steps", exc)
                        own["wrappers"] += clock() - t1 - (own["counts"] - counted)
            finally:
                if locked:
                    gate.lock.release()
                else:
                    gate.depth = d
                    if gate.waiting:
                        gate.left.set()

        sample_tokens.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return sample_tokens

    def _begin_special(self, step: OpenStep | list[Any] | None) -> None:
        """A sampled step, or any step while the probe waits (or nothing scheduled): arm the
        timing forwards (the root model's opens the probe's modes)."""
        if step is None:  # nothing scheduled
            self._end_probe_step()
            return
        sampled = isinstance(step, OpenStep)
        if isinstance(step, list) and step[2] is None and self.profiler is not None:  # the probe reads its phase now
            self.profiler.count_pending()
        counts = step.counts if isinstance(step, OpenStep) else step[2]
        self.probe_step = bool(self.probe_plan) and self._probe_wants(phase_of(counts))
        if sampled or self.probe_step:
            if self._replay_later:
                self._bind_replay()
            timed = isinstance(step, OpenStep) and step.layers_timed and "layers" not in self.disabled
            self._arm(timed, isinstance(step, OpenStep) and step.layers_detail)

    def _bind_replay(self) -> None:
        """The V2 runner's FULL graph replay, timed from the first sampled step that finds it (its
        graph manager is made with the KV cache, after a reader that attached during the engine's
        start installed: without this such a reader's decode steps, FULL replays, had no forward)."""
        replay = wv.full_graph_replay(self.worker)
        if replay is not None:
            self._replay_later = False
            self._timers.append(self._timing_call(*replay, "", "timers", "steps"))

    def _end_special(self) -> None:
        """The step ended: the timing forwards come off (V2 runners compute the logits in
        ``sample_tokens``), the probe's modes close."""
        self._disarm()
        self._end_probe_step()

    def _abort_step(self) -> None:
        self._disarm()
        if self.profiler is not None:
            self.profiler.abort_step()
        self._end_probe_step()

    # -- probe ----------------------------------------------------------------------------------
    def arm_probe(self, phases: list[str], reader: Any = None) -> dict[str, Any]:
        """Watch the next steps of ``phases`` op by op (starting the profiler for ``reader`` where
        none runs: the probe reads its steps' phases)."""
        model = wv.model(self.worker)
        if model is None:
            raise RuntimeError("the worker has no model loaded yet")
        state = wv.compile_state(self.worker)
        if not state["eager"]:
            self.probe_refused = (
                "the forward probe needs eager mode (enforce_eager=True, --eager); "
                "torch.compile / CUDA-graph replay bypasses Python-level op tracing"
            )
            return {"armed": False, "reason": self.probe_refused}
        if self.profiler is None:
            self.install(layers=False, reader=reader)
        if self.probe is None:
            self.probe = ProbeRecorder(model, wv.device(self.worker))
            self.probe.install_hooks()
            self.probe_modes = ProbeModes(self.probe)
        self.probe_plan = list(phases)
        self.probe_result = None
        self.hold_short_path()
        return {"armed": True, "phases": list(phases)}

    def disarm_probe(self) -> None:
        """The reader that armed the probe left before its steps came: its hooks come off."""
        if self.probe is not None and self.probe_plan:
            self._stop_probe()

    def _probe_wants(self, phase: str) -> bool:
        for i, wanted in enumerate(self.probe_plan):
            if wanted == "any" or wanted == phase or (wanted == "prefill" and phase == "mixed"):
                self.probe_plan.pop(i)
                self.hold_short_path()
                if self.probe is not None:
                    self.probe.steps_probed.append(
                        {"phase": phase, "index": self.profiler.step_index - 1 if self.profiler else None}
                    )
                return True
        return False

    def _probe_enter(self) -> None:
        self.fault("probe")
        if self.probe_modes is not None:
            self.probe_modes.enter()

    def _end_probe_step(self) -> None:
        if self.probe_modes is not None:
            self.probe_modes.exit()
        if self.probe_step:
            self.probe_step = False
        if self.probe is not None and not self.probe_plan:
            self._stop_probe()

    def _stop_probe(self) -> None:
        if self.probe_modes is not None:
            self.probe_modes.exit()
        if self.probe is not None:
            self.probe.remove_hooks()
            self.probe_result = self.probe.snapshot()
        self.probe = None
        self.probe_modes = None
        self.probe_plan = []
        self.probe_step = False
        self.hold_short_path()

    def probe_snapshot(self) -> dict[str, Any]:
        if self.probe is not None:  # still armed: report what it saw so far
            return {**self.probe.snapshot(), "complete": False, "waiting_for": list(self.probe_plan)}
        if self.probe_result is None:
            return {
                "complete": False,
                "events": [],
                "steps": [],
                "reason": self.probe_refused or "the probe never ran: arm it, then generate",
            }
        return {**self.probe_result, "complete": True}

    # -- collection -----------------------------------------------------------------------------
    def collect(self, reset: bool = False, timeline: bool = True, reader: Any = None) -> dict[str, Any]:
        """``reader``'s window (:meth:`install`); ``reset``: its next window starts after this.

        A reader whose window was never opened here (its install went to a connection that
        closed since, or to a profiler that a detach replaced) gets :class:`NoWindow`, never the
        records since the profiler started in place of its own window."""
        if self.profiler is not None and (reader not in self.windows or reader not in self.profiler.windows):
            raise NoWindow(
                "this reader has no window in the worker: its doctor_install was on another "
                "connection or before a detach (a reader's window ends with its connection); "
                "install again to open one"
            )
        data: dict[str, Any] = {
            "profiling": self.profiler is not None,
            "layers_on": self.layers_on,
            "layers_reason": self.layers_reason,
        }
        if self.profiler is not None:
            # the steps that wait for their counts are counted first: the doctor's counting
            # ("counts"), not its call's time, on the call's clock (call_clock)
            clock, counted = call_clock(), self.own_s["counts"]
            c0 = clock()
            self._safely("collect", self.profiler.count_pending)
            spent = clock() - c0
            self.own_s["counts"] = counted + spent
            self.rpc_s -= spent
            data.update(self._safely("collect", self.profiler.snapshot, reset, timeline, reader) or {})
            data["num_blocks"] = _num_blocks(self.worker)
            now = time.perf_counter()
            t0, own0, calls0, wall0 = self.windows[reader]
            data["doctor_host_s"] = {k: v - own0.get(k, 0.0) for k, v in self.own_s.items()}
            # the calls served in the window: on a reader's thread its CPU time, on the engine's the
            # wall (call_clock); and their wall time, a reader's waits for the GIL included
            data["doctor_rpc_s"] = self.calls_s() - calls0
            data["doctor_rpc_wall_s"] = self.rpc_wall_s - wall0
            data["window_s"] = now - t0
            if reset:
                self.windows[reader] = (now, dict(self.own_s), self.calls_s(), self.rpc_wall_s)
        data["crashes"] = list(self.crashes)
        data["probe"] = self.probe_snapshot()
        if self._merge or self.merge_calls:
            data["mm_merge"] = {"method": self._merge[0][1] if self._merge else None, "calls": list(self.merge_calls)}
        return data

    def open_window(
        self, reader: Any, sample_every: int = DEFAULT_SAMPLE_EVERY, step_clock: str = DEFAULT_STEP_CLOCK
    ) -> None:
        """``reader``'s window of the running profiler starts now (one it has stays open), at the
        sampling cadence and on the step clock it asks for."""
        assert self.profiler is not None
        self.profiler.want_sample_every(reader, sample_every)
        self.profiler.want_step_clock(reader, step_clock)
        self.profiler.open_window(reader)
        if reader not in self.windows:
            self.windows[reader] = (time.perf_counter(), dict(self.own_s), self.calls_s(), self.rpc_wall_s)

    def forget(self, reader: Any) -> None:
        """``reader`` went away without detaching the hooks (other readers still use them): the
        records only its window still held are let go."""
        self.windows.pop(reader, None)
        if self.profiler is not None:
            self.profiler.close_window(reader)


MERGE_CALLS_CHECKED = 3


def step_clock_of(asked: str | None) -> str:
    """The step clock a reader asked for, else the worker environment's (``VLLM_DOCTOR_STEP_CLOCK``),
    else :data:`~vllm_doctor.constants.DEFAULT_STEP_CLOCK`; ValueError for a name not in
    :data:`~vllm_doctor.constants.STEP_CLOCKS`."""
    value = asked if asked is not None else (os.environ.get(STEP_CLOCK_ENV, "").strip().lower() or DEFAULT_STEP_CLOCK)
    if value not in STEP_CLOCKS:
        source = "step_clock" if asked is not None else STEP_CLOCK_ENV
        raise ValueError(f"{source}={value!r}: the step clock is one of {', '.join(STEP_CLOCKS)}")
    return value


def own_budget_of(value: str | None = None) -> float:
    """The doctor's own budget on the device clock, a share of the worker's time: ``value``, else
    ``VLLM_DOCTOR_OWN_BUDGET`` in the worker's environment (a percentage: "0.5", "0.5%"; "0" or
    "off": none), else :data:`~vllm_doctor.constants.DEFAULT_OWN_BUDGET`; ValueError for anything
    else (a negative share, or one of 100 % or more)."""
    raw = (value if value is not None else os.environ.get(OWN_BUDGET_ENV, "")).strip().lower()
    if not raw:
        return DEFAULT_OWN_BUDGET
    if raw == "off":
        return 0.0
    try:
        pct = float(raw.removesuffix("%").strip())
    except ValueError:
        pct = -1.0
    if not 0.0 <= pct < 100.0:
        raise ValueError(
            f"{OWN_BUDGET_ENV}={raw!r}: the doctor's own budget is a percentage of the worker's time "
            "from 0 (off: the sampling cadence alone) to under 100, e.g. 0.5"
        )
    return pct / 100.0


def _compare_merge(out: Any, embeds: Any, mask: Any) -> dict[str, Any]:
    """One merge call: do the output's rows at the masked positions equal the image embeddings,
    concatenated in order? ``{"items", "rows" (masked), "expected_rows", "rows_differ"}``."""
    import torch

    expected = torch.cat([e.reshape(-1, e.shape[-1]) for e in embeds]) if isinstance(embeds, list | tuple) else embeds
    expected = expected.reshape(-1, expected.shape[-1])
    mask = mask.to(out.device).bool()
    got = out[mask]
    record: dict[str, Any] = {"items": len(embeds), "rows": int(got.shape[0]), "expected_rows": int(expected.shape[0])}
    if got.shape != expected.shape:
        record["rows_differ"] = None
        return record
    want = expected.to(device=got.device, dtype=got.dtype)
    same = torch.isclose(got.float(), want.float(), rtol=1e-2, atol=1e-3).all(dim=-1)
    record["rows_differ"] = int((~same).sum().item())
    return record


def _num_blocks(worker: Any) -> int | None:
    kcc = wv.kv_cache_config(worker)
    n = getattr(kcc, "num_blocks", None)
    return int(n) if n is not None else None


def _restore(armed: list[Armed]) -> None:
    for obj, attr, _, previous in armed:
        if previous is None:
            obj.__dict__.pop(attr, None)
        else:
            obj.__dict__[attr] = previous


def _is_doctor_wrapper(obj: Any) -> bool:
    return bool(getattr(obj, "__vllm_doctor_wrapper__", False))


def _doctor_forwards(model: nn.Module | None) -> int:
    """Modules that carry one of the doctor's timing ``forward`` attributes right now."""
    if model is None:
        return 0
    return sum(1 for m in model.modules() if _is_doctor_wrapper(m.__dict__.get("forward")))


def _hook_counts(model: nn.Module | None) -> dict[str, int]:
    if model is None:
        return {}
    pre = sum(len(m._forward_pre_hooks) for m in model.modules())
    post = sum(len(m._forward_hooks) for m in model.modules())
    return {"forward_pre_hooks": pre, "forward_hooks": post}
