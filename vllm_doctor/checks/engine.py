"""VD4xx / VD5xx / VD208: what the running engine's workers say about the model.

Stage ENGINE: these read an :class:`EngineFacts` snapshot gathered through the doctor's worker
extension (``vllm-doctor check DIR --engine`` or ``vllm_doctor.attach(llm)``). A worker-side
probe that failed becomes a ``crash`` finding of every check that needed it; the engine kept
serving. VD501 and VD208 also read vLLM's own error when the engine could not start.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable
from typing import Any

from vllm_doctor.analysis.engine import memory_breakdown
from vllm_doctor.checks.base import Emit, check, gate
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.memory import MemoryFacts
from vllm_doctor.model import Finding, Outcome, Severity, Stage
from vllm_doctor.units import fmt_bytes

MAX_FINDINGS_PER_WORKER = 10
NEEDS_ENGINE = "engine stage: run `vllm-doctor check MODEL --engine`, or vllm_doctor.attach(llm) in your script"
_TO_SERVE = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \(([\d.]+) GiB\)"
)
_ESTIMATED = re.compile(r"estimated maximum model length is (\d+)")
_DUPLICATE = re.compile(r"Duplicate layer name: ([^\s]+)")


def _subject(w: WorkerFacts, dev: str | None = None) -> str:
    return f"rank {w.rank}" + (f" / {dev}" if dev else "")


def _crash(emit: Emit, w: WorkerFacts, part: str, error: dict[str, Any]) -> Finding:
    return Finding(
        code=emit.meta.code,
        outcome=Outcome.CRASH,
        severity=Severity.ERROR,
        message=f"the worker-side probe for {part!r} failed: {error.get('type')}: {error.get('message')}",
        subject=_subject(w),
        evidence={"traceback": error.get("traceback", "")},
        hint=(
            "the engine kept serving; this is a vllm-doctor bug or an incompatibility with this vLLM: please report it"
        ),
    )


@gate("engine-facts")
def _engine_facts(facts: Any, emit: Emit) -> Finding | None:
    """The facts come from an engine (``check --engine`` or ``attach``), started or not."""
    return None if isinstance(facts, EngineFacts) else emit.skip(NEEDS_ENGINE)


@gate("engine")
def _engine_started(facts: Any, emit: Emit) -> Finding | None:
    """As ``engine-facts``, and the engine started and its workers answered."""
    instead = _engine_facts(facts, emit)
    if instead is not None or facts.started:
        return instead
    if facts.runtime_error:
        return emit.skip(f"the engine started, then the workload failed: {facts.runtime_error.splitlines()[0][:300]}")
    return emit.skip(f"the engine did not start: {(facts.startup_error or 'no worker replied').splitlines()[0][:300]}")


def _workers(
    facts: EngineFacts, emit: Emit, part: str
) -> tuple[list[tuple[WorkerFacts, dict[str, Any]]], list[Finding]]:
    """Each worker's ``part``, and a crash finding for each worker whose probe of it failed."""
    pairs, crashes = [], []
    for w in facts.workers:
        if part in w.errors:
            crashes.append(_crash(emit, w, part, w.errors[part]))
        elif w.get(part) is not None:
            pairs.append((w, w.parts[part]))
    return pairs, crashes


def _capped(findings: list[Finding], emit: Emit, w: WorkerFacts, what: str, total: int) -> Iterable[Finding]:
    yield from findings[:MAX_FINDINGS_PER_WORKER]
    if total > MAX_FINDINGS_PER_WORKER:
        yield emit.warn(f"... and {total - MAX_FINDINGS_PER_WORKER} more {what} (see the JSON report)", _subject(w))


@check(
    "VD400",
    "doctor-probe-crashed",
    "A doctor hook inside a worker raised; it switched itself off and the engine kept serving.",
    severity=Severity.WARN,
    stage=Stage.ENGINE,
    topic="doctor",
    what=(
        "The doctor's forward profiler and probe run as hooks inside vLLM's workers. Each one runs under a guard: if "
        "it raises, the guard records the error, switches that piece off and returns, so vLLM's own forward goes on "
        "untouched."
    ),
    why=(
        "Part of the profile is missing (per-step or per-layer timings, or the VD403/VD404 probe) and the cause is in "
        "the doctor, not in your model."
    ),
    example="crash in component 'layers' at step 12: AttributeError: ...",
    fix=(
        "Report it with the traceback (vllm-doctor and vLLM versions are in the report); meanwhile attach with "
        "layers=False or probe=False."
    ),
    requires=("engine",),
)
def doctor_probe_crashed(facts: Any, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = _workers(facts, emit, "profile")
    yield from crashes
    found = bool(crashes)
    for w, profile in pairs:
        for c in profile.get("crashes", []):
            found = True
            yield Finding(
                code=emit.meta.code,
                outcome=Outcome.CRASH,
                severity=Severity.WARN,
                message=(
                    f"the doctor's {c.get('component')!r} hook raised at step {c.get('step')}: {c.get('type')}: "
                    f"{c.get('message')}; it was switched off"
                ),
                subject=_subject(w),
                evidence={"traceback": c.get("traceback", ""), "component": c.get("component")},
                hint="the engine kept serving and its outputs are unaffected; please report this traceback",
            )
    if not found:
        yield emit.ok("no doctor hook raised")


@check(
    "VD401",
    "tensor-off-worker-device",
    "A parameter or buffer is not on the worker's device.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="placement",
    what=(
        "Lists every parameter and buffer of the loaded model whose device differs from the worker's (`cuda:N` on a "
        "GPU worker, `cpu` on a CPU worker)."
    ),
    why=(
        "vLLM builds the model under `with torch.device(worker device)`; a tensor pinned elsewhere (an explicit "
        "`device='cpu'`, `torch.from_numpy`, a buffer built on `meta` and never materialised) either crashes the "
        "first forward with `Expected all tensors to be on the same device`, or silently copies host->device every "
        "step."
    ),
    example="self.register_buffer('inv_freq', torch.from_numpy(freqs))  # stays on the CPU of a cuda:0 worker",
    fix=(
        "Create tensors without an explicit device inside `__init__` (vLLM's device context places them), or move "
        "them in `process_weights_after_loading`; never build them from numpy at forward time."
    ),
    references=("vllm-project/vllm#42322", "vllm-project/vllm#3482"),
    requires=("engine",),
)
def tensor_off_worker_device(facts: Any, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = _workers(facts, emit, "placement")
    yield from crashes
    for w, p in pairs:
        dev = (p.get("device") or {}).get("device")
        counts = p.get("counts") or {}
        if p.get("model") is None:
            yield emit.skip("the worker has no model loaded", _subject(w, dev))
            continue
        misplaced = p.get("misplaced") or []
        if not misplaced:
            yield emit.ok(
                f"all {counts.get('parameters', 0)} parameters and {counts.get('buffers', 0)} buffers are on {dev}",
                _subject(w, dev),
            )
            continue
        findings = [
            emit.fail(
                f"{t['kind']} {t['name']} is on {t['device']}, but rank {w.rank} runs on {dev}",
                f"{_subject(w, dev)} / {t['name']}",
                {
                    "expected": dev,
                    "actual": t["device"],
                    "dtype": t["dtype"],
                    "shape": t["shape"],
                    "bytes": t["bytes"],
                    "module_class": t["module_class"],
                    "rank": w.rank,
                },
                "create it without an explicit device in __init__ (vLLM's device context places it) "
                + (
                    "or call .to(device) / materialise it in process_weights_after_loading"
                    if t["device"] == "meta"
                    else "or move it in process_weights_after_loading"
                ),
            )
            for t in misplaced
        ]
        yield from _capped(findings, emit, w, "misplaced tensors", int(counts.get("misplaced", len(misplaced))))


@check(
    "VD402",
    "worker-device-mismatch",
    "A worker's device does not match its rank / CUDA_VISIBLE_DEVICES, or two ranks share one GPU.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="placement",
    what=(
        "Compares each GPU worker's device with its local rank, torch's current device and CUDA_VISIBLE_DEVICES, and "
        "looks for two ranks on one physical GPU (same UUID)."
    ),
    why=(
        "Two ranks on one GPU halve its memory and serialise its kernels; a current device that differs from the "
        "worker's device sends unqualified allocations (`torch.empty(..., device='cuda')`) to another GPU."
    ),
    example="CUDA_VISIBLE_DEVICES=0,0 vllm serve ... --tensor-parallel-size 2",
    fix=(
        "Give each rank its own GPU (CUDA_VISIBLE_DEVICES lists distinct ids, at least tensor_parallel_size of them) "
        "and allocate with `device=x.device`, not a bare 'cuda'."
    ),
    requires=("engine",),
)
def worker_device_mismatch(facts: Any, emit: Emit) -> Iterable[Finding]:
    by_gpu: dict[tuple[Any, Any], list[int | None]] = {}
    pairs, crashes = _workers(facts, emit, "placement")
    yield from crashes
    for w, p in pairs:
        d = p.get("device") or {}
        dev = d.get("device")
        if d.get("type") != "cuda":
            yield emit.not_applicable(
                f"rank {w.rank} runs on {dev}: device-per-rank applies to GPU workers only", _subject(w, dev)
            )
            continue
        problems = []
        local_rank, index = d.get("local_rank"), d.get("index")
        if local_rank is not None and index is not None and local_rank != index:
            problems.append(f"its device index {index} differs from its local rank {local_rank}")
        if d.get("device_count") is not None and index is not None and index >= d["device_count"]:
            problems.append(f"device index {index} but only {d['device_count']} GPU(s) are visible")
        if d.get("current_device") is not None and index is not None and d["current_device"] != index:
            problems.append(f"torch.cuda.current_device() is {d['current_device']}, not {index}")
        key = (d.get("hostname"), d.get("uuid") or d.get("pci_bus_id") or f"{d.get('cuda_visible_devices')}#{index}")
        by_gpu.setdefault(key, []).append(w.rank)
        evidence = {
            k: d.get(k)
            for k in (
                "device",
                "local_rank",
                "rank",
                "current_device",
                "device_count",
                "cuda_visible_devices",
                "uuid",
                "pci_bus_id",
            )
        }
        if problems:
            yield emit.fail(
                f"rank {w.rank}: " + "; ".join(problems),
                _subject(w, dev),
                evidence,
                "let vLLM pick the device (cuda:<local_rank>) and list distinct GPUs in CUDA_VISIBLE_DEVICES",
            )
        else:
            yield emit.ok(
                f"rank {w.rank} (local rank {local_rank}) runs on {dev} ({d.get('name')})", _subject(w, dev), evidence
            )
    for (host, gpu), ranks in by_gpu.items():
        if len(ranks) > 1:
            yield emit.fail(
                f"ranks {ranks} share one GPU ({gpu}) on {host}",
                f"GPU {gpu}",
                {"ranks": ranks, "gpu": gpu, "host": host},
                "give each rank its own GPU: CUDA_VISIBLE_DEVICES must list distinct devices",
            )
    if not pairs:
        yield emit.skip("no worker reported its device")


def _probe_events(
    facts: EngineFacts, emit: Emit, kinds: set[str]
) -> tuple[list[tuple[WorkerFacts, str, dict[str, Any] | None]], list[Finding]]:
    """(worker, device, event or None when the worker's probe saw none of ``kinds``), and the
    findings for workers whose probe crashed or saw no step."""
    pairs, findings = _workers(facts, emit, "profile")
    items: list[tuple[WorkerFacts, str, dict[str, Any] | None]] = []
    for w, profile in pairs:
        probe = profile.get("probe") or {}
        dev = probe.get("worker_device") or ""
        if not probe.get("steps") and not probe.get("events"):  # judge what was probed, even if incomplete
            findings.append(
                emit.skip(
                    probe.get("reason")
                    or f"the forward probe saw no step yet (waiting for {probe.get('waiting_for')})",
                    _subject(w),
                )
            )
            continue
        events = [e for e in probe.get("events", []) if e.get("kind") in kinds]
        items += [(w, dev, e) for e in events] or [(w, dev, None)]
    return items, findings


def _probe_steps(w: WorkerFacts) -> list[Any]:
    return list(((w.get("profile") or {}).get("probe") or {}).get("steps", []))


@check(
    "VD403",
    "forward-wrong-device",
    "The forward pass creates tensors on another device than the worker's, or copies across devices every step.",
    severity=Severity.WARN,
    stage=Stage.ENGINE,
    topic="probe",
    what=(
        "During one prefill and one decode step, a torch dispatch mode records every op whose output lands on another "
        "device than the worker's (a factory with an explicit device, `torch.tensor(...)` on a GPU worker) and every "
        "copy between devices; forward pre-hooks name the module."
    ),
    why=(
        "A host->device copy per layer per step stalls the GPU and is invisible in a loss curve; under CUDA graphs a "
        "CPU tensor created at forward time is frozen into the graph."
    ),
    example="mask = torch.tensor(pattern).to(x.device)   # in forward: a host tensor + an H2D copy every step",
    fix=(
        "Build such tensors once in `__init__` as buffers (vLLM places them on the worker's device), or create them "
        "with `device=x.device`."
    ),
    requires=("engine",),
)
def forward_wrong_device(facts: Any, emit: Emit) -> Iterable[Finding]:
    items, findings = _probe_events(facts, emit, {"wrong_device_create", "cross_device_copy", "wrong_device_compute"})
    yield from findings
    for w, dev, e in items:
        if e is None:
            steps = _probe_steps(w)
            yield emit.ok(f"no op in {len(steps)} probed step(s) left {dev}", _subject(w, dev), {"probed_steps": steps})
            continue
        what = {
            "wrong_device_create": f"creates a tensor on {e.get('device')}",
            "cross_device_copy": f"copies a tensor from {e.get('from')} to {e.get('device')}",
            "wrong_device_compute": f"computes on {e.get('device')}",
        }[e["kind"]]
        where = (e.get("where") or [""])[-1]
        builtin = bool(e.get("vllm_builtin"))
        yield emit.warn(
            (
                f"{e['module']} ({e['module_class']}) {what} ({e['op']}, {e['count']}x in the probed steps); the "
                f"worker runs on {dev}"
            )
            + (" [inside vLLM's own layer]" if builtin else ""),
            e["module"],
            {**e, "worker_device": dev, "rank": w.rank},
            f"at {where}: build it once in __init__ (a buffer) or create it with device=x.device"
            if where
            else "build it once in __init__ (a buffer) or create it with device=x.device",
            severity=Severity.INFO if builtin else None,
        )


@check(
    "VD404",
    "host-sync-in-forward",
    (
        "The forward pass reads tensor values on the host (`.item()`, `.cpu()`, `.tolist()`) or has data-dependent "
        "shapes (`nonzero`)."
    ),
    severity=Severity.WARN,
    stage=Stage.ENGINE,
    topic="probe",
    what=(
        "During one prefill and one decode step, a torch function mode records host reads (`.item()`, `.tolist()`, "
        "`.cpu()`, `.numpy()`, `bool(t)`, `int(t)`) and a dispatch mode records ops whose output shape depends on "
        "values (`nonzero`, `masked_select`, `unique`, boolean-mask indexing); forward pre-hooks name the module."
    ),
    why=(
        "On a GPU each one waits for all queued kernels (a host sync), and each one breaks torch.compile graphs and "
        "CUDA-graph capture, so vLLM falls back to slower paths or fails to capture."
    ),
    example="if (positions > limit).any().item(): ...   # in forward",
    fix=(
        "Keep control flow on the host side of the step (vLLM's attention metadata carries lengths), use masks "
        "instead of `nonzero`, or precompute in `__init__`."
    ),
    references=("vllm-project/vllm#11587", "vllm-project/vllm#10445", "vllm-project/vllm#48053"),
    requires=("engine",),
)
def host_sync_in_forward(facts: Any, emit: Emit) -> Iterable[Finding]:
    items, findings = _probe_events(facts, emit, {"host_sync", "data_dependent"})
    yield from findings
    for w, dev, e in items:
        if e is None:
            steps = _probe_steps(w)
            yield emit.ok(
                f"no host read or data-dependent shape in {len(steps)} probed step(s)",
                _subject(w, dev),
                {"probed_steps": steps},
            )
            continue
        what = "reads a tensor value on the host" if e["kind"] == "host_sync" else "has a data-dependent output shape"
        on_cpu = dev.startswith("cpu")
        builtin = bool(e.get("vllm_builtin"))
        note = (
            " (a no-op on this CPU worker; on a GPU worker it waits for the GPU and breaks CUDA-graph capture)"
            if on_cpu
            else ""
        )
        where = (e.get("where") or [""])[-1]
        yield emit.warn(
            f"{e['module']} ({e['module_class']}) {what}: {e['op']}, {e['count']}x in the probed steps{note}"
            + (" [inside vLLM's own layer]" if builtin else ""),
            e["module"],
            {**e, "worker_device": dev, "rank": w.rank},
            (f"at {where}: " if where else "")
            + "keep values on the device (masks, torch.where) or move the decision out of forward",
            severity=Severity.INFO if builtin else None,
        )


@check(
    "VD405",
    "parameter-dtype-differs",
    "A parameter's dtype differs from the model dtype (info: fine if deliberate); any float64 tensor (warn).",
    severity=Severity.INFO,
    stage=Stage.ENGINE,
    topic="placement",
    what=(
        "Lists floating-point parameters whose dtype is not the engine's model dtype (fp8 and integer quantized "
        "weights are not listed), and warns on every float64 parameter or buffer, on any device."
    ),
    why=(
        "A float32 parameter in a bfloat16 model upcasts every op that touches it (slower, more memory) or fails in a "
        "fused kernel that expects one dtype; often it is a `torch.ones(...)` created with an explicit dtype."
    ),
    example="self.scale = nn.Parameter(torch.ones(1, dtype=torch.float32))   # model runs in bfloat16",
    fix=(
        "Create it with `params_dtype` / `torch.get_default_dtype()` (vLLM sets the default dtype while building the "
        "model), or keep it float32 on purpose and ignore VD405."
    ),
    requires=("engine",),
)
def parameter_dtype_differs(facts: Any, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = _workers(facts, emit, "placement")
    yield from crashes
    for w, p in pairs:
        model_dtype = p.get("model_dtype")
        for t in p.get("float64") or []:
            yield emit.warn(
                f"{t['kind']} {t['name']} is float64 (on {t['device']}): numpy's default dtype, never what a GPU "
                "kernel wants",
                t["name"],
                {
                    "expected": model_dtype,
                    "actual": "torch.float64",
                    "shape": t["shape"],
                    "kind": t["kind"],
                    "module_class": t["module_class"],
                },
                "make it in the model dtype (torch.from_numpy(a).to(torch.get_default_dtype()), or torch.tensor "
                "without dtype) and register it in __init__ so vLLM places it",
                severity=Severity.WARN,
            )
        mismatched = [t for t in p.get("dtype_mismatch") or [] if t.get("dtype") != "torch.float64"]
        if not mismatched:
            if not p.get("float64"):
                yield emit.ok(f"every floating-point parameter is {model_dtype}", _subject(w))
            continue
        findings = [
            emit.warn(
                f"parameter {t['name']} is {t['dtype']}, the model runs in {model_dtype}",
                t["name"],
                {"expected": model_dtype, "actual": t["dtype"], "shape": t["shape"], "module_class": t["module_class"]},
                (
                    "create it with the default dtype (vLLM sets it while building the model), or ignore VD405 if "
                    "deliberate"
                ),
            )
            for t in mismatched
        ]
        yield from _capped(
            findings,
            emit,
            w,
            "parameters with another dtype",
            int((p.get("counts") or {}).get("dtype_mismatch", len(mismatched))),
        )


def _ranks(w: WorkerFacts, p: dict[str, Any]) -> tuple[int, int]:
    """(pipeline rank, tensor rank) of a worker (rank 0 of each when vLLM did not say)."""
    ident = p.get("worker") or {}
    tp_rank, pp_rank = ident.get("tp_rank"), ident.get("pp_rank")
    return int(pp_rank or 0), int(tp_rank if tp_rank is not None else (w.rank or 0))


def rank_shard_problems(
    shards_by_rank: dict[int, dict[str, dict[str, Any]]], reference: dict[str, list[int]] | None, tp_size: int
) -> list[dict[str, Any]]:
    """Problems of one pipeline stage's tensor-parallel ranks: ``{"rank", "name", "problem", ...}``.

    - a shape that differs between ranks (the ranks do not hold the same model);
    - a shape that does not fit the parameter built at tensor-parallel size 1: a split parameter
      must be 1/tp of it on its split dimension (rounded up, vocabularies padded), a replicated
      one equal to it: a weight_loader that replaced the parameter with the whole tensor, or a
      model that splits by hand, shows here;
    - a split parameter with the same values on two ranks: its weight_loader loads the same
      shard on every rank (it does not narrow by the tensor-parallel rank).
    """
    problems: list[dict[str, Any]] = []
    ranks = sorted(shards_by_rank)
    names = sorted({n for r in ranks for n in shards_by_rank[r]})
    for name in names:
        entries = {r: shards_by_rank[r].get(name) for r in ranks}
        missing = [r for r, e in entries.items() if e is None]
        # a weight vLLM's CPU backend packed into its GEMM kernel is empty here: nothing to compare
        present = {r: e for r, e in entries.items() if e is not None and not e.get("repacked")}
        for r in missing:
            problems.append({"rank": r, "name": name, "problem": "missing on this rank (other ranks have it)"})
        if not present:
            continue
        shapes = {r: tuple(e["shape"]) for r, e in present.items()}
        first = ranks[0] if ranks[0] in shapes else next(iter(shapes))
        for r, shape in shapes.items():
            if shape != shapes[first]:
                problems.append(
                    {
                        "rank": r,
                        "name": name,
                        "problem": f"shape {list(shape)} on this rank, {list(shapes[first])} on rank {first}",
                        "shape": list(shape),
                    }
                )
        ref = (reference or {}).get(name)
        if ref is not None:
            for r, e in present.items():
                expected = _expected_shard(ref, e.get("dim"), tp_size)
                if expected is not None and not _fits(list(e["shape"]), expected, e.get("dim"), tp_size):
                    split = f"split on dim {e['dim']}" if e.get("dim") is not None else "replicated"
                    problems.append(
                        {
                            "rank": r,
                            "name": name,
                            "problem": f"shape {e['shape']} on this rank; {split} over {tp_size} rank(s) the "
                            f"parameter built at tensor-parallel size 1 ({ref}) gives {expected}",
                            "shape": e["shape"],
                            "expected": expected,
                        }
                    )
        prints: dict[tuple[float, ...], int] = {}
        for r, e in present.items():
            fp = e.get("fingerprint")
            if e.get("dim") is None or not fp:
                continue
            key = tuple(round(x, 6) for x in fp)
            if key in prints:
                problems.append(
                    {
                        "rank": r,
                        "name": name,
                        "problem": f"the same values as on rank {prints[key]}, but vLLM splits it over the ranks "
                        f"(dim {e['dim']}): its weight_loader loads the same shard on every rank",
                        "same_as_rank": prints[key],
                    }
                )
            else:
                prints[key] = r
    return problems


def _expected_shard(ref: list[int], dim: int | None, tp_size: int) -> list[int] | None:
    if dim is None or tp_size <= 1:
        return list(ref)
    if not 0 <= dim < len(ref):
        return None
    out = list(ref)
    out[dim] = -(-ref[dim] // tp_size)
    return out


def _fits(shape: list[int], expected: list[int], dim: int | None, tp_size: int) -> bool:
    if len(shape) != len(expected):
        return False
    for i, (a, b) in enumerate(zip(shape, expected, strict=True)):
        # a vocabulary is padded to a multiple of 64 per rank before it is split
        if a != b and not (i == dim and tp_size > 1 and b <= a <= b + 64):
            return False
    return True


@check(
    "VD406",
    "ranks-hold-different-models",
    "Tensor-parallel ranks hold parameters of different shapes, shapes that do not add up to the model, "
    "or the same values for a split parameter.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="ranks",
    what=(
        "With more than one tensor-parallel rank, compares each parameter across the ranks of a pipeline stage: its "
        "shape (equal on every rank), its shape against the parameter built at tensor-parallel size 1 by the weights "
        "pass (`check --engine`: a split parameter is 1/N of it on the dimension vLLM splits, a replicated one is "
        "equal), and, for split parameters, a fingerprint of its values (two ranks must not hold the same shard)."
    ),
    why=(
        "A custom weight_loader that ignores the rank loads the same slice everywhere, or replaces the parameter "
        "with the whole checkpoint tensor: vLLM raises nothing, and the model computes garbage only at "
        "tensor_parallel_size > 1, the size it is served at."
    ),
    example=("def weight_loader(param, w): param.data.copy_(w.narrow(0, 0, param.shape[0]))  # always rank 0's slice"),
    fix=(
        "Narrow by the rank: `shard = param.shape[dim]; start = get_tensor_model_parallel_rank() * shard; "
        "param.data.copy_(w.narrow(dim, start, shard))`, or use vLLM's parallel layers and their weight_loader."
    ),
    requires=("engine",),
)
def ranks_hold_different_models(facts: Any, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = _workers(facts, emit, "placement")
    yield from crashes
    stages: dict[int, dict[int, tuple[WorkerFacts, dict[str, Any]]]] = {}
    tp_size = 1
    for w, p in pairs:
        pp_rank, tp_rank = _ranks(w, p)
        stages.setdefault(pp_rank, {})[tp_rank] = (w, p)
        tp_size = max(tp_size, int((p.get("worker") or {}).get("tensor_parallel_size") or 1))
    if tp_size <= 1:
        yield emit.not_applicable("one tensor-parallel rank: nothing to compare", "all ranks")
        return
    any_problem = False
    for pp_rank, by_tp in sorted(stages.items()):
        shards = {tp: p.get("shards") or {} for tp, (_w, p) in by_tp.items()}
        if not any(shards.values()):
            yield emit.skip("the workers did not report parameter shapes (an older doctor in the engine?)")
            return
        findings = []
        for prob in rank_shard_problems(shards, facts.reference_shapes, tp_size):
            w, p = by_tp[prob["rank"]]
            dev = (p.get("device") or {}).get("device")
            findings.append(
                emit.fail(
                    f"{prob['name']}: {prob['problem']}",
                    f"{_subject(w, dev)} / {prob['name']}",
                    {k: v for k, v in prob.items() if k != "problem"} | {"pp_rank": pp_rank, "tp_size": tp_size},
                    "narrow the checkpoint tensor by get_tensor_model_parallel_rank() in the weight_loader of "
                    f"{prob['name'].rsplit('.', 1)[0]}, or use vLLM's parallel layer and its weight_loader",
                )
            )
        any_problem = any_problem or bool(findings)
        if findings:
            yield from _capped(findings, emit, by_tp[min(by_tp)][0], "cross-rank problems", len(findings))
    if not any_problem:
        checked = "shapes" + (", shapes against tensor-parallel size 1" if facts.reference_shapes else "")
        hidden = sorted({n for _w, p in pairs for n, e in (p.get("shards") or {}).items() if e.get("repacked")})
        note = (
            f"; {len(hidden)} linear weight(s) not compared: vLLM's CPU backend packed them into its GEMM "
            "kernels after loading (their parameters are empty)"
            if hidden
            else ""
        )
        yield emit.ok(
            f"{len(pairs)} rank(s) over {len(stages)} pipeline stage(s) hold the same model ({checked}, and split "
            f"parameters hold different shards){note}",
            "all ranks",
            {"repacked": hidden[:50], "repacked_count": len(hidden)} if hidden else None,
        )


def blocks_needed(groups: list[dict[str, Any]], length: int) -> int | None:
    """KV blocks one request of ``length`` tokens takes across all groups (vLLM's block pool is shared)."""
    total = 0
    for g in groups:
        spec = g.get("spec") or {}
        bs = int(spec.get("block_size") or 0)
        if bs <= 0:
            return None
        kind = spec.get("type", "")
        window = spec.get("sliding_window") or spec.get("attention_chunk_size")
        if "Mamba" in kind:
            total += 1
        elif window:
            total += min(math.ceil(length / bs), math.ceil((int(window) - 1) / bs) + 1)
        elif "Attention" in kind or kind.endswith("Spec"):
            total += math.ceil(length / bs)
        else:
            return None
    return total


def largest_length(groups: list[dict[str, Any]], num_blocks: int, cap: int) -> int | None:
    """The longest request that fits in ``num_blocks`` (binary search up to ``cap``)."""
    if blocks_needed(groups, 1) is None:
        return None
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        needed = blocks_needed(groups, mid)
        if needed is not None and needed <= num_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


@check(
    "VD501",
    "kv-cache-too-small",
    "The KV cache cannot hold one request of max_model_len; says the largest length that fits.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="kv-cache",
    reads_startup_error=True,
    what=(
        "From the running engine's KV cache (blocks x block size per KV group) computes the longest request that fits "
        "and how many requests of max_model_len fit at once; if the engine refused to start, reads vLLM's own numbers "
        "from its error."
    ),
    why=(
        "vLLM stops at start-up (`To serve at least one request with the model's max seq len ...`) or, with several "
        "groups, rejects long prompts at run time."
    ),
    example="max_model_len=32768 with gpu_memory_utilization=0.5 on a 24 GiB GPU",
    fix=(
        "Lower `max_model_len` to the length that fits, raise `gpu_memory_utilization` / `kv_cache_memory_bytes`, or "
        "use an fp8 KV cache (`kv_cache_dtype='fp8'`)."
    ),
    references=("vllm-project/vllm#10439", "vllm-project/vllm#16118"),
    requires=("engine-facts",),
)
def kv_cache_too_small(facts: Any, emit: Emit) -> Iterable[Finding]:
    if facts.startup_error:
        err = facts.startup_error
        m = _TO_SERVE.search(err)
        if m:
            est = _ESTIMATED.search(err)
            yield emit.fail(
                f"the KV cache cannot hold one request of max_model_len={m.group(1)}: it needs {m.group(2)} GiB, "
                f"{m.group(3)} GiB are available"
                + (f"; the longest request that fits is {est.group(1)} tokens" if est else ""),
                "engine start-up",
                {
                    "max_model_len": int(m.group(1)),
                    "needed_gib": float(m.group(2)),
                    "available_gib": float(m.group(3)),
                    "largest_length": int(est.group(1)) if est else None,
                    "vllm_error": err[:600],
                },
                f"set max_model_len={est.group(1)} or less"
                if est
                else "lower max_model_len or give the KV cache more memory",
            )
            return
        if "No available memory for the cache blocks" in err:
            yield emit.fail(
                "no memory is left for the KV cache after the weights and activations",
                "engine start-up",
                {"vllm_error": err[:600]},
                "raise gpu_memory_utilization / kv_cache_memory_bytes, or use a smaller model / quantization",
            )
            return
    if (instead := _engine_started(facts, emit)) is not None:
        yield instead
        return
    pairs, crashes = _workers(facts, emit, "kv")
    yield from crashes
    for w, kv in pairs:
        groups, num_blocks, max_len = kv.get("groups") or [], kv.get("num_blocks"), kv.get("max_model_len")
        if not groups or not num_blocks or not max_len:
            yield emit.skip("this vLLM does not expose the KV cache configuration", _subject(w))
            continue
        usable = int(num_blocks) - 1  # block 0 is the null block
        fits = largest_length(groups, usable, cap=max(int(max_len), 1) * 1024)
        if fits is None:
            yield emit.skip(f"unknown KV spec types: {[g.get('spec', {}).get('type') for g in groups]}", _subject(w))
            continue
        per_request = blocks_needed(groups, int(max_len)) or 1
        evidence = {
            "num_blocks": num_blocks,
            "block_size": (groups[0].get("spec") or {}).get("block_size"),
            "groups": len(groups),
            "max_model_len": max_len,
            "largest_length": fits,
            "full_length_requests_at_once": usable // per_request,
            "kv_bytes": kv.get("storage_bytes"),
        }
        if fits < int(max_len):
            yield emit.fail(
                f"the KV cache holds {fits} tokens per request, less than max_model_len={max_len}",
                _subject(w),
                evidence,
                f"set max_model_len={fits} or give the KV cache more memory",
            )
        else:
            yield emit.ok(
                f"the KV cache ({num_blocks} blocks of {evidence['block_size']} tokens) holds "
                f"{usable // per_request} request(s) of max_model_len={max_len} at once"
                + (f"; the longest single request that fits is {fits} tokens" if fits < int(max_len) * 1024 else ""),
                _subject(w),
                evidence,
            )


@check(
    "VD502",
    "kv-cache-preemptions",
    "Requests were preempted (evicted from the KV cache and recomputed) during the run.",
    severity=Severity.WARN,
    stage=Stage.ENGINE,
    topic="kv-cache",
    what=(
        "When the KV cache runs out of free blocks, vLLM's scheduler preempts running requests: it frees their blocks "
        "and later recomputes their whole prefill. The doctor counts preempted and resumed requests per step (from "
        "the SchedulerOutput) next to the KV blocks in use."
    ),
    why=(
        "Each preemption throws away finished work: throughput drops and latency spikes while the KV usage metric "
        "looks merely 'high'."
    ),
    example="4 requests preempted, 4 resumed; KV cache peaked at 100% of 23 usable blocks",
    fix=(
        "Give the KV cache more room (gpu_memory_utilization, kv_cache_memory_bytes), or admit less at once "
        "(max_num_seqs, max_num_batched_tokens), or shorten max_model_len."
    ),
    references=("vllm-project/vllm#34076", "vllm-project/vllm#39734"),
    requires=("engine",),
)
def kv_cache_preemptions(facts: Any, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = _workers(facts, emit, "profile")
    yield from crashes
    for w, profile in pairs:
        steps = w.steps()
        if not len(steps):
            yield emit.skip(steps.error or "no step was profiled (run a workload while attached)", _subject(w))
            continue
        preempted_col, resumed_col = steps["preempted_reqs"], steps["resumed_reqs"]
        preempted, resumed = int(sum(preempted_col)), int(sum(resumed_col))
        num_blocks = profile.get("num_blocks") or ((w.get("kv") or {}).get("num_blocks"))
        usable = max(1, int(num_blocks) - 1) if num_blocks else None  # block 0 is vLLM's null block
        peak_blocks = int(max(steps["kv_blocks_used"]))
        peak = peak_blocks / usable if usable else None
        evidence = {
            "preempted": preempted,
            "resumed": resumed,
            "peak_blocks": peak_blocks,
            "usable_blocks": usable,
            "peak_usage": peak,
            "steps": len(steps),
            "steps_with_preemption": sum(map(bool, map(operator.or_, preempted_col, resumed_col))),
        }
        usage = (
            f"KV cache peaked at {peak:.0%} of {usable} usable blocks"
            if peak is not None
            else f"KV peak {peak_blocks} blocks"
        )
        if preempted or resumed:
            yield emit.warn(
                f"{max(preempted, resumed)} request(s) preempted and recomputed; {usage}",
                _subject(w),
                evidence,
                "give the KV cache more memory or admit fewer requests at once (max_num_seqs)",
            )
        else:
            yield emit.ok(f"no preemptions in {len(steps)} steps; {usage}", _subject(w), evidence)


@check(
    "VD503",
    "memory-breakdown",
    "Where the worker's memory goes: weights / peak activations / KV cache / CUDA graphs / other.",
    severity=Severity.INFO,
    stage=Stage.ENGINE,
    topic="memory",
    what=(
        "Adds up what each worker holds: weights (vLLM's measured load size, or the parameters' storages), the KV "
        "cache (each storage once), peak activations (vLLM's start-up profile or torch's peak), CUDA-graph pools, and "
        "the rest of what the device (NVML, per process) or the OS (resident memory, on CPU) reports."
    ),
    why=(
        "Before tuning max_model_len or gpu_memory_utilization you need to know which part is large; 'other' that is "
        "large points at the CUDA context, NCCL buffers or allocator fragmentation."
    ),
    example="weights 14.2 GiB, KV 52.1 GiB, peak activations 1.3 GiB, CUDA graphs 0.4 GiB, other 2.1 GiB of 70.1 GiB",
    fix=(
        "Informational. Reduce the largest part: quantize weights, shorten max_model_len, lower max_num_seqs or "
        "max_num_batched_tokens (activations), or run with enforce_eager (no graphs)."
    ),
    requires=("engine",),
)
def memory_breakdown_check(facts: Any, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = _workers(facts, emit, "memory")
    yield from crashes
    for w, _mem in pairs:
        b = memory_breakdown(w.memory or MemoryFacts(), facts.nvml)
        parts = b["parts"]
        text = ", ".join(
            f"{k.replace('_', ' ')} {fmt_bytes(v) if v is not None else 'not measurable'}" for k, v in parts.items()
        )
        message = f"{text} of {fmt_bytes(b['total'])} ({b['total_source']})"
        evidence = {**b, "rank": w.rank}
        if parts.get("other") is not None and parts["other"] < 0:
            yield emit.warn(
                "the parts add up to more than the total: " + message,
                _subject(w, b.get("device")),
                evidence,
                severity=Severity.INFO,
            )
        else:
            yield emit.ok(message, _subject(w, b.get("device")), evidence)


@check(
    "VD504",
    "kv-spec-mismatch",
    "The KV-cache spec does not match the model's attention layers (heads, head size, layers, bytes).",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="kv-cache",
    what=(
        "Compares each attention layer (vLLM's forward context) with the KV-cache group that holds it (KV heads, head "
        "size), with config.json (num_key_value_heads / tensor_parallel_size, head_dim), and the KV storage torch "
        "allocated (shared storage counted once) with the bytes vLLM planned."
    ),
    why=(
        "An attention layer that ignores grouped-query attention (KV heads = query heads) makes the KV cache several "
        "times larger than needed and shortens the max batch; a layer missing from the KV groups gets no cache at all."
    ),
    example=(
        "Attention(num_heads, head_dim, scale, num_kv_heads=config.num_attention_heads)  # config has "
        "num_key_value_heads=8"
    ),
    fix=(
        "Pass `num_kv_heads=config.num_key_value_heads // tp_size` (at least 1) and `head_size=config.head_dim` to "
        "vLLM's Attention, and give every attention layer its own prefix."
    ),
    requires=("engine",),
)
def kv_spec_mismatch(facts: Any, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = _workers(facts, emit, "kv")
    yield from crashes
    for w, kv in pairs:
        problems: list[tuple[str, str, dict[str, Any]]] = []
        layers = kv.get("attention_layers") or []
        group_of: dict[str, dict[str, Any]] = {}
        for g in kv.get("groups") or []:
            for name in g.get("layer_names", []):
                group_of[name] = g.get("spec") or {}
        hf = kv.get("hf_config") or {}
        tp = int(kv.get("tensor_parallel_size") or 1)
        cfg_kv = hf.get("num_key_value_heads", hf.get("num_attention_heads"))
        expected_kv = max(1, int(cfg_kv) // tp) if isinstance(cfg_kv, int) else None
        expected_head = hf.get("head_dim") or hf.get("vllm_head_size")
        names = {layer["prefix"] for layer in layers}
        for layer in layers:
            name = layer["prefix"]
            if layer.get("kv_sharing_target"):
                continue  # reads another layer's cache by design
            spec = group_of.get(name)
            if spec is None:
                problems.append(
                    (f"attention layer {name} is in no KV-cache group: it gets no cache", name, {"layer": layer})
                )
                continue
            for attr, label in (("num_kv_heads", "KV heads"), ("head_size", "head size")):
                if layer.get(attr) is not None and spec.get(attr) is not None and int(layer[attr]) != int(spec[attr]):
                    problems.append(
                        (
                            f"{name}: {label} {layer[attr]} but its KV spec says {spec[attr]}",
                            name,
                            {"layer": layer.get(attr), "spec": spec.get(attr)},
                        )
                    )
            if (
                expected_kv is not None
                and layer.get("num_kv_heads") is not None
                and int(layer["num_kv_heads"]) != expected_kv
            ):
                ratio = int(layer["num_kv_heads"]) / expected_kv
                problems.append(
                    (
                        f"{name} caches {layer['num_kv_heads']} KV heads per rank, config.json implies {expected_kv} "
                        f"(num_key_value_heads={cfg_kv} / tp={tp})"
                        + (f": the KV cache is {ratio:g}x larger than needed" if ratio > 1 else ""),
                        name,
                        {
                            "layer_kv_heads": layer["num_kv_heads"],
                            "expected": expected_kv,
                            "config_num_key_value_heads": cfg_kv,
                            "tp": tp,
                        },
                    )
                )
            if (
                isinstance(expected_head, int)
                and layer.get("head_size") is not None
                and int(layer["head_size"]) != expected_head
            ):
                problems.append(
                    (
                        f"{name} uses head size {layer['head_size']}, config.json says {expected_head}",
                        name,
                        {"layer_head_size": layer["head_size"], "config_head_dim": expected_head},
                    )
                )
        for name in group_of:
            if name not in names:
                problems.append((f"KV-cache group names {name}, which is no attention layer of the model", name, {}))
        storage, planned = kv.get("storage_bytes"), kv.get("planned_bytes")
        if planned and storage is not None and int(storage) != int(planned):
            problems.append(
                (
                    f"torch allocated {storage} bytes of KV storage, vLLM planned {planned}",
                    _subject(w),
                    {"storage_bytes": storage, "planned_bytes": planned, "num_storages": kv.get("num_storages")},
                )
            )
        n_layers = hf.get("num_hidden_layers")
        for message, subject, evidence in problems:
            yield emit.fail(
                message,
                subject,
                {**evidence, "rank": w.rank},
                "pass num_kv_heads=config.num_key_value_heads // tp_size and head_size=config.head_dim to Attention",
            )
        if not problems:
            yield emit.ok(
                f"{len(layers)} attention layer(s) match their KV spec and config.json; KV storage "
                f"{fmt_bytes(storage)} in "
                f"{kv.get('num_storages')} storage(s) (shared storage counted once) = vLLM's plan",
                _subject(w),
                {
                    "attention_layers": len(layers),
                    "num_hidden_layers": n_layers,
                    "storage_bytes": storage,
                    "planned_bytes": planned,
                    "view_bytes": kv.get("view_bytes"),
                },
            )


@check(
    "VD208",
    "attention-prefix-not-unique",
    "Attention layers without a unique `prefix` equal to their module path.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="contract",
    reads_startup_error=True,
    what=(
        "vLLM registers every Attention layer in its forward context under the `prefix` passed to it, and binds KV "
        "caches and quantization scales by that name. Checks the prefixes are unique (vLLM refuses duplicates at "
        "start-up) and equal to where the layer sits in the model."
    ),
    why=(
        "Duplicates stop the engine with `Duplicate layer name`; a prefix that differs from the module path (e.g. "
        "`layers.0.attn` for `model.layers.0.self_attn.attn`) breaks KV-scale loading and per-layer KV binding in "
        "quantized checkpoints."
    ),
    example="self.attn = Attention(..., prefix='attn')   # the same for every layer",
    fix=(
        'Thread `prefix` down from the model: `Attention(..., prefix=f"{prefix}.attn")` with the decoder layer built '
        'as `Layer(..., prefix=f"{prefix}.layers.{i}")`.'
    ),
    references=("vllm-project/vllm#18212", "vllm-project/vllm#15077"),
    requires=("engine-facts",),
)
def attention_prefix_not_unique(facts: Any, emit: Emit) -> Iterable[Finding]:
    if facts.startup_error:
        m = _DUPLICATE.search(facts.startup_error)
        if m:
            yield emit.fail(
                f"two attention layers use the prefix {m.group(1)!r}: vLLM refused to start",
                m.group(1),
                {"vllm_error": facts.startup_error[:600]},
                'pass a unique prefix to each Attention: prefix=f"{prefix}.attn"',
            )
            return
    if (instead := _engine_started(facts, emit)) is not None:
        yield instead
        return
    pairs, crashes = _workers(facts, emit, "kv")
    yield from crashes
    for w, kv in pairs:
        layers = kv.get("attention_layers") or []
        bad = 0
        for layer in layers:
            prefix, paths = layer["prefix"], layer.get("module_paths") or []
            if prefix in paths:
                continue
            bad += 1
            where = paths[0] if paths else "nowhere in the model (not a submodule)"
            yield emit.warn(
                f"attention layer registered as {prefix!r} sits at {where!r}",
                prefix,
                {"prefix": prefix, "module_paths": paths, "rank": w.rank},
                "pass the module's own path as prefix (thread `prefix` down from the model's constructor)",
            )
        if not bad:
            yield emit.ok(f"{len(layers)} attention layer(s), each registered under its own module path", _subject(w))


# ---- VD500: the engine did not start (or died on its first steps) -------------------------

_CAPTURE_COPY = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture",)
_CAPTURE_SYNC = (
    "cudaErrorStreamCaptureInvalidated",
    "operation not permitted when stream is capturing",
    "cudaErrorStreamCaptureUnsupported",
    "captures_underway",
)
_CAUSE_FIX = {
    "tensor on another device": (
        "create it without an explicit device in __init__ (vLLM's device context places it) or register it as a "
        "buffer; never build it with torch.from_numpy"
    ),
    "host tensor copied in forward": (
        "build the tensor once in __init__ as a buffer on the model's device (no .to(device) in forward); CUDA "
        "graphs cannot capture a copy from unpinned host memory"
    ),
    "tensor created on another device in forward": "create it with device=x.device (or as a buffer in __init__)",
    "host sync in forward": (
        "keep the value on the device (no .item()/.tolist()/int(tensor) in forward); CUDA graph capture cannot "
        "read a device value on the host"
    ),
    "data-dependent shape": "use fixed-shape ops (masking, torch.where) instead of nonzero / boolean indexing",
}


def start_failure_causes(error: str, diagnosis: EngineFacts | None) -> list[dict[str, Any]]:
    """What an eager re-run of the same model found that explains ``error``, most likely first."""
    if diagnosis is None or not diagnosis.started:
        return []
    causes: list[dict[str, Any]] = []
    for w in diagnosis.workers:
        placement = w.get("placement") or {}
        for t in placement.get("misplaced") or []:
            causes.append(
                {
                    "kind": "tensor on another device",
                    "subject": t["name"],
                    "detail": f"{t['kind']} {t['name']} ({t.get('module_class')}, {t.get('dtype')}) "
                    f"is on {t['device']}",
                    "where": [],
                }
            )
        for e in ((w.get("profile") or {}).get("probe") or {}).get("events") or []:
            kind = {
                "cross_device_copy": "host tensor copied in forward",
                "wrong_device_create": "tensor created on another device in forward",
                "host_sync": "host sync in forward",
                "data_dependent": "data-dependent shape",
            }.get(e.get("kind", ""))
            if kind is None or e.get("vllm_builtin"):
                continue
            causes.append(
                {
                    "kind": kind,
                    "subject": e.get("module") or "<model>",
                    "detail": f"{e.get('op')} in {e.get('module') or '<model>'} ({e.get('module_class')})",
                    "where": list(e.get("where") or []),
                }
            )
    copy_first = any(m in error for m in _CAPTURE_COPY)
    sync_first = any(m in error for m in _CAPTURE_SYNC)
    order = (
        ["host tensor copied in forward", "tensor on another device", "tensor created on another device in forward"]
        if copy_first
        else ["host sync in forward", "data-dependent shape"]
        if sync_first
        else []
    )
    causes.sort(key=lambda c: order.index(c["kind"]) if c["kind"] in order else len(order))
    for c in causes:
        c["fix"] = _CAUSE_FIX[c["kind"]]
    return causes


@check(
    "VD500",
    "engine-failed-to-start",
    "vLLM could not build, load, capture or run the model: its error, the phase, and the cause.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="start-up",
    reads_startup_error=True,
    what=(
        "The engine stage starts a real engine in the execution mode vLLM would serve with (on a GPU: torch.compile "
        "and CUDA graphs, unless you pass vLLM's own flags or --eager). When vLLM refuses, this finding carries its "
        "exception and the phase it failed in (load, profile run, KV cache allocation, graph capture, first step). "
        "If the mode was not eager, the doctor re-runs the model in eager mode with its op probe and names the cause: "
        "module, file:line, the op, and the fix."
    ),
    why=(
        "A model that runs eagerly can still fail to serve: CUDA graph capture rejects host syncs (`.item()`), "
        "copies from unpinned host memory and data-dependent shapes, and vLLM's message names none of your code."
    ),
    example=(
        "self.scale = torch.from_numpy(np.ones(hidden))   # float64 on the CPU\n"
        "...\n"
        "def forward(...): x = x * self.scale.to(x.device)  # capture: Cannot copy between CPU and CUDA tensors"
    ),
    fix=(
        "Do what the cause says (buffers made in __init__ on the model's device, no host reads in forward); "
        "`--eager` (vLLM's enforce_eager) serves without graphs meanwhile, more slowly."
    ),
    references=("vllm/v1/worker/gpu_model_runner.py:capture_model", "vllm-project/vllm#10439"),
    requires=("engine-facts",),
)
def engine_failed_to_start(facts: Any, emit: Emit) -> Iterable[Finding]:
    mode = facts.mode or {}
    mode_text = mode.get("summary") or ("eager" if mode.get("enforce_eager") else "vLLM's default execution mode")
    error = facts.startup_error or facts.runtime_error
    if error is None:
        if facts.started:
            yield emit.ok(f"the engine started ({mode_text}) and ran the workload", "engine start-up", {"mode": mode})
        return
    phase = facts.startup_phase or ("first step" if facts.runtime_error else "engine start-up")
    first = error.splitlines()[0][:400]
    causes = start_failure_causes(error, facts.diagnosis)
    evidence: dict[str, Any] = {"vllm_error": error[:2000], "phase": phase, "mode": mode, "causes": causes[:20]}
    if facts.startup_function:
        evidence["vllm_function"] = facts.startup_function
    message = f"vLLM failed in {phase} ({mode_text}): {first}"
    see = [code for code, pattern in (("VD501", _TO_SERVE), ("VD208", _DUPLICATE)) if pattern.search(error)]
    if see:
        message += f" (see {', '.join(see)})"
    if mode.get("enforce_eager"):
        hint = "it fails in eager mode: fix what the error names"
    else:
        hint = "run with --eager to see whether the model itself works, then fix what the error names"
    own_line = re.search(r" at (\S+:\d+ in \S+)\)?$", first)
    if own_line:
        hint = f"fix the line named ({own_line.group(1)}); it fails the same way in every process vLLM starts"
    if causes:
        top = causes[0]
        where = f" at {top['where'][-1]}" if top["where"] else ""
        message += f"; cause: {top['kind']}: {top['detail']}{where}"
        hint = top["fix"]
    elif facts.diagnosis is not None:
        d = facts.diagnosis
        eager_error = d.startup_error or d.runtime_error
        if eager_error or not d.started:
            message += "; it fails in eager mode too: " + (eager_error or "no worker replied").splitlines()[0][:200]
        else:
            message += "; in eager mode it runs, and the op probe saw nothing that explains the failure"
    yield emit.fail(message, f"engine start-up / {phase}", evidence, hint)
