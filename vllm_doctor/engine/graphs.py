"""Per-layer time inside FULL CUDA graphs: timing events captured into vLLM's graphs.

A FULL CUDA graph replays the whole forward without Python, so nothing of the doctor's runs
between its layers. What does run inside a replay is what was captured: an event created with
``torch.cuda.Event(enable_timing=True, external=True)`` and recorded while the stream is being
captured becomes a node of the graph, recorded again by every replay (measured on an H200 with
torch 2.11: two halves of a 400-kernel graph read 0.4133 + 0.4138 ms against a 0.828 ms
replay). So, while vLLM captures (``VLLM_DOCTOR_GRAPH_TIMING=1``,
:data:`vllm_doctor.constants.GRAPH_TIMING_ENV`, set by the doctor for the engines it profiles; a
served engine opts in with the same variable):

- ``CUDAGraph.capture_begin`` / ``capture_end`` are wrapped to know which graph is being
  captured; while one is, each vLLM attention layer's implementation (``do_kv_cache_update``,
  ``forward``: the calls vLLM's attention ops make) records an external event as it begins and
  returns, kept per graph in forward order (two per layer). The wrappers come off at
  ``capture_end``; the events stay in the graph. They are put on when a forward context is
  created during a capture (V2 runner: the context is set inside the capture) or at
  ``capture_begin`` from the context already set (V1 runner);
- ``CUDAGraph.replay`` is wrapped: on a sampled step of an attached doctor
  (:attr:`GraphTiming.active`), a replay of a graph with captured events gets an ordinary event pair around
  it and is noted on the step. Its events are read (relative to the step's start event)
  before that graph replays again (the replay waits for the previous one to finish: once per
  sampled step, a host stall of at most one step), or when the profiler resolves the step,
  whichever comes first. That read runs inside vLLM's ``execute_model`` (in the replay), so it
  is timed here, as the doctor's own time in two parts of the session's ``own_s``: the wait for
  the sampled replay to finish (:data:`GRAPH_WAITS`: the host blocked, not working; it costs
  throughput by the gap it leaves on the device before this replay, not by its length: on an
  H100 at every 8th step, 0.71 ms a step of waiting and reading, where six paired rounds of the
  same workload measured -0.56 % throughput; bench/README.md) and the reading
  (:data:`GRAPH_READS`); the step wrapper leaves both out of vLLM's host time.

Nothing here changes what a graph computes: event nodes only record timestamps. Piecewise
graphs capture no attention (vLLM splits them at attention, which runs between the pieces in
Python), so they get no events; their layers are timed at run time by the session's wrappers.

All of it is one object per process, :data:`TIMING` (:class:`GraphTiming`): the wrappers it puts
on, the graphs it saw captured and the profiler it reports to.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_doctor.compat import mixers
from vllm_doctor.compat import worker as wv
from vllm_doctor.constants import GRAPH_TIMING_ENV, env_switch

# the doctor's own time at a graph's next replay after a sampled one: waiting for the sampled replay
# to finish, then reading its events; parts of the session's own_s, kept only where graphs carry events
GRAPH_WAITS = "graph_waits"
GRAPH_READS = "graph_reads"


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


class GraphTiming:
    """This process's timing inside CUDA graphs: the wrappers on ``torch.cuda.CUDAGraph`` (and
    vLLM's forward context), the graphs captured with events, and the profiler they report to."""

    def __init__(self) -> None:
        # the profiler of the doctor session attached in this process (set by WorkerSession.install
        # while per-layer timing is on, cleared by detach)
        self.active: Any = None
        self.installed = False
        self.capturing: Any = None  # the CUDAGraph being captured, or None
        self.graphs: dict[int, tuple[Any, GraphMarks]] = {}  # id(graph) -> (graph, marks)
        self.wrapped: list[tuple[Any, str, Any]] = []  # (impl, attr, previous) during a capture
        self.originals: dict[str, Any] = {}
        self.captured_graphs = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def install_from_env(self) -> bool:
        """Install the capture and replay wrappers when ``VLLM_DOCTOR_GRAPH_TIMING=1`` (and CUDA
        is there); idempotent. Called where the doctor's code first runs in an engine process (the
        worker extension's import): before vLLM captures."""
        if not env_switch(GRAPH_TIMING_ENV) or not torch.cuda.is_available():
            return False
        return self.install()

    def install(self) -> bool:
        with self._lock:
            if self.installed:
                return True
            cls = torch.cuda.CUDAGraph
            for name in ("capture_begin", "capture_end", "replay"):
                self.originals[name] = cls.__dict__.get(name, getattr(cls, name))

            # plain functions: torch calls them as methods, the graph first
            def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
                return self._capture_begin(graph, *args, **kwargs)

            def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
                return self._capture_end(graph, *args, **kwargs)

            def replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
                return self._replay(graph, *args, **kwargs)

            cls.capture_begin = capture_begin  # type: ignore[method-assign,assignment]
            cls.capture_end = capture_end  # type: ignore[method-assign,assignment]
            cls.replay = replay  # type: ignore[method-assign,assignment]
            fc = wv.forward_context_class()
            if fc is not None:
                original_post_init = fc.__dict__.get("__post_init__")
                self.originals["__post_init__"] = (fc, original_post_init)

                def __post_init__(context: Any) -> None:
                    if original_post_init is not None:
                        original_post_init(context)
                    if self.capturing is not None:
                        self._wrap_layers(getattr(context, "no_compile_layers", None))

                fc.__post_init__ = __post_init__  # type: ignore[attr-defined]
            self.installed = True
            return True

    def uninstall(self) -> None:
        """Put vLLM's and torch's methods back (the events already captured stay in their graphs)."""
        with self._lock:
            if not self.installed:
                return
            cls = torch.cuda.CUDAGraph
            for name in ("capture_begin", "capture_end", "replay"):
                setattr(cls, name, self.originals[name])
            fc, post_init = self.originals.get("__post_init__", (None, None))
            if fc is not None:
                if post_init is None:
                    delattr(fc, "__post_init__")
                else:
                    fc.__post_init__ = post_init  # type: ignore[attr-defined]
            self.originals.clear()
            self.installed = False

    def status(self) -> dict[str, Any]:
        return {
            "installed": self.installed,
            "graphs_with_events": sum(1 for _, g in self.graphs.values() if g.marks),
            "events_per_graph": max((len(g.marks) for _, g in self.graphs.values()), default=0),
            "errors": list(self.errors[-5:]),
        }

    def timed_graphs(self) -> int:
        return sum(1 for _, g in self.graphs.values() if g.marks)

    # -- capture ----------------------------------------------------------------------------
    def _capture_begin(self, graph: Any, *args: Any, **kwargs: Any) -> Any:
        out = self.originals["capture_begin"](graph, *args, **kwargs)
        self.capturing = graph
        try:
            self._wrap_layers(wv.current_forward_layers())  # V1 runners set the forward context before capture
        except Exception as exc:  # never in the way of vLLM's capture
            self.errors.append(f"capture_begin: {type(exc).__name__}: {exc}")
        return out

    def _capture_end(self, graph: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.originals["capture_end"](graph, *args, **kwargs)
        finally:
            self.capturing = None
            self._unwrap_layers()
            entry = self.graphs.get(id(graph))
            if entry is not None and entry[1].marks:
                self.captured_graphs += 1

    def _wrap_layers(self, layers: Any) -> None:
        """While a graph is captured: wrap each attention implementation's calls (once per capture)."""
        if self.wrapped or not isinstance(layers, dict):
            return
        for mixer in mixers.mixer_calls(layers):
            obj, name, calls = mixer.obj, mixer.name, mixer.attrs
            for i, attr in enumerate(calls):
                previous = obj.__dict__.get(attr)
                obj.__dict__[attr] = self._capturing_call(getattr(obj, attr), name, i == 0, i == len(calls) - 1)
                self.wrapped.append((obj, attr, previous))

    def _unwrap_layers(self) -> None:
        for impl, attr, previous in self.wrapped:
            if previous is None:
                impl.__dict__.pop(attr, None)
            else:
                impl.__dict__[attr] = previous
        self.wrapped = []

    def _capturing_call(self, original: Any, name: str, first: bool, last: bool) -> Any:
        """The layer's first call records its entry, its last call its return (two events a layer)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            graph = self.capturing
            if graph is None or not torch.cuda.is_current_stream_capturing():
                return original(*args, **kwargs)
            marks = self._marks_of(graph)
            if first:
                self._record(marks, name, True)
            out = original(*args, **kwargs)
            if last:
                self._record(marks, name, False)
            return out

        call.__vllm_doctor_wrapper__ = True  # type: ignore[attr-defined]
        return call

    def _marks_of(self, graph: Any) -> GraphMarks:
        entry = self.graphs.get(id(graph))
        if entry is None or entry[0] is not graph:
            entry = self.graphs[id(graph)] = (graph, GraphMarks())
        return entry[1]

    def _record(self, marks: GraphMarks, name: str, enter: bool) -> None:
        if self.errors:  # one failure switches capture timing off (the graph is captured without it)
            return
        try:
            event = torch.cuda.Event(enable_timing=True, external=True)
            event.record()
        except Exception as exc:
            self.errors.append(f"record: {type(exc).__name__}: {exc}")
            return
        marks.marks.append((name, enter, event))

    # -- replay -----------------------------------------------------------------------------
    def _replay(self, graph: Any, *args: Any, **kwargs: Any) -> Any:
        entry = self.graphs.get(id(graph))
        if entry is None or not entry[1].marks:
            return self.originals["replay"](graph, *args, **kwargs)
        marks = entry[1]
        prof = self.active
        if marks.unread is not None:  # read the previous sampled replay before this one overwrites it
            t = time.perf_counter()
            end = marks.unread[1]
            if not end.query():
                end.synchronize()
            t1 = time.perf_counter()
            read(marks, block=True)
            if prof is not None:  # the attached session's profiler: its own-time counters
                own = prof.own
                own[GRAPH_WAITS] = own.get(GRAPH_WAITS, 0.0) + t1 - t
                own[GRAPH_READS] = own.get(GRAPH_READS, 0.0) + time.perf_counter() - t1
        step = getattr(prof, "current", None) if prof is not None else None
        if step is None or not getattr(step, "layers_timed", False) or getattr(step, "start", None) is None:
            return self.originals["replay"](graph, *args, **kwargs)
        out = self.originals["replay"](graph, *args, **kwargs)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        marks.unread = (step, end)
        step.graph_reads.append(marks)
        return out


# the process's one: the worker extension installs it, the attached session gives it its profiler
TIMING = GraphTiming()


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
