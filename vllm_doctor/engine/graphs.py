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
  (:attr:`GraphTiming.active`), a replay of a graph with captured events is noted on the step
  and its events are read when the profiler resolves the step. The next replay of the same graph
  would record the same events again, so the sampled replay records into events of its own:
  before it, the graph's event nodes are pointed at a fresh set (the CUDA driver's
  ``cuGraphExecEventRecordNodeSetEvent``: it changes later launches only, not one already
  queued), and before the graph's next unsampled replay back at the captured ones, two calls a
  node per sampled replay and no wait (:class:`Retarget`; :data:`GRAPH_RETARGETS`). To reach the
  nodes the graph itself is kept after it is instantiated: graphs made while this is installed
  are made with ``keep_graph=True`` and instantiated at ``capture_end`` as before (host memory
  only; vLLM's graphs replay as they did).
- Where the driver's calls are not there (no ``libcuda``, a torch without ``keep_graph``) or one
  fails, the sampled replay's events are read before the graph replays again: the replay waits
  for the sampled one to finish (a host stall of at most one step), or the profiler resolves the
  step first. That read runs inside vLLM's ``execute_model`` (in the replay), so it is the
  doctor's own time in two parts of the session's ``own_s``: the wait (:data:`GRAPH_WAITS`: the
  host blocked, not working; it costs throughput by the gap it leaves on the device before this
  replay, not by its length: on an H100 at every 8th step, 0.71 ms a step of waiting and
  reading, where six paired rounds of the same workload measured -0.56 % throughput;
  bench/README.md) and the reading (:data:`GRAPH_READS`). The step wrapper leaves all of the
  doctor's time in a replay (the profiler's ``graph_s``) out of vLLM's host time.

Nothing here changes what a graph computes: event nodes only record timestamps. Piecewise
graphs capture no attention (vLLM splits them at attention, which runs between the pieces in
Python), so they get no events; their layers are timed at run time by the session's wrappers.

All of it is one object per process, :data:`TIMING` (:class:`GraphTiming`): the wrappers it puts
on, the graphs it saw captured and the profiler it reports to.
"""

from __future__ import annotations

import ctypes
import inspect
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
# pointing a graph's event nodes at a sampled replay's own events and back (the driver's calls)
GRAPH_RETARGETS = "graph_retargets"
# on a graph the doctor made with keep_graph=True: what its maker asked for (False: instantiate at capture_end)
KEPT = "_vllm_doctor_keep_graph"
# event sets made per graph size when a graph's nodes are found: the sampled steps that wait to be
# resolved hold one each (the profiler resolves 32 at a time), so a sampled replay takes one made
# at capture, not 2 x layers new events on the step's path (measured on an H100: ~400 us)
POOL_SETS = 48


@dataclass(frozen=True, slots=True, eq=False)
class Fixed:
    """A time already read: seconds since the step's start mark (graph events read early).
    Hashed by identity, as events are (a sampled step's marks go into a set to be given back)."""

    s: float


@dataclass
class GraphMarks:
    """A captured graph's external events, in the order its replay records them."""

    marks: list[tuple[str, bool, Any]] = field(default_factory=list)  # (attention layer, entered?, event)
    # the last sampled replay not read yet: (step, an event recorded after the replay) (waiting reads)
    unread: tuple[Any, Any] | None = None
    # the graph's event record nodes in the order of ``marks`` (driver handles), once found at
    # capture_end; None: this graph's sampled replays are read by waiting
    nodes: list[Any] | None = None
    captured: list[Any] = field(default_factory=list)  # the captured events' driver handles
    pointed: Pointed | None = None  # the sampled replay the nodes point at now (None: the captured events)


@dataclass(slots=True)
class Pointed:
    """A sampled replay that recorded into events of its own: read once its step has ended."""

    labels: list[tuple[str, bool, Any]]  # the graph's marks: (attention layer, entered?, captured event)
    step: Any
    events: list[Any]
    handles: list[Any]
    owner: Any  # the GraphTiming whose free sets the events go back to once read
    read: bool = False


class Retarget:
    """The CUDA driver's four graph calls that point a graph's event record nodes at other events
    (``libcuda``, loaded by ctypes: handles are the runtime's, ``cudaGraph_t`` is a ``CUgraph``)."""

    EVENT_RECORD = 7  # CU_GRAPH_NODE_TYPE_EVENT_RECORD

    def __init__(self, lib: Any) -> None:
        vp, size = ctypes.c_void_p, ctypes.c_size_t
        self._get_nodes = lib.cuGraphGetNodes
        self._get_nodes.argtypes = [vp, ctypes.POINTER(vp), ctypes.POINTER(size)]
        self._node_type = lib.cuGraphNodeGetType
        self._node_type.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
        self._node_event = lib.cuGraphEventRecordNodeGetEvent
        self._node_event.argtypes = [vp, ctypes.POINTER(vp)]
        self._set_event = lib.cuGraphExecEventRecordNodeSetEvent
        self._set_event.argtypes = [vp, vp, vp]
        for fn in (self._get_nodes, self._node_type, self._node_event, self._set_event):
            fn.restype = ctypes.c_int
        # a sampled replay's events read in one loop of driver calls, where torch's
        # ``Event.elapsed_time`` is a Python method and a device guard around the same call
        # (CUDA 12.8 added the _v2 name; CUDA 13 keeps only that one)
        self._elapsed = getattr(lib, "cuEventElapsedTime_v2", None) or getattr(lib, "cuEventElapsedTime", None)
        if self._elapsed is not None:
            self._elapsed.argtypes = [ctypes.POINTER(ctypes.c_float), vp, vp]
            self._elapsed.restype = ctypes.c_int
        self._ms = ctypes.c_float()
        self._ms_ptr = ctypes.pointer(self._ms)

    @classmethod
    def load(cls) -> Retarget | None:
        """The driver's calls, or None where this process has no CUDA driver with them."""
        try:
            return cls(ctypes.CDLL("libcuda.so.1"))
        except (OSError, AttributeError):
            return None

    def event_nodes(self, raw_graph: int) -> dict[int | None, Any]:
        """The graph's event record nodes by the handle of the event each records."""
        n = ctypes.c_size_t(0)
        _check("cuGraphGetNodes", self._get_nodes(raw_graph, None, ctypes.byref(n)))
        nodes = (ctypes.c_void_p * n.value)()
        _check("cuGraphGetNodes", self._get_nodes(raw_graph, nodes, ctypes.byref(n)))
        kind, event = ctypes.c_int(), ctypes.c_void_p()
        out: dict[int | None, Any] = {}
        for node in nodes[: n.value]:
            _check("cuGraphNodeGetType", self._node_type(node, ctypes.byref(kind)))
            if kind.value == self.EVENT_RECORD:
                _check("cuGraphEventRecordNodeGetEvent", self._node_event(node, ctypes.byref(event)))
                out[event.value] = ctypes.c_void_p(node)
        return out

    def elapsed_s(self, start: Any, handles: list[Any]) -> list[float] | None:
        """Seconds from the event ``start`` (torch's, completed) to each of ``handles`` (driver
        handles of completed events); None where the driver has no such call or one fails (the
        caller reads them through torch)."""
        elapsed = self._elapsed
        if elapsed is None or not start.cuda_event:
            return None
        origin, ms, ptr, out = ctypes.c_void_p(start.cuda_event), self._ms, self._ms_ptr, []
        for handle in handles:
            if elapsed(ptr, origin, handle):
                return None
            out.append(ms.value / 1000.0)
        return out

    def point(self, raw_exec: int, nodes: list[Any], events: list[Any]) -> None:
        """Point the instantiated graph's nodes at ``events`` (driver handles), for its next launches."""
        graph_exec, set_event = ctypes.c_void_p(raw_exec), self._set_event
        for node, event in zip(nodes, events, strict=True):
            rc = set_event(graph_exec, node, event)
            if rc:
                _check("cuGraphExecEventRecordNodeSetEvent", rc)


def _own(prof: Any, part: str, seconds: float) -> None:
    """The doctor's time inside a replay: its part of ``own_s``, and the total the step wrapper
    leaves out of vLLM's host time (``graph_s``)."""
    prof.own[part] = prof.own.get(part, 0.0) + seconds
    prof.graph_s += seconds


def _check(call: str, rc: int) -> None:
    if rc:
        raise RuntimeError(f"{call} returned CUresult {rc}")


def _handle(event: Any) -> Any:
    """An event's driver handle (the event is created by recording it once)."""
    if not event.cuda_event:
        event.record()
    return ctypes.c_void_p(event.cuda_event)


class GraphTiming:
    """This process's timing inside CUDA graphs: the wrappers on ``torch.cuda.CUDAGraph`` (and
    vLLM's forward context), the graphs captured with events, and the profiler they report to."""

    def __init__(self, driver: Retarget | None = None) -> None:
        # the driver's calls that point a graph's event nodes at other events (loaded by install;
        # None: sampled replays are read by waiting)
        self.driver = driver
        # event sets no sampled replay holds, by length: (events, their driver handles)
        self.free: dict[int, list[tuple[list[Any], list[Any]]]] = {}
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
        self.record_failed = False  # an event could not be recorded in a capture: no more are
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
            self._keep_graphs(cls)

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

    def _keep_graphs(self, cls: Any) -> None:
        """Graphs made from now on keep their ``cudaGraph_t`` (``keep_graph=True``), so that their
        event nodes can be found; ``capture_end`` instantiates them as torch would have. Only
        where torch has ``keep_graph`` and the driver's calls are there. torch's graph is a C++
        class whose ``__init__`` takes ``keep_graph`` (its ``__new__`` only passes it on)."""
        if self.driver is None:
            self.driver = Retarget.load()
        new = cls.__dict__.get("__new__")
        try:
            takes = isinstance(new, staticmethod) and "keep_graph" in inspect.signature(new.__func__).parameters
        except (TypeError, ValueError):
            takes = False
        if self.driver is None or not takes or not hasattr(cls, "raw_cuda_graph") or not hasattr(cls, "instantiate"):
            return
        original = cls.__dict__.get("__init__")
        self.originals["__init__"] = original
        init = cls.__init__

        def __init__(graph: Any, keep_graph: bool = False) -> None:
            init(graph, True)
            graph.__dict__[KEPT] = keep_graph  # what the caller asked: capture_end instantiates if False

        cls.__init__ = __init__

    def uninstall(self) -> None:
        """Put vLLM's and torch's methods back (the events already captured stay in their graphs)."""
        with self._lock:
            if not self.installed:
                return
            cls = torch.cuda.CUDAGraph
            for name in ("capture_begin", "capture_end", "replay"):
                setattr(cls, name, self.originals[name])
            if "__init__" in self.originals:
                if self.originals["__init__"] is None:
                    del cls.__init__
                else:
                    cls.__init__ = self.originals["__init__"]  # type: ignore[misc,method-assign]
            for graph, marks in self.graphs.values():  # later replays record the captured events again
                if marks.pointed is not None and marks.nodes is not None:
                    try:
                        self.driver.point(graph.raw_cuda_graph_exec(), marks.nodes, marks.captured)  # type: ignore[union-attr]
                    except Exception as exc:
                        self.errors.append(f"uninstall: {type(exc).__name__}: {exc}")
                    marks.pointed = None
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
            # graphs whose sampled replays record into events of their own (no wait to read them)
            "graphs_retargeted": sum(1 for _, g in self.graphs.values() if g.marks and g.nodes is not None),
            "errors": list(self.errors[-5:]),
        }

    def how_read(self) -> str:
        """How sampled replays are read, for the layers line: from events of their own, or by
        waiting at the graph's next replay (and the last error of graph timing, if any)."""
        timed = [g for _, g in self.graphs.values() if g.marks]
        own = sum(1 for g in timed if g.nodes is not None)
        if own == len(timed):
            out = ", a sampled replay's read from events of its own (no wait)"
        elif own:
            out = f", a sampled replay's read from events of its own in {own}, by waiting in the rest"
        else:
            out = ", a sampled replay's read by waiting for it at the graph's next replay"
        return out + (f" [graph timing: {self.errors[-1]}]" if self.errors else "")

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
            out = self.originals["capture_end"](graph, *args, **kwargs)
        finally:
            self.capturing = None
            self._unwrap_layers()
        kept = getattr(graph, "__dict__", {}).get(KEPT)
        try:
            if kept is False:  # kept by the doctor, not asked by the caller: instantiated now, as torch does
                graph.instantiate()
        except Exception as exc:  # the graph's first replay instantiates it then
            self.errors.append(f"instantiate: {type(exc).__name__}: {exc}")
        entry = self.graphs.get(id(graph))
        if entry is not None and entry[1].marks:
            self.captured_graphs += 1
            if kept is not None:
                self._find_nodes(graph, entry[1])
        return out

    def _find_nodes(self, graph: Any, marks: GraphMarks) -> None:
        """The graph's event record nodes, one per captured event (else its replays are read by waiting)."""
        try:
            assert self.driver is not None
            by_event = self.driver.event_nodes(graph.raw_cuda_graph())
            captured = [_handle(event) for _, _, event in marks.marks]
            nodes = [by_event.get(h.value) for h in captured]
        except Exception as exc:
            self.errors.append(f"event nodes: {type(exc).__name__}: {exc}")
            return
        if None in nodes:
            self.errors.append(f"event nodes: {nodes.count(None)} of {len(nodes)} events have no node in the graph")
            return
        marks.nodes, marks.captured = nodes, captured
        free = self.free.setdefault(len(nodes), [])
        while len(free) < POOL_SETS:  # made now, while vLLM captures, not on a sampled step
            free.append(self._new_set(len(nodes)))

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
        if self.record_failed:  # one failure switches capture timing off (the graph is captured without it)
            return
        try:
            event = torch.cuda.Event(enable_timing=True, external=True)
            event.record()
        except Exception as exc:
            self.record_failed = True
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
                _own(prof, GRAPH_WAITS, t1 - t)
                _own(prof, GRAPH_READS, time.perf_counter() - t1)
        step = getattr(prof, "current", None) if prof is not None else None
        sampled = step is not None and getattr(step, "layers_timed", False) and getattr(step, "start", None) is not None
        pointed = None
        if marks.nodes is not None and (sampled or marks.pointed is not None):
            t = time.perf_counter()
            pointed = self._point(graph, marks, step if sampled else None)
            if prof is not None:
                _own(prof, GRAPH_RETARGETS, time.perf_counter() - t)
        if not sampled or not marks.marks:  # (a failed retarget leaves the graph untimed)
            return self.originals["replay"](graph, *args, **kwargs)
        out = self.originals["replay"](graph, *args, **kwargs)
        assert step is not None
        if pointed is not None:  # read when the step resolves, whenever the graph replays next
            step.graph_reads.append(pointed)
        else:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            marks.unread = (step, end)
            step.graph_reads.append(marks)
        return out

    def _point(self, graph: Any, marks: GraphMarks, step: Any) -> Pointed | None:
        """Point the graph's event nodes at a fresh set for ``step``'s replay (None: back at the
        captured events). After a failure the graph's replays are not timed (its nodes may point
        at events no reader follows); the error is in :meth:`status`."""
        assert self.driver is not None and marks.nodes is not None
        try:
            graph_exec = graph.raw_cuda_graph_exec()
            if step is None:
                self.driver.point(graph_exec, marks.nodes, marks.captured)
                marks.pointed = None
                return None
            free = self.free.setdefault(len(marks.marks), [])
            events, handles = free.pop() if free else self._new_set(len(marks.marks))
            self.driver.point(graph_exec, marks.nodes, handles)
            marks.pointed = Pointed(marks.marks, step, events, handles, self)
            return marks.pointed
        except Exception as exc:  # some nodes may point elsewhere now: this graph is not timed again
            self.errors.append(f"retarget: {type(exc).__name__}: {exc}")
            marks.nodes, marks.pointed, marks.marks = None, None, []
            return None

    @staticmethod
    def _new_set(n: int) -> tuple[list[Any], list[Any]]:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        return events, [_handle(event) for event in events]

    def give_back(self, pointed: Pointed) -> None:
        """A read sampled replay's events are free for another (the graph points back before it replays)."""
        self.free.setdefault(len(pointed.events), []).append((pointed.events, pointed.handles))


# the process's one: the worker extension installs it, the attached session gives it its profiler
TIMING = GraphTiming()


def read(item: GraphMarks | Pointed, block: bool) -> bool:
    """Turn a sampled replay's events into the step's attention bounds (:class:`Fixed` seconds
    since the step's start): a :class:`Pointed` replay's own events (its step has ended), or a
    graph's last sampled replay of the captured events. False if not complete yet and not ``block``."""
    if isinstance(item, Pointed):
        if not item.read:
            driver = item.owner.driver
            seconds = driver.elapsed_s(item.step.start, item.handles) if driver is not None else None
            _bounds(item.step, item.labels, item.events, seconds)
            item.read = True
            item.owner.give_back(item)
        return True
    marks = item
    if marks.unread is None:
        return True
    step, end = marks.unread
    if not end.query():
        if not block:
            return False
        end.synchronize()
    _bounds(step, marks.marks, [event for _, _, event in marks.marks])
    marks.unread = None
    return True


def _bounds(
    step: Any, labels: list[tuple[str, bool, Any]], events: list[Any], seconds: list[float] | None = None
) -> None:
    """Each (layer, entered?) of ``labels`` with its event in ``events`` as the step's attention
    bound: seconds since the step's start event (``seconds``: read already, by the driver)."""
    if seconds is None:
        origin = step.start
        seconds = [origin.elapsed_time(event) / 1000.0 for event in events]
    step.bounds.extend((name, enter, Fixed(s)) for (name, enter, _), s in zip(labels, seconds, strict=True))
