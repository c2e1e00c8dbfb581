"""One doctor session per worker: what it installed, how to take it all back out.

Installed pieces (each optional, each removed by :meth:`WorkerSession.detach`):
- wrappers around ``model_runner.execute_model`` / ``sample_tokens`` (instance attributes that
  shadow the class methods; detach deletes them, restoring vLLM's own methods);
- forward hooks on the root model (forward time) and, in eager mode, on the timed modules;
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

from vllm_doctor.engine import DEFAULT_LAYER_EVERY, LAYER_WARMUP_STEPS
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
        self.own_s: dict[str, float] = {"wrappers": 0.0, "hooks": 0.0, "layer_hooks": 0.0}
        self.layers_on = False
        self.layers_reason = ""
        self._saved_methods: dict[str, Any] = {}  # name -> previous instance attribute or None
        self._hooks: list[Any] = []
        self._layer_hooks: list[Any] = []
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
            "layer_hooks": len(self._layer_hooks),
            "probe_hooks": len(self.probe._handles) if self.probe else 0,
            "probe_armed": list(self.probe_plan),
            "profiling": self.profiler is not None,
            "steps": self.profiler.step_index if self.profiler is not None else 0,
            "layers_on": self.layers_on,
            "disabled": sorted(self.disabled),
            "crashes": len(self.crashes),
            "model_hook_counts": _hook_counts(wv.model(self.worker)),
        }

    def install(self, layers: bool = True, trace_steps: int = DEFAULT_TRACE_STEPS,
                layer_every: int = DEFAULT_LAYER_EVERY) -> dict[str, Any]:
        model = wv.model(self.worker)
        if model is None:
            raise RuntimeError("the worker has no model loaded yet")
        if self.profiler is None:
            timed = select_modules(model)
            self.profiler = ForwardProfiler(clock_for(wv.device(self.worker)), timed, trace_steps, layer_every)
            self._wrap_runner()
            self._hook(model, "", self._hooks)
            for tm in timed:
                if tm.kind == "logits":  # outside the root forward; cheap, keep it on always
                    self._hook(model.get_submodule(tm.name), tm.name, self._hooks)
        self.profiler.layer_every = max(1, int(layer_every))
        state = wv.compile_state(self.worker)
        if layers and not self.layers_on:
            if state["eager"]:
                for tm in self.profiler.timed.values():
                    if tm.kind not in ("model", "logits"):
                        self._hook_layer(model.get_submodule(tm.name), tm.name, self._layer_hooks)
                self.layers_on = True
                self.profiler.layers_enabled = True
                every = self.profiler.layer_every
                self.layers_reason = (
                    "eager mode: forward hooks on every timed module, timing "
                    + ("every step" if every == 1 else
                       f"the first {LAYER_WARMUP_STEPS} steps of each phase, then every {every}th")
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
                "layer_every": self.profiler.layer_every,
                "layers_reason": self.layers_reason, "compile": state,
                "timed_modules": len(self.profiler.timed)}

    def detach(self) -> dict[str, Any]:
        restored = self._unwrap_runner()
        removed = len(self._hooks) + len(self._layer_hooks)
        for h in self._hooks + self._layer_hooks:
            h.remove()
        self._hooks.clear()
        self._layer_hooks.clear()
        self._stop_probe()
        self.layers_on = False
        self.profiler = None
        self.worker.__dict__.pop(SESSION_ATTR, None)
        return {"restored_methods": restored, "removed_hooks": removed, "status": self.status()}

    def _hook(self, module: nn.Module, name: str, into: list[Any]) -> None:
        """Hooks of the always-on per-step profiler: the root forward and the logits processor.

        They are also where the probe's modes open and close on a probe step.
        """

        own = self.own_s

        def pre_hook(module: nn.Module, args: Any) -> None:
            prof = self.profiler
            if prof is not None:
                t = time.perf_counter()
                self._safely("steps", prof.module_enter, name, True)
                own["hooks"] += time.perf_counter() - t
            if self.probe_step:
                self._safely("probe", self._probe_enter)

        def post_hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.probe_modes is not None and self.probe_modes.active:
                self._safely("probe", self.probe_modes.exit)
            prof = self.profiler
            if prof is not None:
                t = time.perf_counter()
                self._safely("steps", prof.module_exit, name)
                own["hooks"] += time.perf_counter() - t

        into.append(module.register_forward_pre_hook(pre_hook))
        into.append(module.register_forward_hook(post_hook, always_call=True))

    def _hook_layer(self, module: nn.Module, name: str, into: list[Any]) -> None:
        """Per-layer hooks: the hot path (two calls per module per step), so no :meth:`_safely`
        indirection; they return at once unless the current step is a per-layer sample."""
        prof = self.profiler
        assert prof is not None
        disabled, faults, own, clock = self.disabled, self.faults, self.own_s, time.perf_counter

        def pre_hook(module: nn.Module, args: Any) -> None:
            step = prof.current
            if step is None or not step.layers_timed or "layers" in disabled:
                return
            t = clock()
            try:
                if faults:
                    self.fault("layers")
                prof.module_enter(name)
            except Exception as exc:
                self._crashed("layers", exc)
            own["layer_hooks"] += clock() - t

        def post_hook(module: nn.Module, args: Any, output: Any) -> None:
            step = prof.current
            if step is None or not step.layers_timed or "layers" in disabled:
                return
            t = clock()
            try:
                prof.module_exit(name)
            except Exception as exc:
                self._crashed("layers", exc)
            own["layer_hooks"] += clock() - t

        into.append(module.register_forward_pre_hook(pre_hook))
        into.append(module.register_forward_hook(post_hook, always_call=True))

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
        own = self.own_s

        def execute_model(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            so = args[0] if args else kwargs.get("scheduler_output")
            self._safely("steps", self._begin_step, so)
            t = time.perf_counter()
            try:
                out = original(*args, **kwargs)
            except BaseException:
                self._safely("steps", self._abort_step)
                raise
            t1 = time.perf_counter()
            self._safely("steps", self._after_execute, t1 - t, out is not None)
            own["wrappers"] += (t - t0) + (time.perf_counter() - t1)
            return out

        execute_model.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return execute_model

    def _sample_wrapper(self, original: Any) -> Any:
        own = self.own_s

        def sample_tokens(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                self._safely("steps", self._after_sample, t1 - t)
                own["wrappers"] += time.perf_counter() - t1

        sample_tokens.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return sample_tokens

    def _begin_step(self, so: Any) -> None:
        counts = self.tracker.observe(so)
        if not counts["total_tokens"]:
            self._abort_step()
            return
        assert self.profiler is not None
        self.profiler.begin_step(counts)
        self.probe_step = self._probe_wants(phase_of(counts))

    def _after_execute(self, host_s: float, final: bool) -> None:
        if self.profiler is not None:
            self.profiler.after_execute(host_s, final)
        if final:
            self._end_probe_step()

    def _after_sample(self, host_s: float) -> None:
        if self.profiler is not None:
            self.profiler.after_sample(host_s)
        self._end_probe_step()

    def _abort_step(self) -> None:
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


def _hook_counts(model: nn.Module | None) -> dict[str, int]:
    if model is None:
        return {}
    pre = sum(len(m._forward_pre_hooks) for m in model.modules())
    post = sum(len(m._forward_hooks) for m in model.modules())
    return {"forward_pre_hooks": pre, "forward_hooks": post}
