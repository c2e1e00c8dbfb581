"""VD503: where each worker's memory goes (topic ``memory``).

It reads each worker's :class:`~vllm_doctor.facts.memory.MemoryFacts` (``doctor_memory``) and
the doctor's own NVML snapshot, through :func:`vllm_doctor.analysis.engine.memory_breakdown`.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.analysis.engine import memory_breakdown
from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import memories, subject
from vllm_doctor.facts.engine import EngineFacts
from vllm_doctor.model import Finding, Severity, Stage
from vllm_doctor.units import fmt_bytes


@check(
    "VD503",
    "memory-breakdown",
    "Where the worker's memory goes: weights / peak activations / KV cache / CUDA graphs / other.",
    severity=Severity.INFO,
    stage=Stage.ENGINE,
    topic="memory",
    what=(
        "Adds up what each worker holds: weights (vLLM's measured load size, or the parameters' storages), the KV "
        "cache (each storage once), peak activations (vLLM's start-up profile or torch's peak), CUDA graphs "
        "(measured: the segments of torch's private memory pools, where vLLM captures its graphs), and the rest of "
        "what the device (NVML, per process) or the OS (resident memory, on CPU) reports."
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
def memory_breakdown_check(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = memories(facts, emit)
    yield from crashes
    for w, mem in pairs:
        b = memory_breakdown(mem, facts.nvml)
        parts = b["parts"]
        text = ", ".join(
            f"{k.replace('_', ' ')} {fmt_bytes(v) if v is not None else 'not measurable'}" for k, v in parts.items()
        )
        message = f"{text} of {fmt_bytes(b['total'])} ({b['total_source']})"
        evidence = {**b, "rank": w.rank}
        if parts.get("other") is not None and parts["other"] < 0:
            yield emit.warn(
                "the parts add up to more than the total: " + message,
                subject(w, b.get("device")),
                evidence,
                severity=Severity.INFO,
            )
        else:
            yield emit.ok(message, subject(w, b.get("device")), evidence)
