"""Turn the workers' profile, KV and memory facts into the report's ``profiles["engine"]``
and the engine anatomy (``facts["engine"]``). Pure functions over :class:`EngineFacts` (its
workers' records: :mod:`vllm_doctor.facts.anatomy`, ``placement``, ``kv``, ``memory``).
"""

from __future__ import annotations

from itertools import compress
from typing import Any

from vllm_doctor.analysis.roofline import engine_roofline
from vllm_doctor.facts.anatomy import Anatomy, WorkerIdentity
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.kv import KvCache
from vllm_doctor.facts.memory import MemoryFacts
from vllm_doctor.facts.static import is_transformers_backend
from vllm_doctor.facts.steps import StepTable

# "dense": compiled modes' per-layer work after the attention (projections, norms, MLP), engine/profiler.py
KIND_ORDER = ("embedding", "attention", "dense", "mlp", "norm", "logits", "other")


def model_origin(model_class: str | None) -> str:
    if not model_class:
        return "unknown"
    if is_transformers_backend(model_class):
        return "transformers-fallback"
    if model_class.startswith("vllm."):
        return "built-in"
    return "plugin"


def anatomy(facts: EngineFacts) -> dict[str, Any]:
    """Which process holds the front end, engine core, executor and each worker."""
    fe = facts.front_end
    workers: list[dict[str, Any]] = []
    for wf in facts.workers:
        a = wf.anatomy or Anatomy()
        who = a.identity
        workers.append(
            {
                "rank": who.rank,
                "local_rank": who.local_rank,
                "pid": who.pid,
                "ppid": who.ppid,
                "device": who.device,
                "worker_class": who.worker_class,
                "model_runner_class": who.model_runner_class,
                "model_runner_kind": who.model_runner_kind,
                "model_class": who.model_class,
                "model_module_file": who.model_module_file,
                "compile": a.compile.to_wire() if a.compile is not None else None,
                "process_title": who.process_title,
            }
        )
    first: dict[str, Any] = workers[0] if workers else {}
    kv = (facts.workers[0].kv if facts.workers else None) or KvCache()
    core_pids = fe.get("engine_core_pids") or []
    if not core_pids and fe.get("url"):  # a served engine: seen only from its workers
        core_pids = sorted(
            {
                w["pid"] if "EngineCore" in str(w.get("process_title") or "") else w.get("ppid")
                for w in workers
                if w.get("pid") is not None
            }
        )
        fe = {**fe, "engine_core_pids": core_pids}
    executor_pid = core_pids[0] if core_pids else None
    front_holds = [fe.get("llm_class"), fe.get("core_client_class")]
    if fe.get("engine_core_in_process"):
        front_holds.append("engine core (in process)")
    processes: list[dict[str, Any]] = [{"role": "front end", "pid": fe.get("pid"), "holds": front_holds}]
    if not fe.get("engine_core_in_process"):
        for pid in core_pids:
            processes.append(
                {"role": "engine core", "pid": pid, "holds": ["EngineCore", "scheduler", "KV cache manager"]}
            )
    executor = {"backend": fe.get("executor_backend"), "class": fe.get("executor_class"), "pid": executor_pid}
    for w in workers:
        in_core = w.get("pid") in [fe.get("pid"), *core_pids]
        processes.append(
            {
                "role": "worker",
                "pid": w.get("pid"),
                "rank": w.get("rank"),
                "device": w.get("device"),
                "in_process_with": "engine core" if in_core else None,
                "holds": [w.get("worker_class"), w.get("model_runner_class"), w.get("model_class")],
            }
        )
    first_tensor = kv.layers[0] if kv.layers else None
    kv_summary = {
        "layout": kv.layout,
        "num_blocks": kv.num_blocks,
        "block_size": kv.block_size,
        "num_layers": kv.num_tensors,
        "num_storages": kv.num_storages,
        "storage_bytes": kv.storage_bytes,
        "tensor_shape": list(first_tensor.shape) if first_tensor is not None else None,
        "dtype": first_tensor.dtype if first_tensor is not None else None,
        "groups": [{"layers": len(g.layer_names), **g.spec.to_wire()} for g in kv.groups],
    }
    return {
        "front_end": fe,
        "executor": executor,
        "workers": workers,
        "processes": processes,
        "model": {
            "class": first.get("model_class"),
            "origin": model_origin(first.get("model_class")),
            "file": first.get("model_module_file"),
        },
        "model_runner": {"class": first.get("model_runner_class"), "kind": first.get("model_runner_kind")},
        "kv_cache": kv_summary,
        "compile": first.get("compile"),
    }


def _pct(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of sorted values."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def phase_summary(steps: StepTable) -> dict[str, Any]:
    out: dict[str, Any] = {}
    step_s, forward_s, tokens_col = steps["step_s"], steps["forward_s"], steps["total_tokens"]
    prefill_reqs, decode_reqs = steps["prefill_reqs"], steps["decode_reqs"]
    idle_col = _idle_column(steps)
    phases = steps.phases
    for phase in ("prefill", "decode", "mixed"):
        chosen = [p == phase for p in phases]  # one pass per phase; the columns are picked in C
        n = sum(chosen)
        if not n:
            continue
        times = sorted(compress(step_s, chosen))
        fwd = [v for v in compress(forward_s, chosen) if v is not None]
        # the forward's share of the steps it was timed on (samples only: set beside all steps' mean, a
        # sample's heavier instrumentation could make the forward look longer than the step)
        paired = [
            (f, s) for f, s in zip(compress(forward_s, chosen), compress(step_s, chosen), strict=True) if f is not None
        ]
        paired_step = sum(s for _, s in paired)
        idle = [v for v in compress(idle_col, chosen) if v is not None]
        tokens = sum(compress(tokens_col, chosen))
        total = sum(times)
        out[phase] = {
            "steps": n,
            "tokens": tokens,
            "mean_batch": round((sum(compress(prefill_reqs, chosen)) + sum(compress(decode_reqs, chosen))) / n, 2),
            "step_s_mean": total / n,
            "step_s_p50": _pct(times, 0.5),
            "step_s_p90": _pct(times, 0.9),
            "forward_s_mean": sum(fwd) / len(fwd) if fwd else None,
            "forward_share": sum(f for f, _ in paired) / paired_step if paired_step > 0 else None,
            "tokens_per_s": tokens / total if total > 0 else None,
            # the device's idle time before each step of this phase (since the previous step ended)
            "idle_before_s_mean": sum(idle) / len(idle) if idle else None,
        }
    return out


def _idle_column(steps: StepTable) -> list[float | None]:
    """Each step's ``idle_before_s``, None for the table's first step: its idle time began before
    the window the table covers (the engine's start, or the previous collection)."""
    col = list(steps["idle_before_s"])
    if col:
        col[0] = None
    return col


def idle_between_steps(steps: StepTable) -> dict[str, Any] | None:
    """The device's idle time between consecutive steps, on the step clock: from one step's end
    mark to the next one's start mark (CUDA events on the stream the steps run on; on CPU the
    wall clock). Under async scheduling and CUDA graphs the host schedules the next step while the
    device runs this one, and this is near 0; where the device waits for the host (eager mode, a
    launch-bound model, slow scheduling or output processing) it is the time the device stood
    still. None without two timed steps."""
    values = sorted(v for v in _idle_column(steps) if v is not None)
    if not values:
        return None
    return {
        "clock": steps.clock,
        "gaps": len(values),
        "total_s": sum(values),
        "mean_s": sum(values) / len(values),
        "p50_s": _pct(values, 0.5),
        "p90_s": _pct(values, 0.9),
        "max_s": values[-1],
    }


def layer_tables(profile: dict[str, Any], steps: StepTable) -> dict[str, Any]:
    """Per module, per decoder layer and per kind (with "other" = forward not in any kind)."""
    modules = list(profile.get("layers") or [])
    # eager mode times the modules inside the decoder layers on every detail_every-th step timed
    # per layer only: their totals are scaled to all the steps timed per layer (a module's mean
    # per step on its own steps, times the timed steps), so they add up with the layers'
    timed_per_bucket = {"prefill": 0, "decode": 0}
    for phase, on in zip(steps.phases, steps["layers_timed"], strict=True):
        if on:
            timed_per_bucket["decode" if phase == "decode" else "prefill"] += 1
    for m in modules:
        total = 0.0
        for bucket in ("prefill", "decode"):
            seconds, on_steps = m.get(f"{bucket}_s", 0.0), m.get(f"{bucket}_steps")
            all_steps = timed_per_bucket[bucket]
            total += seconds * all_steps / on_steps if on_steps and all_steps > on_steps else seconds
        m["total_s"] = total
        m["calls"] = m.get("prefill_calls", 0) + m.get("decode_calls", 0)
    by_layer: dict[int, dict[str, Any]] = {}
    by_kind: dict[str, float] = {}
    for m in modules:
        kind, layer = m.get("kind"), m.get("layer")
        if kind == "layer" and layer is not None:
            entry = by_layer.setdefault(layer, {"layer": layer, "total_s": 0.0, "kinds": {}})
            entry["total_s"] += m["total_s"]
        elif kind in KIND_ORDER:
            by_kind[kind] = by_kind.get(kind, 0.0) + m["total_s"]
            if layer is not None:
                entry = by_layer.setdefault(layer, {"layer": layer, "total_s": 0.0, "kinds": {}})
                entry["kinds"][kind] = entry["kinds"].get(kind, 0.0) + m["total_s"]
    # layer times exist only for the per-layer samples: compare them with those steps' forwards
    timed = [f for f, on in zip(steps["forward_s"], steps["layers_timed"], strict=True) if on]
    forward_total = sum(float(f) for f in timed if f is not None)
    if modules and forward_total:
        inside = sum(v for k, v in by_kind.items() if k != "logits")
        by_kind["other"] = max(0.0, forward_total - inside)
    # how much of the forward the per-layer timings account for: the decoder layers plus the
    # top-level embedding and final norm (the model's whole forward, minus glue between them)
    covered = sum(
        m["total_s"]
        for m in modules
        if m.get("kind") == "layer" or (m.get("layer") is None and m.get("kind") in ("embedding", "norm"))
    )
    return {
        "timed_fraction": covered / forward_total if modules and forward_total else None,
        "modules": modules,
        "by_layer": [by_layer[k] for k in sorted(by_layer)],
        "by_kind": {k: by_kind[k] for k in KIND_ORDER if k in by_kind},
        "forward_total_s": forward_total,
        "timed_steps": len(timed) if modules else 0,
        "sample_every": profile.get("sample_every"),
    }


def time_accounting(profile: dict[str, Any], workload: dict[str, Any] | None) -> dict[str, Any] | None:
    """Do the step times add up to the workload's wall time? Steps of one engine do not overlap, so
    their sum (on the step clock) cannot exceed the wall time around ``llm.generate``; what is left
    ran outside any step (scheduling, output processing, request handling: the engine's host, or
    a device waiting for it). A sum above the wall time is a wrong clock: a doctor bug."""
    wall = (workload or {}).get("wall_s")
    phases = profile.get("phases") or {}
    if not wall or not phases:
        return None
    total = sum(float(p["steps"]) * float(p["step_s_mean"]) for p in phases.values())
    outside = max(0.0, float(wall) - total)
    idle = profile.get("idle_between_steps") or {}
    between = min(outside, float(idle["total_s"])) if idle.get("total_s") is not None else None
    return {
        "clock": profile.get("clock"),
        "steps_s": total,
        "wall_s": float(wall),
        "share": total / float(wall),
        "outside_steps_s": outside,
        # of that, measured on the step clock between consecutive steps (the device idle), and the
        # rest: before the first step and after the last (requests in, outputs out)
        "between_steps_s": between,
        "between_steps_mean_s": idle.get("mean_s"),
        "edges_s": None if between is None else outside - between,
        "accounted_share": None if between is None else (total + between) / float(wall),
        "above_wall": total > float(wall) * 1.01,
    }


def kv_usage_series(steps: StepTable, num_blocks: int | None) -> list[dict[str, Any]]:
    if not num_blocks:
        return []
    usable = max(1, num_blocks - 1)  # block 0 is vLLM's null block
    return [
        {"t": s["t"], "index": s["index"], "blocks": s["kv_blocks_used"], "usage": s["kv_blocks_used"] / usable}
        for s in steps.rows()
    ]


def memory_breakdown(memory: MemoryFacts, nvml: dict[str, Any] | None = None) -> dict[str, Any]:
    """Weights / peak activations / KV / CUDA graphs / other, and what could not be measured."""
    notes: list[str] = []
    parts: dict[str, int | None] = {}
    weights_params = memory.parameter_bytes + memory.buffer_bytes
    kv = memory.kv_bytes
    cuda = memory.cuda
    if cuda is not None:
        weights = memory.measured("model_memory_usage") or weights_params
        parts["weights"] = weights
        parts["kv_cache"] = kv
        peak = memory.measured("peak_activation_memory")
        observed = max(0, cuda.max_allocated - weights - kv)
        if peak is None:
            notes.append(
                "vLLM skipped its start-up memory profiling (kv_cache_memory_bytes was given): "
                "peak activations are the peak torch allocation seen minus weights and KV"
            )
        parts["peak_activations"] = peak if peak is not None else observed
        graphs = cuda.graph_pool_bytes  # measured: the allocator's private pools
        if graphs is None:
            graphs = memory.measured("cudagraph_memory_estimate") or None  # vLLM's estimate, when it made one
        if memory.compile is not None and memory.compile.cudagraphs:
            parts["cuda_graphs"] = graphs
            if graphs is None:
                notes.append("CUDA-graph pool size not readable here: included in 'other'")
        else:
            parts["cuda_graphs"] = 0
        pid = memory.pid
        nvml_bytes = process_memory(nvml or {}, pid) if pid is not None else None
        if nvml_bytes is not None:
            total, total_source = nvml_bytes, "NVML: memory used by the worker process"
        else:
            total, total_source = cuda.reserved, "torch.cuda.memory_reserved (NVML unavailable)"
            notes.append("NVML unavailable: total is torch's reserved memory (misses the CUDA context and NCCL)")
        known = sum(v for v in parts.values() if v)
        parts["other"] = total - known
        device_used = cuda.device_total - cuda.device_free
        out = {
            "device": memory.device,
            "total": total,
            "total_source": total_source,
            "parts": parts,
            "torch": cuda.to_wire(),
            "device_used": device_used,
            "notes": notes,
            "measurable": True,
        }
    else:
        repacked = memory.repacked_weight_bytes_estimate
        weights_cpu = weights_params + repacked
        parts["weights"] = weights_cpu
        if repacked:
            notes.append(
                f"{memory.repacked_layers} linear layers hold their weights in CPU-repacked "
                "kernels (oneDNN); their bytes are estimated from the layer shapes"
            )
        parts["kv_cache"] = kv
        parts["peak_activations"] = None
        parts["cuda_graphs"] = None
        notes.append(
            "CPU worker: torch keeps no allocator statistics on CPU, so peak activations are not "
            "measurable; they are inside 'other' (with Python, torch and vLLM themselves)"
        )
        notes.append("CUDA graphs do not exist on CPU")
        host = memory.host
        total = host.get("VmRSS", 0)
        parts["other"] = total - weights_cpu - kv if total else None
        out = {
            "device": memory.device,
            "total": total,
            "total_source": "worker process resident memory (VmRSS)",
            "peak_total": host.get("VmHWM"),
            "parts": parts,
            "notes": notes,
            "measurable": False,
        }
    return out


def doctor_overhead(profile: dict[str, Any], steps: StepTable) -> dict[str, Any] | None:
    """The doctor's own host time per step, against the worker's host time of the step.

    Measured inside the doctor's wrappers and hooks (``perf_counter`` around its own code), so
    it is precise where end-to-end throughput comparisons drown in run-to-run noise. Not
    included: PyTorch's cost of calling a hook (about a microsecond per hooked module call).
    """
    own = profile.get("doctor_host_s")
    if not own or not len(steps):
        return None
    n = len(steps) + int(profile.get("dropped_steps") or 0)
    own_step = sum(float(v) for v in own.values()) / n
    host_total = float(sum(filter(None, steps["host_execute_s"])) + sum(filter(None, steps["host_sample_s"])))
    host_step = host_total / len(steps)
    host_step += float(own.get("wrappers", 0.0)) / n  # the wrappers run outside the measured host time
    out: dict[str, Any] = {
        "host_s": {k: float(v) for k, v in own.items()},
        "steps": n,
        "per_step_s": own_step,
        "step_host_s": host_step,
        "share": own_step / host_step if host_step else None,
    }
    rpc, window = profile.get("doctor_rpc_s"), profile.get("window_s")
    if rpc is not None and window:
        # everything the doctor did in the worker over the window (per step, plus the watcher's
        # calls served between steps) against the window's wall time: what it can take from a
        # worker whose loop is the bottleneck (with the GPU the bottleneck, less)
        out["rpc_s"] = float(rpc)
        out["window_s"] = float(window)
        out["worker_share"] = (sum(float(v) for v in own.values()) + float(rpc)) / float(window)
    return out


def summarize(facts: EngineFacts, timeline: bool = True) -> dict[str, Any]:
    """``report.profiles["engine"]``: steps, phases, layers, KV usage, memory (rank 0 first).

    ``timeline=False`` (top's model panel, every few seconds): the summaries only, without the
    per-step records and the KV usage series built from them (``step_count`` says how many).
    """
    if not facts.workers:
        return {"available": False, "reason": facts.startup_error or "no worker replied"}
    primary: WorkerFacts = facts.workers[0]
    profile = primary.get("profile") or {}
    steps = primary.steps()
    kv = primary.kv or KvCache()
    num_blocks = profile.get("num_blocks") or kv.num_blocks
    placement = primary.placement
    out: dict[str, Any] = {
        "available": bool(profile.get("profiling")),
        "rank": primary.rank,
        "device": placement.worker.device if placement is not None and placement.worker is not None else None,
        "clock": profile.get("clock"),
        "layers_on": profile.get("layers_on"),
        "layers_reason": profile.get("layers_reason"),
        "steps": steps.rows() if timeline else [],
        "step_count": len(steps),
        "steps_error": steps.error,
        "dropped_steps": profile.get("dropped_steps", 0),
        "phases": phase_summary(steps),
        "layers": layer_tables(profile, steps),
        "kv_usage": kv_usage_series(steps, num_blocks) if timeline else [],
        "kv_num_blocks": num_blocks,
        "kv_block_size": kv.block_size,
        "trace": profile.get("trace") or [],
        "memory": [
            memory_breakdown(mem, facts.nvml) | {"rank": w.rank}
            for w in facts.workers
            if w.get("memory") and (mem := w.memory) is not None  # an empty reply has nothing to break down
        ],
        "nvml": facts.nvml,
        "crashes": [c | {"rank": w.rank} for w in facts.workers for c in (w.get("profile") or {}).get("crashes", [])],
    }
    out["idle_between_steps"] = idle_between_steps(steps)
    out["doctor_overhead"] = doctor_overhead(profile, steps)
    out["roofline"] = engine_roofline(primary, steps, out["phases"], out["layers"], kv.block_size)
    if len(facts.workers) > 1:
        out["per_rank"] = [rank_summary(w, with_timeline=timeline and w is not primary) for w in facts.workers]
        out["rank_imbalance"] = rank_imbalance(out["per_rank"])
    return out


def rank_summary(w: WorkerFacts, with_timeline: bool = True) -> dict[str, Any]:
    """One rank's own numbers: who it is, its phases, its decoder layers, its KV cache (and its
    steps and per-layer trace for the Perfetto track, except for the primary rank, whose are
    the profile's own)."""
    profile = w.get("profile") or {}
    steps = w.steps()
    placement, anat = w.placement, w.anatomy
    # who the rank is: its placement says (with its parallel ranks), else its anatomy
    ident = (placement.worker if placement is not None else None) or (
        anat.identity if anat is not None else WorkerIdentity()
    )
    kv = w.kv or KvCache()
    layers = layer_tables(dict(profile, layers=[dict(m) for m in profile.get("layers") or []]), steps)
    out: dict[str, Any] = {
        "rank": w.rank,
        "tp_rank": ident.tp_rank,
        "pp_rank": ident.pp_rank,
        "device": ident.device,
        "pid": ident.pid,
        "phases": phase_summary(steps),
        "by_layer": layers["by_layer"],
        "forward_total_s": layers["forward_total_s"],
        "kv_storage_bytes": kv.storage_bytes,
        "kv_num_blocks": profile.get("num_blocks") or kv.num_blocks,
    }
    if with_timeline:
        out["steps"] = steps.rows()
        out["trace"] = profile.get("trace") or []
    return out


def rank_imbalance(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase, the slowest and the fastest rank by mean forward time (host step time where
    the forward was not timed): the slowest rank sets the step of every rank."""
    out: dict[str, Any] = {}
    for phase in ("prefill", "decode", "mixed"):
        values = []
        for r in per_rank:
            ph = (r.get("phases") or {}).get(phase)
            if ph:
                v = ph.get("forward_s_mean") if ph.get("forward_s_mean") is not None else ph.get("step_s_mean")
                if v is not None:
                    values.append((float(v), r["rank"]))
        if len(values) < 2:
            continue
        (slow_s, slow), (fast_s, fast) = max(values), min(values)
        out[phase] = {
            "slowest_rank": slow,
            "slowest_s": slow_s,
            "fastest_rank": fast,
            "fastest_s": fast_s,
            "ratio": slow_s / fast_s if fast_s > 0 else None,
        }
    return out


def process_memory(snap: dict[str, Any], pid: int) -> int | None:
    """GPU memory NVML attributes to ``pid`` across devices, or None if unknown."""
    if not snap.get("available"):
        return None
    total, seen = 0, False
    for dev in snap.get("devices", []):
        for proc in dev.get("processes", []) or []:
            if proc.get("pid") == pid and proc.get("used_memory") is not None:
                total += int(proc["used_memory"])
                seen = True
    return total if seen else None
