"""Chrome / Perfetto trace (``trace.json``) of the engine profile: steps and layers.

Open in https://ui.perfetto.dev or chrome://tracing. One process track per rank: steps (host clock),
and under each step its root forward and timed modules (device offsets from the step start:
CUDA events on GPU, wall clock on CPU).
"""

from __future__ import annotations

from typing import Any


def chrome_trace(profile: dict[str, Any], anatomy: dict[str, Any] | None = None) -> dict[str, Any]:
    """One process track per rank (the primary rank's from the profile itself, the others' from
    ``per_rank``): steps, KV blocks in use, and each sampled step's forward and layers."""
    tracks = [(profile.get("rank", 0), profile)]
    tracks += [(r.get("rank"), r) for r in profile.get("per_rank") or [] if "steps" in r]
    events: list[dict[str, Any]] = []
    for i, (rank, data) in enumerate(tracks):
        events.extend(_rank_events(i + 1, rank, data))
    meta = {"clock": profile.get("clock"), "layers_on": profile.get("layers_on"), "ranks": [r for r, _ in tracks]}
    if anatomy:
        meta["model"] = (anatomy.get("model") or {}).get("class")
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def _rank_events(pid: int, rank: Any, data: dict[str, Any]) -> list[dict[str, Any]]:
    where = f" ({data['device']})" if data.get("device") else ""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {rank}{where}"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "steps"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "forward / layers"}},
    ]
    for s in data.get("steps") or []:
        events.append(
            {
                "name": f"step {s['index']} {s['phase']}",
                "cat": s["phase"],
                "ph": "X",
                "pid": pid,
                "tid": 1,
                "ts": s["t"] * 1e6,
                "dur": s["step_s"] * 1e6,
                "args": {
                    k: s.get(k)
                    for k in ("num_reqs", "prefill_tokens", "decode_tokens", "kv_blocks_used", "forward_s", "logits_s")
                },
            }
        )
        events.append(
            {
                "name": "kv_blocks_used",
                "ph": "C",
                "pid": pid,
                "ts": s["t"] * 1e6,
                "args": {"blocks": s.get("kv_blocks_used", 0)},
            }
        )
    for step in data.get("trace") or []:
        base = step["t"] * 1e6
        for f in step.get("forward") or []:
            events.append(
                {
                    "name": "forward",
                    "cat": "forward",
                    "ph": "X",
                    "pid": pid,
                    "tid": 2,
                    "ts": base + f["offset_s"] * 1e6,
                    "dur": f["dur_s"] * 1e6,
                }
            )
        for layer in step.get("layers") or []:
            events.append(
                {
                    "name": layer["name"] or "model",
                    "cat": "layer",
                    "ph": "X",
                    "pid": pid,
                    "tid": 2,
                    "ts": base + layer["offset_s"] * 1e6,
                    "dur": layer["dur_s"] * 1e6,
                }
            )
    return events
