"""What a worker's memory holds (``doctor_memory``): the record both ends of the wire share.

Built inside the worker by :func:`vllm_doctor.compat.worker_facts.memory` (which sends
:meth:`MemoryFacts.to_json`), read on the doctor's side once per reply with
:meth:`MemoryFacts.of` (see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates).
VD503 and the report's memory breakdown read it. Stdlib only: the worker imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm_doctor.facts import wire
from vllm_doctor.facts.anatomy import CompileState

WIRE_VERSION = 1

# what vLLM's worker and model runner measured, where this vLLM has it (wire keys "vllm_<name>")
VLLM_MEASURES = (
    "model_memory_usage",
    "peak_activation_memory",
    "cudagraph_memory_estimate",
    "total_consumed",
    "available_kv_cache_memory_bytes",
    "requested_memory",
)


@dataclass(frozen=True)
class CudaMemory(wire.Record):
    """torch's allocator statistics and the device's free / total memory (a CUDA worker)."""

    allocated: int = 0
    reserved: int = 0
    max_allocated: int = 0
    max_reserved: int | None = None
    device_free: int = 0
    device_total: int = 0
    # segments of torch's private memory pools (CUDA graphs capture into one), from the
    # allocator's snapshot; None where the snapshot could not be read
    graph_pool_bytes: int | None = None


@dataclass(frozen=True)
class MemoryFacts(wire.Record):
    """``doctor_memory``: weights, KV, vLLM's own measurements, the process and the device."""

    pid: int | None = None
    device: str | None = None
    parameter_bytes: int = 0  # unique storages
    buffer_bytes: int = 0
    # linear weights vLLM's CPU backend packed out of sight (estimated from the layers' shapes)
    repacked_weight_bytes_estimate: int = 0
    repacked_layers: int = 0
    # a multimodal model's parameters outside its language model (vision tower, projector)
    encoder_parameter_bytes: int = 0
    # a mixture of experts: its fused-MoE layers, routed experts per layer on this rank, and
    # their parameters' bytes (all layers; the routed roofline's per-expert bytes)
    moe_layers: int = 0
    moe_experts: int = 0
    expert_parameter_bytes: int = 0
    kv_bytes: int = 0
    # VLLM_MEASURES this vLLM exposes -> bytes (wire keys "vllm_<name>")
    vllm: dict[str, int] = field(default_factory=dict, metadata=wire.rules(prefix="vllm_"))
    host: dict[str, int] = field(default_factory=dict)  # /proc: "VmRSS", "VmHWM"
    cuda: CudaMemory | None = field(default=None, metadata=wire.rules(empty_none=True))  # None on a CPU worker
    compile: CompileState | None = None
    wire_version: int = WIRE_VERSION

    WIRE_SPARSE: ClassVar[bool] = True  # sent without what the worker could not measure

    def measured(self, name: str) -> int | None:
        """What vLLM measured as ``name`` (one of :data:`VLLM_MEASURES`), None if it did not."""
        return self.vllm.get(name)

    def to_json(self) -> dict[str, Any]:
        return wire.versioned(self, WIRE_VERSION)
