"""Per-layer time inside FULL CUDA graphs: timing events captured into vLLM's graphs.

A FULL CUDA graph replays the whole forward without Python, so nothing of the doctor's runs
between its layers. What does run inside a replay is what was captured: an event created with
``torch.cuda.Event(enable_timing=True, external=True)`` and recorded while the stream is being
captured becomes a node of the graph, recorded again by every replay (../shared/design/
GPU_TIMING.md: two halves of a 400-kernel graph read 0.4133 + 0.4138 ms against a 0.828 ms
replay on the H200). So, while vLLM captures (``VLLM_DOCTOR_GRAPH_TIMING=1``, set by the doctor
for the engines it profiles; a served engine opts in with the same variable):

- ``CUDAGraph.capture_begin`` / ``capture_end`` are wrapped to know which graph is being
  captured; while one is, each vLLM attention layer's implementation (``do_kv_cache_update``,
  ``forward``: the calls vLLM's attention ops make) records an external event as it begins and
  returns, kept per graph in forward order (two per layer). The wrappers come off at
  ``capture_end``; the events stay in the graph. They are put on when a forward context is
  created during a capture (V2 runner: the context is set inside the capture) or at
  ``capture_begin`` from the context already set (V1 runner);
- ``CUDAGraph.replay`` is wrapped: on a sampled step of an attached doctor
  (:data:`ACTIVE`), a replay of a graph with captured events gets an ordinary event pair around
  it and is noted on the step. Its events are read (relative to the step's start event)
  before that graph replays again (the replay waits for the previous one to finish: once per
  sampled step, a host stall of at most one step), or when the profiler resolves the step,
  whichever comes first.

Nothing here changes what a graph computes: event nodes only record timestamps. Piecewise
graphs capture no attention (vLLM splits them at attention, which runs between the pieces in
Python), so they get no events; their layers are timed at run time by the session's wrappers.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_doctor.compat import worker as wv

ENV_FLAG = "VLLM_DOCTOR_GRAPH_TIMING"
# the profiler of the doctor session attached in this process (set by WorkerSession.install
# while per-layer timing is on, cleared by detach)
ACTIVE: Any = None
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Fixed:
    """A time already read: seconds since the step's start mark (graph events read early)."""

    s: float


@dataclass
class GraphMarks:
    """A captured graph's external events, in the order its replay records them."""

    marks: list[tuple[str, bool, Any]] = field(default_factory=list)  # (attention layer, entered?, event)
    # the last sampled replay not read yet: (step, an event recorded after the replay)
    unread: tuple[Any, Any] | None = None


@dataclass
class _State:
    installed: bool = False
    capturing: Any = None  # the CUDAGraph being captured, or None
    graphs: dict[int, tuple[Any, GraphMarks]] = field(default_factory=dict)  # id(graph) -> (graph, marks)
    wrapped: list[tuple[Any, str, Any]] = field(default_factory=list)  # (impl, attr, previous) during a capture
    originals: dict[str, Any] = field(default_factory=dict)
    captured_graphs: int = 0
    errors: list[str] = field(default_factory=list)


STATE = _State()


def enabled_by_env() -> bool:
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


def install_from_env() -> bool:
    """Install the capture and replay wrappers when ``VLLM_DOCTOR_GRAPH_TIMING=1`` (and CUDA
    is there); idempotent. Called where the doctor's code first runs in an engine process (the
    worker extension's import, the plugin's ``register``): before vLLM captures."""
    if not enabled_by_env() or not torch.cuda.is_available():
        return False
    return install()


def install() -> bool:
    with _lock:
        if STATE.installed:
            return True
        cls = torch.cuda.CUDAGraph
        for name in ("capture_begin", "capture_end", "replay"):
            STATE.originals[name] = cls.__dict__.get(name, getattr(cls, name))
        cls.capture_begin = _capture_begin  # type: ignore[method-assign]
        cls.capture_end = _capture_end  # type: ignore[method-assign]
        cls.replay = _replay  # type: ignore[method-assign]
        fc = wv.forward_context_class()
        if fc is not None:
            original_post_init = fc.__dict__.get("__post_init__")
            STATE.originals["__post_init__"] = (fc, original_post_init)

            def __post_init__(self: Any) -> None:
                if original_post_init is not None:
                    original_post_init(self)
                if STATE.capturing is not None:
                    _wrap_layers(getattr(self, "no_compile_layers", None))

            fc.__post_init__ = __post_init__  # type: ignore[attr-defined]
        STATE.installed = True
        return True


def uninstall() -> None:
    """Put vLLM's and torch's methods back (the events already captured stay in their graphs)."""
    with _lock:
        if not STATE.installed:
            return
        cls = torch.cuda.CUDAGraph
        for name in ("capture_begin", "capture_end", "replay"):
            setattr(cls, name, STATE.originals[name])
        fc, post_init = STATE.originals.get("__post_init__", (None, None))
        if fc is not None:
            if post_init is None:
                delattr(fc, "__post_init__")
            else:
                fc.__post_init__ = post_init  # type: ignore[attr-defined]
        STATE.originals.clear()
        STATE.installed = False


def status() -> dict[str, Any]:
    return {
        "installed": STATE.installed,
        "graphs_with_events": sum(1 for _, g in STATE.graphs.values() if g.marks),
        "events_per_graph": max((len(g.marks) for _, g in STATE.graphs.values()), default=0),
        "errors": list(STATE.errors[-5:]),
    }


def timed_graphs() -> int:
    return sum(1 for _, g in STATE.graphs.values() if g.marks)


# -- capture --------------------------------------------------------------------------------
def _capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
    out = STATE.originals["capture_begin"](self, *args, **kwargs)
    STATE.capturing = self
    try:
        _wrap_layers(wv.current_forward_layers())  # V1 runners set the forward context before capture
    except Exception as exc:  # never in the way of vLLM's capture
        STATE.errors.append(f"capture_begin: {type(exc).__name__}: {exc}")
    return out


def _capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return STATE.originals["capture_end"](self, *args, **kwargs)
    finally:
        STATE.capturing = None
        _unwrap_layers()
        entry = STATE.graphs.get(id(self))
        if entry is not None and entry[1].marks:
            STATE.captured_graphs += 1


def _wrap_layers(layers: Any) -> None:
    """While a graph is captured: wrap each attention implementation's calls (once per capture)."""
    if STATE.wrapped or not isinstance(layers, dict):
        return
    for name, impl in wv.attention_impls_of(layers):
        calls = [a for a in ("do_kv_cache_update", "forward") if callable(getattr(impl, a, None))]
        for i, attr in enumerate(calls):
            previous = impl.__dict__.get(attr)
            impl.__dict__[attr] = _capturing_call(getattr(impl, attr), name, i == 0, i == len(calls) - 1)
            STATE.wrapped.append((impl, attr, previous))


def _unwrap_layers() -> None:
    for impl, attr, previous in STATE.wrapped:
        if previous is None:
            impl.__dict__.pop(attr, None)
        else:
            impl.__dict__[attr] = previous
    STATE.wrapped = []


def _capturing_call(original: Any, name: str, first: bool, last: bool) -> Any:
    """The layer's first call records its entry, its last call its return (two events a layer)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        graph = STATE.capturing
        if graph is None or not torch.cuda.is_current_stream_capturing():
            return original(*args, **kwargs)
        marks = _marks_of(graph)
        if first:
            _record(marks, name, True)
        out = original(*args, **kwargs)
        if last:
            _record(marks, name, False)
        return out

    call.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
    return call


def _marks_of(graph: Any) -> GraphMarks:
    entry = STATE.graphs.get(id(graph))
    if entry is None or entry[0] is not graph:
        entry = STATE.graphs[id(graph)] = (graph, GraphMarks())
    return entry[1]


def _record(marks: GraphMarks, name: str, enter: bool) -> None:
    if STATE.errors:  # one failure switches capture timing off (the graph is captured without it)
        return
    try:
        event = torch.cuda.Event(enable_timing=True, external=True)
        event.record()
    except Exception as exc:
        STATE.errors.append(f"record: {type(exc).__name__}: {exc}")
        return
    marks.marks.append((name, enter, event))


# -- replay ---------------------------------------------------------------------------------
def _replay(self: Any, *args: Any, **kwargs: Any) -> Any:
    entry = STATE.graphs.get(id(self))
    if entry is None or not entry[1].marks:
        return STATE.originals["replay"](self, *args, **kwargs)
    marks = entry[1]
    if marks.unread is not None:  # read the previous sampled replay before this one overwrites it
        read(marks, block=True)
    prof = ACTIVE
    step = getattr(prof, "current", None) if prof is not None else None
    if step is None or not getattr(step, "layers_timed", False) or getattr(step, "start", None) is None:
        return STATE.originals["replay"](self, *args, **kwargs)
    out = STATE.originals["replay"](self, *args, **kwargs)
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    marks.unread = (step, end)
    step.graph_reads.append(marks)
    return out


def read(marks: GraphMarks, block: bool) -> bool:
    """Turn the last sampled replay's events into the step's attention bounds (:class:`Fixed`
    seconds since the step's start). False if not complete yet and not ``block``."""
    if marks.unread is None:
        return True
    step, end = marks.unread
    if not end.query():
        if not block:
            return False
        end.synchronize()
    origin = step.start
    for name, enter, event in marks.marks:
        step.bounds.append((name, enter, Fixed(origin.elapsed_time(event) / 1000.0)))
    marks.unread = None
    return True
