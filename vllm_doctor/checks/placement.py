"""VD401 / VD402 / VD405: where each worker's tensors live, and in which dtype (topic ``placement``).

They read each worker's :class:`~vllm_doctor.facts.placement.Placement` (``doctor_placement``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import capped_per_worker, placements, subject
from vllm_doctor.facts.engine import EngineFacts
from vllm_doctor.model import Finding, Severity, Stage


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
def tensor_off_worker_device(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = placements(facts, emit)
    yield from crashes
    for w, p in pairs:
        dev, counts = p.device.device, p.counts
        if p.model is None:
            yield emit.skip("the worker has no model loaded", subject(w, dev))
            continue
        if not p.misplaced:
            yield emit.ok(
                f"all {counts.parameters} parameters and {counts.buffers} buffers are on {dev}", subject(w, dev)
            )
            continue
        findings = [
            emit.fail(
                f"{t.kind} {t.name} is on {t.device}, but rank {w.rank} runs on {dev}",
                f"{subject(w, dev)} / {t.name}",
                {
                    "expected": dev,
                    "actual": t.device,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "bytes": t.bytes,
                    "module_class": t.module_class,
                    "rank": w.rank,
                },
                "create it without an explicit device in __init__ (vLLM's device context places it) "
                + (
                    "or call .to(device) / materialise it in process_weights_after_loading"
                    if t.device == "meta"
                    else "or move it in process_weights_after_loading"
                ),
            )
            for t in p.misplaced
        ]
        total = counts.misplaced if counts.misplaced is not None else len(p.misplaced)
        yield from capped_per_worker(findings, emit, w, "misplaced tensors", total)


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
def worker_device_mismatch(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    by_gpu: dict[tuple[Any, Any], list[int | None]] = {}
    pairs, crashes = placements(facts, emit)
    yield from crashes
    for w, p in pairs:
        d = p.device
        dev = d.device
        if d.type != "cuda":
            yield emit.not_applicable(
                f"rank {w.rank} runs on {dev}: device-per-rank applies to GPU workers only", subject(w, dev)
            )
            continue
        problems = []
        local_rank, index = d.local_rank, d.index
        if local_rank is not None and index is not None and local_rank != index:
            problems.append(f"its device index {index} differs from its local rank {local_rank}")
        if d.device_count is not None and index is not None and index >= d.device_count:
            problems.append(f"device index {index} but only {d.device_count} GPU(s) are visible")
        if d.current_device is not None and index is not None and d.current_device != index:
            problems.append(f"torch.cuda.current_device() is {d.current_device}, not {index}")
        key = (d.hostname, d.uuid or d.pci_bus_id or f"{d.cuda_visible_devices}#{index}")
        by_gpu.setdefault(key, []).append(w.rank)
        evidence = {
            "device": d.device,
            "local_rank": d.local_rank,
            "rank": d.rank,
            "current_device": d.current_device,
            "device_count": d.device_count,
            "cuda_visible_devices": d.cuda_visible_devices,
            "uuid": d.uuid,
            "pci_bus_id": d.pci_bus_id,
        }
        if problems:
            yield emit.fail(
                f"rank {w.rank}: " + "; ".join(problems),
                subject(w, dev),
                evidence,
                "let vLLM pick the device (cuda:<local_rank>) and list distinct GPUs in CUDA_VISIBLE_DEVICES",
            )
        else:
            yield emit.ok(
                f"rank {w.rank} (local rank {local_rank}) runs on {dev} ({d.name})", subject(w, dev), evidence
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


@check(
    "VD405",
    "parameter-dtype-differs",
    "A parameter's dtype differs from the model dtype (info: fine if deliberate); any float64 tensor (warn).",
    severity=Severity.INFO,
    also=(Severity.WARN,),
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
def parameter_dtype_differs(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = placements(facts, emit)
    yield from crashes
    for w, p in pairs:
        model_dtype = p.model_dtype
        for t in p.float64:
            yield emit.warn(
                f"{t.kind} {t.name} is float64 (on {t.device}): numpy's default dtype, never what a GPU kernel wants",
                t.name,
                {
                    "expected": model_dtype,
                    "actual": "torch.float64",
                    "shape": list(t.shape),
                    "kind": t.kind,
                    "module_class": t.module_class,
                },
                "make it in the model dtype (torch.from_numpy(a).to(torch.get_default_dtype()), or torch.tensor "
                "without dtype) and register it in __init__ so vLLM places it",
                severity=Severity.WARN,
            )
        other = [t for t in p.dtype_mismatch if t.dtype != "torch.float64"]
        # vLLM's own layers keep some parameters in float32 on purpose (a Mamba mixer's A and D,
        # a Gated DeltaNet's A_log): vLLM's choice, not the port's
        by_vllm = [t for t in other if t.vllm_builtin]
        mismatched = [t for t in other if not t.vllm_builtin]
        if not mismatched:
            if not p.float64:
                kept = ""
                if by_vllm:
                    names = ", ".join(sorted({t.name.rsplit(".", 1)[-1] for t in by_vllm}))
                    kept = (
                        f" but {len(by_vllm)} that vLLM's own layers keep in "
                        f"{'/'.join(sorted({str(t.dtype) for t in by_vllm}))} on purpose ({names})"
                    )
                yield emit.ok(f"every floating-point parameter is {model_dtype}{kept}", subject(w))
            continue
        findings = [
            emit.warn(
                f"parameter {t.name} is {t.dtype}, the model runs in {model_dtype}",
                t.name,
                {"expected": model_dtype, "actual": t.dtype, "shape": list(t.shape), "module_class": t.module_class},
                (
                    "create it with the default dtype (vLLM sets it while building the model), or ignore VD405 if "
                    "deliberate"
                ),
            )
            for t in mismatched
        ]
        listed = p.counts.dtype_mismatch if p.counts.dtype_mismatch is not None else len(other)
        total = max(len(mismatched), listed - len(by_vllm))
        yield from capped_per_worker(findings, emit, w, "parameters with another dtype", total)
