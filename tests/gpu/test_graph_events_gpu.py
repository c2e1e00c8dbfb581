"""A sampled CUDA-graph replay records into events of its own (engine/graphs.py's retargeting),
on a real GPU with torch's real ``CUDAGraph`` and the CUDA driver: the graph's event record nodes
are found, the next replay of the same graph does not wait for the sampled one, the sampled
replay's times are its own (not overwritten by the replays after it), and what the graph computes
is unchanged. Causal checks only (which event had completed when), no wall-clock thresholds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.gpu.test_engine_gpu import _cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="no CUDA device")]

LAYERS = 4


@pytest.fixture
def captured() -> Any:
    import torch

    from vllm_doctor.engine import graphs

    timing = graphs.GraphTiming()
    assert timing.install()
    try:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(4096, 4096, device="cuda", generator=gen)
        w = torch.randn(4096, 4096, device="cuda", generator=gen) / 64
        out = torch.empty_like(x)

        def forward(marks: Any) -> None:
            y = x
            for i in range(LAYERS):
                if marks is not None:
                    timing._record(marks, f"layers.{i}.attn", True)
                for _ in range(5):  # tens of ms a replay: still running when the host moves on
                    y = torch.tanh(y @ w)
                if marks is not None:
                    timing._record(marks, f"layers.{i}.attn", False)
            out.copy_(y)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(None)  # warm-up before capture, as torch asks
        torch.cuda.current_stream().wait_stream(side)
        forward(None)
        expected = out.clone()
        graph = torch.cuda.CUDAGraph()
        assert graph.__dict__[graphs.KEPT] is False  # made kept by the doctor, instantiated at capture_end
        with torch.cuda.graph(graph):
            forward(timing._marks_of(timing.capturing))
        yield SimpleNamespace(timing=timing, graph=graph, out=out, expected=expected, graphs=graphs, torch=torch)
    finally:
        timing.uninstall()


def test_a_sampled_replay_is_read_from_its_own_events_and_the_next_replay_does_not_wait(captured: Any) -> None:
    from vllm_doctor.engine.profiler import OpenStep

    torch, timing, graph, graphs = captured.torch, captured.timing, captured.graph, captured.graphs
    marks = timing.graphs[id(graph)][1]
    assert len(marks.marks) == 2 * LAYERS and marks.nodes is not None and len(marks.nodes) == 2 * LAYERS
    assert timing.status()["graphs_retargeted"] == 1 and timing.status()["errors"] == []

    own: dict[str, float] = {}
    prof = SimpleNamespace(current=None, own=own, graph_s=0.0)
    timing.active = prof
    graph.replay()  # unsampled, nothing pointed: the captured events
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    prof.current = step = OpenStep(0, 0.0, (0,) * 8, start=start, layers_timed=True)
    graph.replay()  # sampled: the nodes point at a fresh set
    end.record()
    prof.current = None
    graph.replay()  # the next step: points back, and does not wait for the sampled replay
    sampled_done_when_next_launched = end.query()
    graph.replay()
    torch.cuda.synchronize()
    assert not sampled_done_when_next_launched, "the replay after a sampled one waited for it"
    assert set(own) == {graphs.GRAPH_RETARGETS} and marks.unread is None and marks.pointed is None
    assert len(step.graph_reads) == 1 and graphs.read(step.graph_reads[0], block=True)
    seconds = [bound.s for _, _, bound in step.bounds]
    # read by the driver's calls in one loop: the times torch's Event.elapsed_time reads
    assert timing.driver is not None and timing.driver.elapsed_s(start, step.graph_reads[0].handles) is not None
    assert seconds == [start.elapsed_time(e) / 1000.0 for e in step.graph_reads[0].events]
    whole = start.elapsed_time(end) / 1000.0
    # the sampled replay's own times: in order and inside its step (the two replays after it
    # recorded the captured events, later than the step's end)
    assert seconds == sorted(seconds) and 0.0 < seconds[0] and seconds[-1] <= whole
    assert [(name, entered) for name, entered, _ in step.bounds] == [
        (f"layers.{i}.attn", entered) for i in range(LAYERS) for entered in (True, False)
    ]
    spans = [seconds[2 * i + 1] - seconds[2 * i] for i in range(LAYERS)]
    assert all(s > 0 for s in spans) and sum(spans) <= whole
    assert torch.equal(captured.out, captured.expected)  # what the graph computes is unchanged

    # a second sampled replay reuses the first one's events, read and given back
    events = step.graph_reads[0].events
    start2 = torch.cuda.Event(enable_timing=True)
    start2.record()
    prof.current = step2 = OpenStep(1, 0.0, (0,) * 8, start=start2, layers_timed=True)
    graph.replay()
    prof.current = None
    torch.cuda.synchronize()
    assert step2.graph_reads[0].events is events and graphs.read(step2.graph_reads[0], block=True)
    assert all(bound.s > 0 for _, _, bound in step2.bounds)
