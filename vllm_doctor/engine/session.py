"""One doctor session per worker: what it installed, how to take it all back out.

Installed pieces (each optional, each removed by :meth:`WorkerSession.detach`):
- wrappers around ``model_runner.execute_model`` / ``sample_tokens`` (instance attributes that
  shadow the class methods; detach deletes them, restoring vLLM's own methods);
- forward hooks on the root model and the logits processor (forward time);
- in eager mode, a timing ``forward`` (instance attribute) on each timed module, present only
  while a sampled step runs;
- the forward probe (VD403/VD404): hooks on every module + function/dispatch modes, only for
  the probe steps.

Every piece of doctor code on the forward path runs under :meth:`_safely`: an exception is
recorded as a crash, that piece is switched off, and vLLM's own call goes on untouched.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from torch import nn

from vllm_doctor.engine import DEFAULT_SAMPLE_EVERY, SAMPLE_WARMUP_STEPS
from vllm_doctor.engine import worker_view as wv
from vllm_doctor.engine.clock import clock_for
from vllm_doctor.engine.layers import select_modules
from vllm_doctor.engine.probe import ProbeModes, ProbeRecorder
from vllm_doctor.engine.profiler import DEFAULT_TRACE_STEPS, ForwardProfiler
from vllm_doctor.engine.steps import StepTracker, phase_of

SESSION_ATTR = "_vllm_doctor_session"
WRAPPED_METHODS = ("execute_model", "sample_tokens")


class InjectedFault(RuntimeError):
    """Raised on purpose by a test (``doctor_inject_fault``) to prove crashes are contained."""


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
        self.tracker = StepTracker()
        # the doctor's own host time while attached (measured inside its wrappers and hooks)
        self.own_s: dict[str, float] = {"wrappers": 0.0, "hooks": 0.0, "layer_forwards": 0.0}
        self.layers_on = False
        self.layers_reason = ""
        self._saved_methods: dict[str, Any] = {}  # name -> previous instance attribute or None
        self._hooks: list[Any] = []
        self._layer_wrappers: list[tuple[nn.Module, Any, Any]] = []  # (module, timing forward, previous)
        self._layers_armed = False
        self.probe: ProbeRecorder | None = None
        self.probe_modes: ProbeModes | None = None
        self.probe_plan: list[str] = []  # phases still to probe: "prefill", "decode", "any"
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
        self.crashes.append({
            "component": component, "type": type(exc).__name__, "message": str(exc)[:500],
            "traceback": traceback.format_exc()[-4000:],
            "step": self.profiler.step_index if self.profiler else None,
        })
        if component == "probe":
            self._end_probe_step()

    # -- install / detach --------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        mr = wv.runner(self.worker)
        return {
            "wrapped_methods": sorted(n for n in WRAPPED_METHODS if _is_doctor_wrapper(vars(mr).get(n))),
            "hooks": len(self._hooks),
            "layer_wrappers": len(self._layer_wrappers),
            "layers_armed": self._layers_armed,
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

    def install(self, layers: bool = True, trace_steps: int = DEFAULT_TRACE_STEPS,
                sample_every: int = DEFAULT_SAMPLE_EVERY) -> dict[str, Any]:
        model = wv.model(self.worker)
        if model is None:
            raise RuntimeError("the worker has no model loaded yet")
        if self.profiler is None:
            timed = select_modules(model)
            self.profiler = ForwardProfiler(clock_for(wv.device(self.worker)), timed, trace_steps, sample_every)
            self._wrap_runner()
            self._hook(model, "", self._hooks)
            for tm in timed:
                if tm.kind == "logits":  # outside the root forward; cheap, keep it on always
                    self._hook(model.get_submodule(tm.name), tm.name, self._hooks)
        self.profiler.sample_every = max(1, int(sample_every))
        state = wv.compile_state(self.worker)
        if layers and not self.layers_on:
            if state["eager"]:
                self._layer_wrappers = [
                    self._layer_wrapper(model.get_submodule(tm.name), tm.name)
                    for tm in self.profiler.timed.values() if tm.kind not in ("model", "logits")
                ]
                self.layers_on = True
                self.profiler.layers_enabled = True
                every = self.profiler.sample_every
                self.layers_reason = (
                    "eager mode: every timed module is timed on "
                    + ("every step" if every == 1 else
                       f"the first {SAMPLE_WARMUP_STEPS} steps of each phase, then every {every}-th")
                )
            else:
                self.layers_reason = (
                    "per-layer timing needs eager mode (enforce_eager=True): this engine runs "
                    f"torch.compile={state['compiled']} / CUDA graphs={state['cudagraphs']}, "
                    "whose replay skips Python hooks; per-step timing only"
                )
        elif not layers:
            self.layers_reason = "per-layer timing not requested"
        return {"installed": True, "clock": self.profiler.clock.kind, "layers_on": self.layers_on,
                "sample_every": self.profiler.sample_every,
                "layers_reason": self.layers_reason, "compile": state,
                "timed_modules": len(self.profiler.timed)}

    def detach(self) -> dict[str, Any]:
        restored = self._unwrap_runner()
        self._disarm_layers()
        removed = len(self._hooks)
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._layer_wrappers = []
        self._stop_probe()
        self.layers_on = False
        self.profiler = None
        self.worker.__dict__.pop(SESSION_ATTR, None)
        return {"restored_methods": restored, "removed_hooks": removed, "status": self.status()}

    def _hook(self, module: nn.Module, name: str, into: list[Any]) -> None:
        """Hooks of the always-on per-step profiler: the root forward and the logits processor.

        They time the step when it is timed (every step on CPU, the samples on GPU), and are
        where the probe's modes open and close on a probe step.
        """
        own, disabled, clock = self.own_s, self.disabled, time.perf_counter

        def pre_hook(module: nn.Module, args: Any) -> None:
            prof = self.profiler
            if prof is not None and prof.current is not None and prof.current.timed and "steps" not in disabled:
                t = clock()
                try:
                    prof.module_enter(name, True)
                except Exception as exc:
                    self._crashed("steps", exc)
                own["hooks"] += clock() - t
            if self.probe_step:
                self._safely("probe", self._probe_enter)

        def post_hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.probe_modes is not None and self.probe_modes.active:
                self._safely("probe", self.probe_modes.exit)
            prof = self.profiler
            if prof is not None and prof.current is not None and prof.current.timed and "steps" not in disabled:
                t = clock()
                try:
                    prof.module_exit(name)
                except Exception as exc:
                    self._crashed("steps", exc)
                own["hooks"] += clock() - t

        into.append(module.register_forward_pre_hook(pre_hook))
        into.append(module.register_forward_hook(post_hook, always_call=True))

    def _layer_wrapper(self, module: nn.Module, name: str) -> tuple[nn.Module, Any, Any]:
        """A timing ``forward`` for one timed module, put on the module only for sampled steps.

        An instance attribute ``forward`` shadows the class's for exactly those steps (nn.Module
        calls ``self.forward``); on every other step the module has nothing of the doctor's, not
        even an idle hook (PyTorch's hook path costs microseconds per call on its own).
        """
        prof = self.profiler
        assert prof is not None
        previous = module.__dict__.get("forward")  # someone else's instance forward, restored after
        original = module.forward
        disabled, faults, own, clock = self.disabled, self.faults, self.own_s, time.perf_counter

        def forward(*args: Any, **kwargs: Any) -> Any:
            if "layers" in disabled:
                return original(*args, **kwargs)
            t = clock()
            try:
                if faults:
                    self.fault("layers")
                prof.module_enter(name)
            except Exception as exc:
                self._crashed("layers", exc)
            own["layer_forwards"] += clock() - t
            try:
                return original(*args, **kwargs)
            finally:
                t = clock()
                try:
                    prof.module_exit(name)
                except Exception as exc:
                    self._crashed("layers", exc)
                own["layer_forwards"] += clock() - t

        forward.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return module, forward, previous

    def _arm_layers(self) -> None:
        for module, forward, _ in self._layer_wrappers:
            module.__dict__["forward"] = forward
        self._layers_armed = True

    def _disarm_layers(self) -> None:
        if not self._layers_armed:
            return
        for module, _, previous in self._layer_wrappers:
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = previous
        self._layers_armed = False

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
        # the hot path of every step: _safely's checks inlined
        own, disabled, clock = self.own_s, self.disabled, time.perf_counter

        def execute_model(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            if "steps" not in disabled:
                try:
                    if self.faults:
                        self.fault("steps")
                    self._begin_step(args[0] if args else kwargs.get("scheduler_output"))
                except Exception as exc:
                    self._crashed("steps", exc)
            t = clock()
            try:
                out = original(*args, **kwargs)
            except BaseException:
                self._safely("steps", self._abort_step)
                raise
            t1 = clock()
            if "steps" not in disabled:
                try:
                    self._after_execute(t1 - t, out is not None)
                except Exception as exc:
                    self._crashed("steps", exc)
            own["wrappers"] += (t - t0) + (clock() - t1)
            return out

        execute_model.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return execute_model

    def _sample_wrapper(self, original: Any) -> Any:
        own, disabled, clock = self.own_s, self.disabled, time.perf_counter

        def sample_tokens(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return original(*args, **kwargs)
            finally:
                t1 = clock()
                if "steps" not in disabled:
                    try:
                        self._after_sample(t1 - t)
                    except Exception as exc:
                        self._crashed("steps", exc)
                own["wrappers"] += clock() - t1

        sample_tokens.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return sample_tokens

    def _begin_step(self, so: Any) -> None:
        counts = self.tracker.observe(so)
        if not counts["total_tokens"]:
            self._abort_step()
            return
        assert self.profiler is not None
        self._disarm_layers()  # the previous step never finished
        self.profiler.begin_step(counts)
        step = self.profiler.current
        if step is not None and step.layers_timed and "layers" not in self.disabled:
            self._arm_layers()
        self.probe_step = bool(self.probe_plan) and self._probe_wants(phase_of(counts))

    def _after_execute(self, host_s: float, final: bool) -> None:
        self._disarm_layers()  # the forward ran inside execute_model
        if self.profiler is not None:
            self.profiler.after_execute(host_s, final)
        if final:
            self._end_probe_step()

    def _after_sample(self, host_s: float) -> None:
        self._disarm_layers()
        if self.profiler is not None:
            self.profiler.after_sample(host_s)
        self._end_probe_step()

    def _abort_step(self) -> None:
        self._disarm_layers()
        if self.profiler is not None:
            self.profiler.abort_step()
        self._end_probe_step()

    # -- probe ----------------------------------------------------------------------------------
    def arm_probe(self, phases: list[str]) -> dict[str, Any]:
        model = wv.model(self.worker)
        if model is None:
            raise RuntimeError("the worker has no model loaded yet")
        state = wv.compile_state(self.worker)
        if not state["eager"]:
            return {"armed": False, "reason": "the forward probe needs eager mode (enforce_eager=True); "
                    "torch.compile / CUDA-graph replay bypasses Python-level op tracing"}
        if self.profiler is None:
            self.install(layers=False)
        if self.probe is None:
            self.probe = ProbeRecorder(model, wv.device(self.worker))
            self.probe.install_hooks()
            self.probe_modes = ProbeModes(self.probe)
        self.probe_plan = list(phases)
        self.probe_result = None
        return {"armed": True, "phases": list(phases)}

    def _probe_wants(self, phase: str) -> bool:
        for i, wanted in enumerate(self.probe_plan):
            if wanted == "any" or wanted == phase or (wanted == "prefill" and phase == "mixed"):
                self.probe_plan.pop(i)
                if self.probe is not None:
                    self.probe.steps_probed.append({"phase": phase, "index": self.profiler.step_index - 1 if self.profiler else None})
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

    def probe_snapshot(self) -> dict[str, Any]:
        if self.probe is not None:  # still armed: report what it saw so far
            return {**self.probe.snapshot(), "complete": False, "waiting_for": list(self.probe_plan)}
        if self.probe_result is None:
            return {"complete": False, "events": [], "steps": [], "reason": "the probe never ran: arm it, then generate"}
        return {**self.probe_result, "complete": True}

    # -- collection -----------------------------------------------------------------------------
    def collect(self, reset: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {"profiling": self.profiler is not None, "layers_on": self.layers_on,
                                "layers_reason": self.layers_reason}
        if self.profiler is not None:
            data.update(self._safely("collect", self.profiler.snapshot, reset) or {})
            data["num_blocks"] = _num_blocks(self.worker)
            data["doctor_host_s"] = dict(self.own_s)
            if reset:
                for key in self.own_s:
                    self.own_s[key] = 0.0
        data["crashes"] = list(self.crashes)
        data["probe"] = self.probe_snapshot()
        return data


def _num_blocks(worker: Any) -> int | None:
    kcc = wv.kv_cache_config(worker)
    n = getattr(kcc, "num_blocks", None)
    return int(n) if n is not None else None


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
