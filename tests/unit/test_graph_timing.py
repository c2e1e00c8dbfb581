"""engine/graphs.py's timing inside CUDA graphs, on CPU: a fake ``CUDAGraph`` class and a fake
forward context stand in for torch's and vLLM's, so the wrappers run as they do in a capture and
a replay (the real capture runs in tests/gpu). Also the one switch that turns it on."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from vllm_doctor import constants
from vllm_doctor.compat import worker as wv
from vllm_doctor.engine import extension, graphs
from vllm_doctor.engine.profiler import OpenStep


class FakeEvent:
    recorded: ClassVar[list[FakeEvent]] = []

    def __init__(self, enable_timing: bool = False, external: bool = False) -> None:
        self.external = external

    def record(self) -> None:
        FakeEvent.recorded.append(self)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return 1.5  # ms


class FakeGraph:
    """torch.cuda.CUDAGraph's three methods the timing wraps, noting each call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def capture_begin(self) -> None:
        self.calls.append("capture_begin")

    def capture_end(self) -> None:
        self.calls.append("capture_end")

    def replay(self) -> str:
        self.calls.append("replay")
        return "replayed"


@dataclass
class FakeForwardContext:
    """Like vLLM's ForwardContext, it has a ``__post_init__`` (a dataclass's ``__init__`` calls one
    only if the class had it when it was made)."""

    no_compile_layers: Any = None

    def __post_init__(self) -> None:
        self.made = True


POST_INIT = FakeForwardContext.__dict__["__post_init__"]


class FakeImpl:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def do_kv_cache_update(self) -> None:
        self.calls.append("kv")

    def forward(self) -> str:
        self.calls.append("forward")
        return "out"


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """torch.cuda's graph and events, and vLLM's forward context, as fakes; one attention layer."""
    impl = FakeImpl()
    layers = {"model.layers.0.self_attn.attn": SimpleNamespace(impl=impl)}
    FakeEvent.recorded = []
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(wv, "forward_context_class", lambda: FakeForwardContext)
    monkeypatch.setattr(wv, "current_forward_layers", lambda: layers)
    methods = {name: FakeGraph.__dict__[name] for name in ("capture_begin", "capture_end", "replay")}
    return SimpleNamespace(impl=impl, layers=layers, methods=methods)


def test_a_capture_records_two_events_per_attention_layer_and_a_sampled_replay_notes_them(
    fake_cuda: SimpleNamespace,
) -> None:
    timing = graphs.GraphTiming()
    assert timing.install() is True and timing.install() is True  # idempotent
    graph = FakeGraph()
    graph.capture_begin()  # the V1 runner's way: the forward context is set before the capture
    assert timing.capturing is graph and len(timing.wrapped) == 2
    assert fake_cuda.impl.do_kv_cache_update() is None and fake_cuda.impl.forward() == "out"
    graph.capture_end()
    assert graph.calls == ["capture_begin", "capture_end"] and fake_cuda.impl.calls == ["kv", "forward"]
    assert timing.capturing is None and timing.wrapped == [] and "forward" not in vars(fake_cuda.impl)
    marks = timing.graphs[id(graph)][1]
    name = "model.layers.0.self_attn.attn"
    assert [(n, entered) for n, entered, _ in marks.marks] == [(name, True), (name, False)]
    assert all(event.external for _, _, event in marks.marks)
    assert timing.captured_graphs == 1 and timing.timed_graphs() == 1
    assert timing.status() == {
        "installed": True, "graphs_with_events": 1, "events_per_graph": 2, "graphs_retargeted": 0, "errors": [],
    }  # fmt: skip

    assert graph.replay() == "replayed" and marks.unread is None  # no doctor attached: nothing noted
    step = OpenStep(0, 0.0, (0, 1, 0, 1, 1, 1, 0, 0), start=FakeEvent(), layers_timed=True)
    timing.active = SimpleNamespace(current=step)
    assert graph.replay() == "replayed"
    assert marks.unread is not None and marks.unread[0] is step and step.graph_reads == [marks]
    assert graph.calls == ["capture_begin", "capture_end", "replay", "replay"]
    # the graph's next replay (an unsampled step) reads the sampled one's events first, and that
    # read is the doctor's own time (the step wrapper leaves it out of vLLM's)
    own = {"wrappers": 0.0}
    timing.active = SimpleNamespace(current=None, own=own, graph_s=0.0)
    assert graph.replay() == "replayed"
    assert marks.unread is None and [(n, entered, t.s) for n, entered, t in step.bounds] == [
        (name, True, 0.0015),
        (name, False, 0.0015),
    ]
    assert own[graphs.GRAPH_READS] > 0.0 and set(own) == {"wrappers", graphs.GRAPH_WAITS, graphs.GRAPH_READS}
    assert graph.replay() == "replayed" and len(step.bounds) == 2  # nothing left to read

    timing.uninstall()
    assert {n: FakeGraph.__dict__[n] for n in fake_cuda.methods} == fake_cuda.methods
    assert not timing.installed and FakeForwardContext.__dict__["__post_init__"] is POST_INIT


def test_a_forward_context_made_during_a_capture_wraps_its_layers(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The V2 runner's way: the forward context is set inside the capture."""
    monkeypatch.setattr(wv, "current_forward_layers", lambda: None)
    timing = graphs.GraphTiming()
    timing.install()
    try:
        FakeForwardContext(fake_cuda.layers)  # outside a capture: nothing wrapped
        assert timing.wrapped == []
        graph = FakeGraph()
        graph.capture_begin()
        assert timing.wrapped == []
        assert FakeForwardContext(fake_cuda.layers).made  # vLLM's own __post_init__ still runs
        assert [attr for _, attr, _ in timing.wrapped] == ["do_kv_cache_update", "forward"]
        fake_cuda.impl.forward()
        graph.capture_end()
        assert [entered for _, entered, _ in timing.graphs[id(graph)][1].marks] == [False]
    finally:
        timing.uninstall()


def test_a_graph_without_events_replays_untouched(fake_cuda: SimpleNamespace) -> None:
    timing = graphs.GraphTiming()
    timing.install()
    try:
        timing.active = SimpleNamespace(current=OpenStep(0, 0.0, (0,) * 8, start=FakeEvent(), layers_timed=True))
        graph = FakeGraph()
        assert graph.replay() == "replayed" and timing.graphs == {} and FakeEvent.recorded == []
    finally:
        timing.uninstall()


@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("1", True),
        ("true", True),
        (" YES ", True),
        ("On", True),
        ("0", False),
        ("no", False),
        ("", False),
        (None, False),
    ],
)
def test_one_switch_parser_for_graph_timing(
    value: str | None, on: bool, monkeypatch: pytest.MonkeyPatch, fake_cuda: SimpleNamespace
) -> None:
    """The worker extension installs the wrappers exactly when the one parser reads the switch as on."""
    if value is None:
        monkeypatch.delenv(constants.GRAPH_TIMING_ENV, raising=False)
    else:
        monkeypatch.setenv(constants.GRAPH_TIMING_ENV, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fresh = graphs.GraphTiming()
    monkeypatch.setattr(graphs, "TIMING", fresh)
    try:
        extension._graph_timing_from_env()
        assert constants.env_switch(constants.GRAPH_TIMING_ENV) is on
        assert fresh.installed is on and fresh.install_from_env() is on
    finally:
        fresh.uninstall()


def test_the_doctor_sets_the_switch_to_a_value_it_reads_as_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(constants.GRAPH_TIMING_ENV, constants.SWITCH_ON)
    assert constants.GRAPH_TIMING_ENV == "VLLM_DOCTOR_GRAPH_TIMING" and constants.env_switch(constants.GRAPH_TIMING_ENV)


def test_a_graph_read_inside_vllms_execute_model_is_the_doctors_time_not_vllms() -> None:
    """The step wrapper times vLLM's ``execute_model``; a replay inside it that reads a sampled
    replay's events adds that read to the doctor's ``graph_reads`` and the wrapper leaves it out of
    the step's host time (real wrappers, session and profiler; the replay's read stands in as the
    call's first 40 ms)."""
    from tests.fixtures.channel_worker import Worker, step
    from vllm_doctor.engine.clock import WallClock
    from vllm_doctor.engine.profiler import ForwardProfiler
    from vllm_doctor.engine.session import session_for

    session = session_for(Worker())
    session.profiler = ForwardProfiler(WallClock(), [])
    session.profiler.own = session.own_s

    def execute_model(scheduler_output: Any) -> None:  # vLLM's call: a graph wait and read, then its own work
        time.sleep(0.04)
        session.own_s[graphs.GRAPH_WAITS] = 0.03
        session.own_s[graphs.GRAPH_READS] = 0.01
        session.profiler.graph_s += 0.04  # type: ignore[union-attr]
        time.sleep(0.01)

    wrapped = session._execute_wrapper(execute_model)
    t = time.perf_counter()
    wrapped(step(True))
    outside = time.perf_counter() - t
    current = session.profiler.current
    host_execute_s = current[3] if isinstance(current, list) else current.host_execute_s
    assert 0.01 <= host_execute_s <= outside - 0.04  # vLLM's part: the call less the doctor's wait and read


class HandleEvent(FakeEvent):
    """A fake event with a driver handle (torch's ``cuda_event``), made when first recorded."""

    made = 0

    def __init__(self, enable_timing: bool = False, external: bool = False) -> None:
        super().__init__(enable_timing, external)
        self.cuda_event = 0

    def record(self) -> None:
        if not self.cuda_event:
            HandleEvent.made += 1
            self.cuda_event = 0x1000 + HandleEvent.made
        super().record()

    def elapsed_time(self, end: FakeEvent) -> float:
        return float(getattr(end, "cuda_event", 0) - 0x1000)  # ms: tells which event was read


class KeptGraph(FakeGraph):
    """torch's CUDAGraph as far as retargeting needs: ``keep_graph``, the raw handles, instantiate."""

    def __new__(cls, keep_graph: bool = False) -> KeptGraph:  # torch's: passes keep_graph on to __init__
        return super().__new__(cls)

    def __init__(self, keep_graph: bool = False) -> None:  # torch's C++ constructor takes it
        super().__init__()
        self.keep_graph = keep_graph

    def instantiate(self) -> None:
        self.calls.append("instantiate")

    def raw_cuda_graph(self) -> int:
        assert self.keep_graph, "raw_cuda_graph needs keep_graph=True"
        return 0xA

    def raw_cuda_graph_exec(self) -> int:
        return 0xE


class RecordingDriver:
    """The four driver calls as plain data: the graph's event nodes, and each pointing noted."""

    def __init__(self) -> None:
        self.nodes: dict[int | None, Any] = {}
        self.points: list[list[int]] = []
        self.reads = 0  # sampled replays read through the driver

    def event_nodes(self, raw_graph: int) -> dict[int | None, Any]:
        assert raw_graph == 0xA
        return dict(self.nodes)

    def point(self, raw_exec: int, nodes: list[Any], events: list[Any]) -> None:
        assert raw_exec == 0xE and len(nodes) == len(events)
        self.points.append([e.value for e in events])

    def elapsed_s(self, start: Any, handles: list[Any]) -> list[float]:
        """Read as HandleEvent.elapsed_time reads (its handle tells which event was read)."""
        self.reads += 1
        return [(h.value - 0x1000) / 1000.0 for h in handles]


def test_a_sampled_replay_records_into_events_of_its_own_and_the_next_replay_does_not_wait(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the driver's calls, a sampled replay points the graph's event nodes at a fresh set,
    the next unsampled replay points them back at the captured events (no wait, nothing read in
    the replay), and the fresh set is read when the profiler resolves the step, then reused."""
    monkeypatch.setattr(torch.cuda, "Event", HandleEvent)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", KeptGraph)
    driver = RecordingDriver()
    timing = graphs.GraphTiming(driver)  # type: ignore[arg-type]
    timing.install()
    try:
        graph = KeptGraph()  # made while installed: kept; the caller asked for no keep_graph
        assert graph.keep_graph is True and graph.__dict__[graphs.KEPT] is False
        graph.capture_begin()
        fake_cuda.impl.do_kv_cache_update()
        fake_cuda.impl.forward()
        marks = timing.graphs[id(graph)][1]
        captured = [e.cuda_event for _, _, e in marks.marks]
        driver.nodes = {h: f"node-{h:x}" for h in captured}
        graph.capture_end()
        assert graph.calls == ["capture_begin", "capture_end", "instantiate"]  # instantiated as torch would
        assert marks.nodes == [f"node-{h:x}" for h in captured] and timing.status()["graphs_retargeted"] == 1

        own: dict[str, float] = {}
        prof = SimpleNamespace(current=None, own=own, graph_s=0.0)
        timing.active = prof
        prof.current = step = OpenStep(0, 0.0, (0, 1, 0, 1, 1, 1, 0, 0), start=HandleEvent(), layers_timed=True)
        step.start.record()
        assert graph.replay() == "replayed"
        fresh = driver.points[-1]
        assert len(driver.points) == 1 and set(fresh).isdisjoint(captured)
        assert marks.unread is None and len(step.graph_reads) == 1 and marks.pointed is step.graph_reads[0]
        prof.current = None  # the next step, not sampled: pointed back, nothing waited for or read
        assert graph.replay() == "replayed"
        assert driver.points[-1] == captured and marks.pointed is None and step.bounds == []
        assert set(own) == {graphs.GRAPH_RETARGETS} and prof.graph_s == own[graphs.GRAPH_RETARGETS] > 0
        assert graph.replay() == "replayed" and len(driver.points) == 2  # nothing to point back

        assert graphs.read(step.graph_reads[0], block=False) is True  # the step resolved: its own events
        name = "model.layers.0.self_attn.attn"
        assert [(n, entered, t.s) for n, entered, t in step.bounds] == [
            (name, True, (fresh[0] - 0x1000) / 1000.0), (name, False, (fresh[1] - 0x1000) / 1000.0),
        ]  # fmt: skip
        assert graphs.read(step.graph_reads[0], block=False) is True and len(step.bounds) == 2  # read once
        assert driver.reads == 1  # through the driver's calls, in one loop

        prof.current = later = OpenStep(1, 0.0, (0, 1, 0, 1, 1, 1, 0, 0), start=HandleEvent(), layers_timed=True)
        later.start.record()
        made = HandleEvent.made
        graph.replay()
        assert driver.points[-1] == fresh and HandleEvent.made == made  # the read set is reused
    finally:
        timing.uninstall()
    assert driver.points[-1] == captured  # uninstall points a graph left on a sampled set back
    assert KeptGraph().__dict__.get(graphs.KEPT) is None and KeptGraph().keep_graph is False


def test_a_failed_retarget_leaves_the_graph_untimed_and_says_why(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "Event", HandleEvent)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", KeptGraph)

    class FailingDriver(RecordingDriver):
        def point(self, raw_exec: int, nodes: list[Any], events: list[Any]) -> None:
            raise RuntimeError("cuGraphExecEventRecordNodeSetEvent returned CUresult 1")

    driver = FailingDriver()
    timing = graphs.GraphTiming(driver)  # type: ignore[arg-type]
    timing.install()
    try:
        graph = KeptGraph()
        graph.capture_begin()
        fake_cuda.impl.forward()
        marks = timing.graphs[id(graph)][1]
        driver.nodes = {e.cuda_event: "node" for _, _, e in marks.marks}
        graph.capture_end()
        assert marks.nodes == ["node"]
        step = OpenStep(0, 0.0, (0,) * 8, start=HandleEvent(), layers_timed=True)
        timing.active = SimpleNamespace(current=step, own={}, graph_s=0.0)
        assert graph.replay() == "replayed"
        assert step.graph_reads == [] and marks.marks == [] and marks.unread is None
        assert timing.status()["errors"] == [
            "retarget: RuntimeError: cuGraphExecEventRecordNodeSetEvent returned CUresult 1"
        ]
        assert graph.calls[-1] == "replay"  # vLLM's replay ran all the same
    finally:
        timing.uninstall()


def test_without_the_driver_graphs_are_made_as_asked_and_read_by_waiting(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "CUDAGraph", KeptGraph)
    monkeypatch.setattr(graphs.Retarget, "load", classmethod(lambda cls: None))
    timing = graphs.GraphTiming()
    timing.install()
    try:
        assert KeptGraph().keep_graph is False and "__init__" not in timing.originals
    finally:
        timing.uninstall()


def test_the_layers_line_says_how_sampled_replays_are_read() -> None:
    timing = graphs.GraphTiming()
    own, waits = graphs.GraphMarks(marks=[("a", True, None)], nodes=["n"]), graphs.GraphMarks(marks=[("a", True, None)])
    timing.graphs = {1: (None, own)}
    assert timing.how_read() == ", a sampled replay's read from events of its own (no wait)"
    timing.graphs[2] = (None, waits)
    assert "of its own in 1, by waiting in the rest" in timing.how_read()
    timing.graphs = {2: (None, waits)}
    timing.errors.append("event nodes: RuntimeError: no driver")
    assert timing.how_read().endswith(
        "by waiting for it at the graph's next replay [graph timing: event nodes: RuntimeError: no driver]"
    )
