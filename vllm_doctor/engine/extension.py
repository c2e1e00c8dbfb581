"""The worker extension: ``LLM(..., worker_extension_cls=EXTENSION_QUALNAME)``.

vLLM mixes this class into its worker class, so each method below runs inside every worker
(same process in single-process mode, a worker process otherwise) and is called by name:
``llm.collective_rpc("doctor_kv")``. Every method returns a JSON-able envelope

    {"ok": true, "method": ..., "rank": ..., "pid": ..., "data": {...}}
    {"ok": false, "method": ..., "rank": ..., "pid": ..., "error": {"type", "message", "traceback"}}

and never raises: a probe that fails is a ``crash`` finding on the doctor's side, and the
engine keeps serving. Options may be a dict or a JSON string (vLLM's HTTP ``/collective_rpc``
dev endpoint passes strings only). Method names all start with ``doctor_`` (vLLM refuses an
extension whose attributes clash with the worker's).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from vllm_doctor.constants import DOCTOR_ENV, GRAPH_TIMING_ENV, env_switch

PROTOCOL = 1


def _graph_timing_from_env() -> None:
    """``VLLM_DOCTOR_GRAPH_TIMING=1``: this module is imported in each worker when vLLM builds
    the worker class, before the model is loaded and its CUDA graphs captured: the moment to
    install the capture wrappers of :mod:`vllm_doctor.engine.graphs`."""
    if env_switch(GRAPH_TIMING_ENV):
        try:
            from vllm_doctor.engine import graphs

            graphs.TIMING.install_from_env()
        except Exception:  # per-layer timing inside graphs is lost, nothing else
            pass


_graph_timing_from_env()


def _options(options: Any) -> dict[str, Any]:
    if options is None or options == "":
        return {}
    if isinstance(options, str):
        parsed = json.loads(options)
        if not isinstance(parsed, dict):
            raise ValueError("options must be a JSON object")
        return parsed
    if isinstance(options, dict):
        return dict(options)
    raise TypeError(f"options must be a dict or a JSON string, not {type(options).__name__}")


# the calls a watcher repeats while the engine serves (top's model panel, attach): their time in
# the reader whose window install opens and collect reads: set by the private channel's server
# (one per connection; vllm_doctor.channel refuses it from the wire); absent: the one shared window
READER_OPTION = "reader"
# the worker is the doctor's, between two steps, and is counted in the next collect's reply
TIMED_RPCS = frozenset(
    {
        "doctor_ping",
        "doctor_anatomy",
        "doctor_perf",
        "doctor_quant",
        "doctor_placement",
        "doctor_kv",
        "doctor_memory",
        "doctor_collect",
        "doctor_status",
    }
)


def _envelope(worker: Any, method: str, fn: Callable[[], Any]) -> dict[str, Any]:
    head = {"method": method, "rank": getattr(worker, "rank", None), "pid": os.getpid()}
    from vllm_doctor.engine.gate import GATE_TIMEOUT_S
    from vllm_doctor.engine.session import worker_lock

    gate = worker_lock(worker)
    if not gate.acquire(timeout=GATE_TIMEOUT_S):  # never in the middle of the wrappers' bookkeeping of a step
        message = f"the worker's step did not end within {GATE_TIMEOUT_S:.0f} s"
        return {"ok": False, **head, "error": {"type": "Busy", "message": message, "traceback": ""}}
    try:
        return _call(worker, method, fn, head)
    finally:
        gate.release()


def _call(worker: Any, method: str, fn: Callable[[], Any], head: dict[str, Any]) -> dict[str, Any]:
    try:
        from vllm_doctor.engine.session import CALL_THREAD, call_clock, session_for

        session = session_for(worker)
        session.fault(f"rpc:{method}")
        if method not in TIMED_RPCS:
            return {"ok": True, **head, "data": fn()}
        # on a reader's thread the call's CPU time, on the engine's its wall (session.call_clock)
        clock = call_clock()
        t0, w0 = clock(), time.perf_counter()
        data = fn()
        spent = clock() - t0
        session.rpc_s += spent  # after a reset too: this call's own time
        session.rpc_wall_s += time.perf_counter() - w0
        if CALL_THREAD.side:
            CALL_THREAD.counted += spent
        return {"ok": True, **head, "data": data}
    except Exception as exc:
        return {
            "ok": False,
            **head,
            "error": {
                "type": type(exc).__name__,
                "message": str(exc)[:1000],
                "traceback": traceback.format_exc()[-6000:],
            },
        }


class DoctorWorkerExtension:
    """Methods the doctor calls inside each vLLM worker through ``collective_rpc`` or the
    private channel (:mod:`vllm_doctor.engine.channel`)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """vLLM appends this class to its worker class's bases, so this runs when vLLM creates
        the worker: with ``VLLM_DOCTOR=1`` the process opens the doctor's private channel to it
        (a Unix socket in the user's private directory). Never raises for the doctor's sake."""
        worker = super().__new__(cls)
        if env_switch(DOCTOR_ENV):
            try:
                from vllm_doctor.engine import channel

                channel.serve(worker)
            except Exception as exc:  # the channel is optional; vLLM's start-up is not
                import logging

                logging.getLogger("vllm_doctor").warning(
                    "vllm-doctor: no private channel in pid %d: %s: %s", os.getpid(), type(exc).__name__, exc
                )
        return worker

    def doctor_ping(self) -> dict[str, Any]:
        from vllm_doctor import __version__
        from vllm_doctor.compat.worker import served_model_name

        return _envelope(
            self,
            "doctor_ping",
            lambda: {"protocol": PROTOCOL, "version": __version__, "served_model_name": served_model_name(self)},
        )

    def doctor_anatomy(self) -> dict[str, Any]:
        from vllm_doctor.compat.worker_facts import anatomy

        return _envelope(self, "doctor_anatomy", lambda: anatomy(self))

    def doctor_perf(self) -> dict[str, Any]:
        """The model's module tree as the performance lint reads it (once: the tree does not change)."""
        from vllm_doctor.compat.worker_facts import perf

        def read() -> dict[str, Any]:
            cached = getattr(self, "_doctor_perf", None)
            if cached is None:
                cached = perf(self)
                self._doctor_perf = cached
            return cached

        return _envelope(self, "doctor_perf", read)

    def doctor_quant(self) -> dict[str, Any]:
        """Which modules run a quantization method, and their weights (once: they do not change)."""
        from vllm_doctor.compat.quant import quantization

        def read() -> dict[str, Any]:
            cached = getattr(self, "_doctor_quant", None)
            if cached is None:
                cached = quantization(self)
                self._doctor_quant = cached
            return cached

        return _envelope(self, "doctor_quant", read)

    def doctor_placement(self) -> dict[str, Any]:
        from vllm_doctor.compat.worker_facts import placement

        return _envelope(self, "doctor_placement", lambda: placement(self))

    def doctor_kv(self) -> dict[str, Any]:
        from vllm_doctor.compat.worker_facts import kv_cache

        return _envelope(self, "doctor_kv", lambda: kv_cache(self))

    def doctor_memory(self) -> dict[str, Any]:
        from vllm_doctor.compat.worker_facts import memory

        return _envelope(self, "doctor_memory", lambda: memory(self))

    def doctor_install(self, options: Any = None) -> dict[str, Any]:
        """Start the forward profiler: per step always, per layer if ``layers`` (default true).

        ``sample_every``: after the first steps of each phase, time every N-th step per layer
        (default 8; 1 = every step). ``trace_steps``: steps kept with their layer events.
        ``step_clock``: ``sampled`` or ``every`` (which steps carry the device clock on GPU;
        default: ``VLLM_DOCTOR_STEP_CLOCK`` in the worker's environment, else ``sampled``).
        """

        def run() -> dict[str, Any]:
            from vllm_doctor.engine import DEFAULT_SAMPLE_EVERY
            from vllm_doctor.engine.profiler import DEFAULT_TRACE_STEPS
            from vllm_doctor.engine.session import session_for

            opts = _options(options)
            return session_for(self).install(
                layers=bool(opts.get("layers", True)),
                trace_steps=int(opts.get("trace_steps", DEFAULT_TRACE_STEPS)),
                sample_every=int(opts.get("sample_every", DEFAULT_SAMPLE_EVERY)),
                reader=opts.get(READER_OPTION),
                step_clock=opts.get("step_clock"),
            )

        return _envelope(self, "doctor_install", run)

    def doctor_arm_probe(self, options: Any = None) -> dict[str, Any]:
        """Watch the next steps op by op (VD403/VD404); ``phases`` default ["prefill", "decode"]."""

        def run() -> dict[str, Any]:
            from vllm_doctor.engine.session import session_for

            opts = _options(options)
            phases = opts.get("phases", ["prefill", "decode"])
            return session_for(self).arm_probe([str(p) for p in phases], reader=opts.get(READER_OPTION))

        return _envelope(self, "doctor_arm_probe", run)

    def doctor_collect(self, options: Any = None) -> dict[str, Any]:
        """The profile so far: step records as columns, layer totals, the probe, crashes.
        ``reset``: records start again after this reply; ``timeline: false``: no per-layer trace."""

        def run() -> dict[str, Any]:
            from vllm_doctor.engine.session import session_for

            opts = _options(options)
            return session_for(self).collect(
                reset=bool(opts.get("reset", False)),
                timeline=bool(opts.get("timeline", True)),
                reader=opts.get(READER_OPTION),
            )

        return _envelope(self, "doctor_collect", run)

    def doctor_status(self) -> dict[str, Any]:
        from vllm_doctor.engine.session import session_for

        return _envelope(self, "doctor_status", lambda: session_for(self).status())

    def doctor_detach(self) -> dict[str, Any]:
        """Remove every hook and wrapper the doctor installed in this worker."""
        from vllm_doctor.engine.session import session_for

        return _envelope(self, "doctor_detach", lambda: session_for(self).detach())

    def doctor_arm_hidden(self, options: Any = None) -> dict[str, Any]:
        """Record each decoder layer's output on the next forward of >= ``tokens`` tokens (one
        request), then unhook. ``decode``: on the decode step right after that prefill instead.
        ``max_values``: bound on the floats kept (default 4M). A multimodal model's encoder:
        ``encoder`` (also the vision tower's input and output and the projector's output),
        ``layers`` (False: the encoder parts only), ``all_rows`` (every row of that forward)."""

        def run() -> dict[str, Any]:
            from vllm_doctor.engine import hidden

            opts = _options(options)
            limit = int(opts.get("max_values", hidden.DEFAULT_MAX_VALUES))
            flags = {k: bool(opts[k]) for k in ("layers", "encoder", "all_rows") if k in opts}
            return hidden.arm(self, int(opts["tokens"]), limit, decode=bool(opts.get("decode")), **flags)

        return _envelope(self, "doctor_arm_hidden", run)

    def doctor_collect_hidden(self) -> dict[str, Any]:
        """The hidden states :meth:`doctor_arm_hidden` recorded (``{"layers": {"0": [[...]]}}``)."""
        from vllm_doctor.engine import hidden

        return _envelope(self, "doctor_collect_hidden", lambda: hidden.collect(self))
