"""Where a worker's tensors live (``doctor_placement``): the record both ends of the wire share.

Built inside the worker by :func:`vllm_doctor.compat.worker_facts.placement` (which sends
:meth:`Placement.to_wire`), read on the doctor's side once per reply with
:meth:`Placement.from_wire` (see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates).
VD401, VD402, VD405 and VD406 read it. Stdlib only: the worker imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts.anatomy import WorkerIdentity
from vllm_doctor.facts.wire import (
    VERSION_KEY,
    float_list,
    int_list,
    int_map,
    mapping,
    opt_bool,
    opt_int,
    opt_str,
    records,
    version,
)

WIRE_VERSION = 1


@dataclass(frozen=True)
class DevicePlace:
    """The worker's device as vLLM, torch and the environment see it (VD402). The CUDA fields
    are None on a CPU worker."""

    device: str | None = None  # "cuda:0", "cpu"
    type: str | None = None  # "cuda", "cpu"
    index: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    cuda_visible_devices: str | None = None
    assigned_physical_gpu_ids: Any = None  # as vLLM's parallel config holds it (JSON-able)
    hostname: str | None = None
    current_device: int | None = None
    device_count: int | None = None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    total_memory: int | None = None
    # the memory interface torch reports (the roofline's peak bandwidth: 2 x bus bits / 8 x clock)
    memory_bus_width_bits: int | None = None
    memory_clock_khz: int | None = None
    multi_processor_count: int | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> DevicePlace:
        return cls(
            device=opt_str(data.get("device")),
            type=opt_str(data.get("type")),
            index=opt_int(data.get("index")),
            rank=opt_int(data.get("rank")),
            local_rank=opt_int(data.get("local_rank")),
            cuda_visible_devices=opt_str(data.get("cuda_visible_devices")),
            assigned_physical_gpu_ids=data.get("assigned_physical_gpu_ids"),
            hostname=opt_str(data.get("hostname")),
            current_device=opt_int(data.get("current_device")),
            device_count=opt_int(data.get("device_count")),
            name=opt_str(data.get("name")),
            uuid=opt_str(data.get("uuid")),
            pci_bus_id=opt_str(data.get("pci_bus_id")),
            total_memory=opt_int(data.get("total_memory")),
            memory_bus_width_bits=opt_int(data.get("memory_bus_width_bits")),
            memory_clock_khz=opt_int(data.get("memory_clock_khz")),
            multi_processor_count=opt_int(data.get("multi_processor_count")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "type": self.type,
            "index": self.index,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "cuda_visible_devices": self.cuda_visible_devices,
            "assigned_physical_gpu_ids": self.assigned_physical_gpu_ids,
            "hostname": self.hostname,
            "current_device": self.current_device,
            "device_count": self.device_count,
            "name": self.name,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "total_memory": self.total_memory,
            "memory_bus_width_bits": self.memory_bus_width_bits,
            "memory_clock_khz": self.memory_clock_khz,
            "multi_processor_count": self.multi_processor_count,
        }


@dataclass(frozen=True)
class TensorPlace:
    """One parameter or buffer the placement lists (misplaced, of another dtype, or float64);
    a field the list does not carry is None."""

    name: str = ""
    kind: str | None = None  # "parameter" | "buffer"
    device: str | None = None
    dtype: str | None = None
    shape: list[int] = field(default_factory=list)
    bytes: int | None = None
    module_class: str | None = None  # the class of the module that owns it
    vllm_builtin: bool | None = None  # that class is one of vLLM's own

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> TensorPlace:
        return cls(
            name=opt_str(data.get("name")) or "",
            kind=opt_str(data.get("kind")),
            device=opt_str(data.get("device")),
            dtype=opt_str(data.get("dtype")),
            shape=int_list(data.get("shape")),
            bytes=opt_int(data.get("bytes")),
            module_class=opt_str(data.get("module_class")),
            vllm_builtin=opt_bool(data.get("vllm_builtin")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "device": self.device,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "bytes": self.bytes,
            "module_class": self.module_class,
            "vllm_builtin": self.vllm_builtin,
        }


@dataclass(frozen=True)
class Shard:
    """A parameter as this tensor-parallel rank holds it (VD406)."""

    shape: list[int] = field(default_factory=list)
    dim: int | None = None  # the dimension vLLM splits it on; None: replicated (or not knowable)
    # vLLM's CPU backend packed the weight into its GEMM kernel: the parameter is empty here
    repacked: bool = False
    # two numbers that tell the values apart (compat.worker_facts.fingerprint); only for split
    # parameters with more than one rank, and None where they would prove nothing
    fingerprint: list[float] | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Shard:
        return cls(
            shape=int_list(data.get("shape")),
            dim=opt_int(data.get("dim")),
            repacked=data.get("repacked") is True,
            fingerprint=float_list(data.get("fingerprint")),
        )

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dim": self.dim}
        if self.repacked:
            out["repacked"] = True
        if self.fingerprint is not None:
            out["fingerprint"] = list(self.fingerprint)
        return out


@dataclass(frozen=True)
class PlacementCounts:
    """All the model's tensors, counted (the lists stop at the worker's listing limit)."""

    parameters: int = 0
    buffers: int = 0
    misplaced: int | None = None  # None: an older reply that did not count (use the list's length)
    dtype_mismatch: int | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PlacementCounts:
        return cls(
            parameters=opt_int(data.get("parameters")) or 0,
            buffers=opt_int(data.get("buffers")) or 0,
            misplaced=opt_int(data.get("misplaced")),
            dtype_mismatch=opt_int(data.get("dtype_mismatch")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters,
            "buffers": self.buffers,
            "misplaced": self.misplaced,
            "dtype_mismatch": self.dtype_mismatch,
        }


@dataclass(frozen=True)
class Placement:
    """``doctor_placement``: the worker, its device, and where its model's tensors are."""

    worker: WorkerIdentity | None = None  # None: the reply did not say who the worker is
    device: DevicePlace = field(default_factory=DevicePlace)
    model_dtype: str | None = None  # "torch.bfloat16"
    model: str | None = None  # the model's class; None: the worker has no model loaded
    counts: PlacementCounts = field(default_factory=PlacementCounts)
    misplaced: list[TensorPlace] = field(default_factory=list)  # not on the worker's device
    dtype_mismatch: list[TensorPlace] = field(default_factory=list)  # floating point, not model_dtype
    float64: list[TensorPlace] = field(default_factory=list)  # any float64 tensor, on any device
    by_device: dict[str, int] = field(default_factory=dict)
    by_dtype: dict[str, int] = field(default_factory=dict)
    shards: dict[str, Shard] = field(default_factory=dict)  # parameter name -> this rank's shard
    wire_version: int = WIRE_VERSION

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Placement:
        data = mapping(data)
        worker = mapping(data.get("worker"))
        return cls(
            worker=WorkerIdentity.from_wire(worker) if worker else None,
            device=DevicePlace.from_wire(mapping(data.get("device"))),
            model_dtype=opt_str(data.get("model_dtype")),
            model=opt_str(data.get("model")),
            counts=PlacementCounts.from_wire(mapping(data.get("counts"))),
            misplaced=records(data.get("misplaced"), TensorPlace.from_wire),
            dtype_mismatch=records(data.get("dtype_mismatch"), TensorPlace.from_wire),
            float64=records(data.get("float64"), TensorPlace.from_wire),
            by_device=int_map(data.get("by_device")),
            by_dtype=int_map(data.get("by_dtype")),
            shards={
                name: Shard.from_wire(entry)
                for name, entry in mapping(data.get("shards")).items()
                if isinstance(name, str) and isinstance(entry, dict)
            },
            wire_version=version(data),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            VERSION_KEY: WIRE_VERSION,
            "worker": self.worker.to_wire() if self.worker is not None else None,
            "device": self.device.to_wire(),
            "model_dtype": self.model_dtype,
            "model": self.model,
            "counts": self.counts.to_wire(),
            "misplaced": [t.to_wire() for t in self.misplaced],
            "dtype_mismatch": [t.to_wire() for t in self.dtype_mismatch],
            "float64": [t.to_wire() for t in self.float64],
            "by_device": dict(self.by_device),
            "by_dtype": dict(self.by_dtype),
            "shards": {name: s.to_wire() for name, s in self.shards.items()},
        }
