"""Chrome / Perfetto trace (``trace.json``) of the engine profile: steps and layers.

Open in https://ui.perfetto.dev or chrome://tracing. One process track per rank: steps (host clock),
and under each step its root forward and timed modules (device offsets from the step start:
CUDA events on GPU, wall clock on CPU).
"""

from __future__ import annotations

from typing import Any

from vllm_doctor.analysis.records import EngineAnatomy, EngineProfile, StepRow, TraceStep

# the step's numbers shown in a step event's arguments
STEP_ARGS = ("num_reqs", "prefill_tokens", "decode_tokens", "kv_blocks_used", "forward_s", "logits_s")


def chrome_trace(prof: EngineProfile, anatomy: EngineAnatomy | None = None) -> dict[str, Any]:
    """One process track per rank (the primary rank's from the profile itself, the others' from
    ``per_rank``): steps, KV blocks in use, and each sampled step's forward and layers."""
    tracks: list[tuple[int | None, str | None, list[StepRow], list[TraceStep]]] = [
        (prof.rank if prof.rank is not None else 0, prof.device, prof.steps, prof.trace)
    ]
    tracks += [(r.rank, r.device, r.steps, r.trace) for r in prof.per_rank if r.steps is not None]
    events: list[dict[str, Any]] = []
    for i, (rank, device, steps, trace) in enumerate(tracks):
        events.extend(_rank_events(i + 1, rank, device, steps, trace))
    meta: dict[str, Any] = {"clock": prof.clock, "layers_on": prof.layers_on, "ranks": [t[0] for t in tracks]}
    if anatomy is not None:
        meta["model"] = anatomy.model.class_name
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def _rank_events(
    pid: int, rank: int | None, device: str | None, steps: list[StepRow], trace: list[TraceStep]
) -> list[dict[str, Any]]:
    where = f" ({device})" if device else ""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {rank}{where}"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "steps"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "forward / layers"}},
    ]
    for s in steps:
        ts = (s.t or 0.0) * 1e6
        events.append(
            {
                "name": f"step {s.index} {s.phase}",
                "cat": s.phase,
                "ph": "X",
                "pid": pid,
                "tid": 1,
                "ts": ts,
                "dur": s.step_s * 1e6,
                "args": {k: getattr(s, k) for k in STEP_ARGS},
            }
        )
        events.append({"name": "kv_blocks_used", "ph": "C", "pid": pid, "ts": ts, "args": {"blocks": s.kv_blocks_used}})
    for step in trace:
        base = step.t * 1e6
        for f in step.forward:
            events.append(
                {
                    "name": "forward",
                    "cat": "forward",
                    "ph": "X",
                    "pid": pid,
                    "tid": 2,
                    "ts": base + f.offset_s * 1e6,
                    "dur": f.dur_s * 1e6,
                }
            )
        for layer in step.layers:
            events.append(
                {
                    "name": layer.name or "model",
                    "cat": "layer",
                    "ph": "X",
                    "pid": pid,
                    "tid": 2,
                    "ts": base + layer.offset_s * 1e6,
                    "dur": layer.dur_s * 1e6,
                }
            )
    return events
