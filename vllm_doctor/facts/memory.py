"""What a worker's memory holds (``doctor_memory``): the record both ends of the wire share.

Built inside the worker by :func:`vllm_doctor.compat.worker_facts.memory` (which sends
:meth:`MemoryFacts.to_wire`), read on the doctor's side once per reply with
:meth:`MemoryFacts.from_wire` (see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates).
VD503 and the report's memory breakdown read it. Stdlib only: the worker imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts.anatomy import CompileState
from vllm_doctor.facts.wire import VERSION_KEY, int_map, mapping, opt_int, opt_str, version, without_none

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
class CudaMemory:
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

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CudaMemory:
        return cls(
            allocated=opt_int(data.get("allocated")) or 0,
            reserved=opt_int(data.get("reserved")) or 0,
            max_allocated=opt_int(data.get("max_allocated")) or 0,
            max_reserved=opt_int(data.get("max_reserved")),
            device_free=opt_int(data.get("device_free")) or 0,
            device_total=opt_int(data.get("device_total")) or 0,
            graph_pool_bytes=opt_int(data.get("graph_pool_bytes")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "allocated": self.allocated,
            "reserved": self.reserved,
            "max_allocated": self.max_allocated,
            "max_reserved": self.max_reserved,
            "device_free": self.device_free,
            "device_total": self.device_total,
            "graph_pool_bytes": self.graph_pool_bytes,
        }


@dataclass(frozen=True)
class MemoryFacts:
    """``doctor_memory``: weights, KV, vLLM's own measurements, the process and the device."""

    pid: int | None = None
    device: str | None = None
    parameter_bytes: int = 0  # unique storages
    buffer_bytes: int = 0
    # linear weights vLLM's CPU backend packed out of sight (estimated from the layers' shapes)
    repacked_weight_bytes_estimate: int = 0
    repacked_layers: int = 0
    kv_bytes: int = 0
    vllm: dict[str, int] = field(default_factory=dict)  # VLLM_MEASURES this vLLM exposes -> bytes
    host: dict[str, int] = field(default_factory=dict)  # /proc: "VmRSS", "VmHWM"
    cuda: CudaMemory | None = None  # None on a CPU worker
    compile: CompileState | None = None
    wire_version: int = WIRE_VERSION

    def measured(self, name: str) -> int | None:
        """What vLLM measured as ``name`` (one of :data:`VLLM_MEASURES`), None if it did not."""
        return self.vllm.get(name)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> MemoryFacts:
        data = mapping(data)
        cuda = mapping(data.get("cuda"))
        vllm = {name: v for name in VLLM_MEASURES if (v := opt_int(data.get(f"vllm_{name}"))) is not None}
        return cls(
            pid=opt_int(data.get("pid")),
            device=opt_str(data.get("device")),
            parameter_bytes=opt_int(data.get("parameter_bytes")) or 0,
            buffer_bytes=opt_int(data.get("buffer_bytes")) or 0,
            repacked_weight_bytes_estimate=opt_int(data.get("repacked_weight_bytes_estimate")) or 0,
            repacked_layers=opt_int(data.get("repacked_layers")) or 0,
            kv_bytes=opt_int(data.get("kv_bytes")) or 0,
            vllm=vllm,
            host=int_map(data.get("host")),
            cuda=CudaMemory.from_wire(cuda) if cuda else None,
            compile=CompileState.read(data.get("compile")),
            wire_version=version(data),
        )

    def to_wire(self) -> dict[str, Any]:
        return without_none(
            {
                VERSION_KEY: WIRE_VERSION,
                "pid": self.pid,
                "device": self.device,
                "parameter_bytes": self.parameter_bytes,
                "buffer_bytes": self.buffer_bytes,
                "repacked_weight_bytes_estimate": self.repacked_weight_bytes_estimate,
                "repacked_layers": self.repacked_layers,
                "kv_bytes": self.kv_bytes,
                **{f"vllm_{name}": value for name, value in self.vllm.items()},
                "host": dict(self.host),
                "cuda": self.cuda.to_wire() if self.cuda is not None else None,
                "compile": self.compile.to_wire() if self.compile is not None else None,
            }
        )
