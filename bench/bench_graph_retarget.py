"""What reading a sampled CUDA-graph replay costs the host, waiting for it or retargeting its
event nodes (engine/graphs.py), on a GPU with torch alone (no vLLM).

    PYTHONPATH=. python3 bench/bench_graph_retarget.py [--layers 32] [--replays 800] [--every 8]

One graph shaped like a decode step's FULL graph: ``--layers`` layers of small bf16 matmuls
(a few ms a replay), two captured events a layer, as the doctor's capture records them. Then the
same loop of ``--replays`` replays, with a little host work between them (as the runner prepares
the next step), in three ways: no step sampled; every ``--every``-th replay sampled and read by
waiting (the next replay waits for the sampled one to finish, then reads its events); and the same
sampled replays recorded into events of their own (the nodes pointed at a fresh set and back,
read later). Printed: the driver call per node, the wall time of each loop (how much the host's
waits cost the device's throughput), and the doctor's own time a replay by part.
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace
from typing import Any

import torch

from vllm_doctor.engine import graphs
from vllm_doctor.engine.profiler import OpenStep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--replays", type=int, default=800)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--host-us", type=float, default=200.0, help="host work between replays (busy loop)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this bench replays CUDA graphs")
    timing = graphs.GraphTiming()
    timing.install()
    x = torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64

    def forward(marks: Any) -> None:
        y = x
        for i in range(args.layers):
            if marks is not None:
                timing._record(marks, f"layers.{i}", True)
            for _ in range(3):
                y = torch.tanh(y @ w)
            if marks is not None:
                timing._record(marks, f"layers.{i}", False)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward(None)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward(timing._marks_of(timing.capturing))
    marks = timing.graphs[id(graph)][1]
    nodes = marks.nodes
    print(f"graph: {len(marks.marks)} events, retargeting {'on' if nodes else 'OFF: ' + str(timing.errors)}")
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": args.layers,
                           "replays": args.replays, "every": args.every, "host_us": args.host_us}  # fmt: skip
    if nodes:
        graph_exec = graph.raw_cuda_graph_exec()
        assert timing.driver is not None
        n = 500
        t = time.perf_counter()
        for _ in range(n):
            timing.driver.point(graph_exec, nodes, marks.captured)
        per_node = (time.perf_counter() - t) / n / len(nodes) * 1e6
        out["point_us_per_node"] = per_node
        print(f"cuGraphExecEventRecordNodeSetEvent: {per_node:.2f} us a node ({per_node * len(nodes):.0f} us a graph)")

    def spin(us: float) -> None:
        end = time.perf_counter() + us / 1e6
        while time.perf_counter() < end:
            pass

    def loop(mode: str) -> dict[str, float]:
        own: dict[str, float] = {}
        prof = SimpleNamespace(current=None, own=own, graph_s=0.0)
        timing.active = prof if mode != "none" else None
        saved = marks.nodes
        if mode == "wait":
            marks.nodes = None
        steps: list[Any] = []
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(args.replays):
            start = None
            if mode != "none" and i % args.every == 0:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                prof.current = OpenStep(i, 0.0, (0,) * 8, start=start, layers_timed=True)
                steps.append(prof.current)
            graph.replay()
            prof.current = None
            spin(args.host_us)
            if len(steps) > 4:  # the profiler resolves sampled steps some steps later
                done = steps.pop(0)
                for item in done.graph_reads:
                    graphs.read(item, block=True)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        for done in steps:
            for item in done.graph_reads:
                graphs.read(item, block=True)
        marks.nodes = saved
        if marks.pointed is not None:  # leave the graph on its captured events
            timing._point(graph, marks, None)
        res = {"wall_ms_per_replay": wall / args.replays * 1e3}
        res.update({f"own_us_per_replay.{k}": v / args.replays * 1e6 for k, v in own.items()})
        return res

    loop("none")  # warm
    for mode in ("none", "wait", "retarget", "none", "wait", "retarget"):
        if mode == "retarget" and not nodes:
            continue
        res = loop(mode)
        out.setdefault(mode, []).append(res)
        print(f"{mode:9} " + "  ".join(f"{k} {v:.1f}" if "own" in k else f"{k} {v:.3f}" for k, v in res.items()))
    timing.uninstall()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
