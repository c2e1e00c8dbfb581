"""Who a worker is (``doctor_anatomy``, and ``doctor_placement``'s ``worker``): stdlib only.

Built inside the worker by :func:`vllm_doctor.compat.worker.identity` /
:func:`~vllm_doctor.compat.worker.compile_record` (:func:`vllm_doctor.compat.worker_facts.anatomy`
sends :meth:`Anatomy.to_json`); read back with :meth:`Anatomy.of`
(see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import wire

WIRE_VERSION = 1


@dataclass(frozen=True)
class WorkerIdentity(wire.Record):
    """A worker's process, ranks, device and classes."""

    pid: int | None = None
    ppid: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    is_driver_worker: bool | None = None
    device: str | None = None
    worker_class: str | None = None
    model_runner_class: str | None = None
    model_runner_kind: str | None = None
    model_class: str | None = None
    model_module_file: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    world_size: int | None = None
    cuda_visible_devices: str | None = None
    process_title: str | None = None
    tp_rank: int | None = None  # the rank in its tensor-parallel group (None: vLLM did not say)
    pp_rank: int | None = None


@dataclass(frozen=True)
class CompileState(wire.Record):
    """Is the model run eagerly (Python hooks fire) or through torch.compile / CUDA graphs?
    (None: the reply did not say.)"""

    enforce_eager: bool | None = None
    compilation_mode: str | None = None
    cudagraph_mode: str | None = None
    compiled: bool | None = None
    compiled_modules: list[str] = field(default_factory=list)  # the first 20 that vLLM compiles
    cudagraphs: bool | None = None
    eager: bool | None = None


@dataclass(frozen=True)
class Anatomy(wire.Record):
    """``doctor_anatomy``: the worker's identity and how it runs the model."""

    # the identity's fields sit in the reply beside ``compile``
    identity: WorkerIdentity = field(default_factory=WorkerIdentity, metadata=wire.rules(inline=True))
    compile: CompileState | None = None
    wire_version: int = WIRE_VERSION

    def to_json(self) -> dict[str, Any]:
        return wire.versioned(self, WIRE_VERSION)
