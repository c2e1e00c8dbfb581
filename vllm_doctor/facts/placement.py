"""Where a worker's tensors live (``doctor_placement``): the record both ends of the wire share.

Built inside the worker by :func:`vllm_doctor.compat.worker_facts.placement` (which sends
:meth:`Placement.to_json`), read on the doctor's side once per reply with
:meth:`Placement.of` (see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates).
VD401, VD402, VD405 and VD406 read it. Stdlib only: the worker imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import wire
from vllm_doctor.facts.anatomy import WorkerIdentity

WIRE_VERSION = 1


@dataclass(frozen=True)
class DevicePlace(wire.Record):
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


@dataclass(frozen=True)
class TensorPlace(wire.Record):
    """One parameter or buffer the placement lists (misplaced, of another dtype, or float64);
    a field the list does not carry is None."""

    name: str = ""
    kind: str | None = None  # "parameter" | "buffer"
    device: str | None = None
    dtype: str | None = None
    shape: list[int] = field(default_factory=list, metadata=wire.rules(whole=True))
    bytes: int | None = None
    module_class: str | None = None  # the class of the module that owns it
    vllm_builtin: bool | None = None  # that class is one of vLLM's own


@dataclass(frozen=True)
class Shard(wire.Record):
    """A parameter as this tensor-parallel rank holds it (VD406)."""

    shape: list[int] = field(default_factory=list, metadata=wire.rules(whole=True))
    dim: int | None = None  # the dimension vLLM splits it on; None: replicated (or not knowable)
    # vLLM's CPU backend packed the weight into its GEMM kernel: the parameter is empty here
    repacked: bool = field(default=False, metadata=wire.rules(omit_default=True))
    # two numbers that tell the values apart (compat.worker_facts.fingerprint); only for split
    # parameters with more than one rank, and None where they would prove nothing
    fingerprint: list[float] | None = field(default=None, metadata=wire.rules(whole=True, omit_default=True))


@dataclass(frozen=True)
class PlacementCounts(wire.Record):
    """All the model's tensors, counted (the lists stop at the worker's listing limit)."""

    parameters: int = 0
    buffers: int = 0
    misplaced: int | None = None  # None: an older reply that did not count (use the list's length)
    dtype_mismatch: int | None = None


@dataclass(frozen=True)
class Placement(wire.Record):
    """``doctor_placement``: the worker, its device, and where its model's tensors are."""

    # None: the reply did not say who the worker is
    worker: WorkerIdentity | None = field(default=None, metadata=wire.rules(empty_none=True))
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

    def to_json(self) -> dict[str, Any]:
        return wire.versioned(self, WIRE_VERSION)
