"""Chrome / Perfetto trace (``trace.json``) of the engine profile: steps and layers.

Open in https://ui.perfetto.dev or chrome://tracing. One track per worker: steps (host clock),
and under each step its root forward and timed modules (device offsets from the step start:
CUDA events on GPU, wall clock on CPU).
"""

from __future__ import annotations

from typing import Any


def chrome_trace(profile: dict[str, Any], anatomy: dict[str, Any] | None = None) -> dict[str, Any]:
    pid = 1
    rank = profile.get("rank", 0)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"worker {rank}"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "steps"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "forward / layers"}},
    ]
    for s in profile.get("steps") or []:
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
    for step in profile.get("trace") or []:
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
    meta = {"clock": profile.get("clock"), "layers_on": profile.get("layers_on")}
    if anatomy:
        meta["model"] = (anatomy.get("model") or {}).get("class")
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}
