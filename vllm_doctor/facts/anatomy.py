"""Who a worker is (``doctor_anatomy``, and ``doctor_placement``'s ``worker``): stdlib only.

Built inside the worker by :func:`vllm_doctor.compat.worker.identity` /
:func:`~vllm_doctor.compat.worker.compile_record` (:func:`vllm_doctor.compat.worker_facts.anatomy`
sends :meth:`Anatomy.to_wire`); read back with :meth:`Anatomy.from_wire`
(see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts.wire import VERSION_KEY, mapping, opt_bool, opt_int, opt_str, str_list, version

WIRE_VERSION = 1


@dataclass(frozen=True)
class WorkerIdentity:
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

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> WorkerIdentity:
        return cls(
            pid=opt_int(data.get("pid")),
            ppid=opt_int(data.get("ppid")),
            rank=opt_int(data.get("rank")),
            local_rank=opt_int(data.get("local_rank")),
            is_driver_worker=opt_bool(data.get("is_driver_worker")),
            device=opt_str(data.get("device")),
            worker_class=opt_str(data.get("worker_class")),
            model_runner_class=opt_str(data.get("model_runner_class")),
            model_runner_kind=opt_str(data.get("model_runner_kind")),
            model_class=opt_str(data.get("model_class")),
            model_module_file=opt_str(data.get("model_module_file")),
            tensor_parallel_size=opt_int(data.get("tensor_parallel_size")),
            pipeline_parallel_size=opt_int(data.get("pipeline_parallel_size")),
            data_parallel_size=opt_int(data.get("data_parallel_size")),
            world_size=opt_int(data.get("world_size")),
            cuda_visible_devices=opt_str(data.get("cuda_visible_devices")),
            process_title=opt_str(data.get("process_title")),
            tp_rank=opt_int(data.get("tp_rank")),
            pp_rank=opt_int(data.get("pp_rank")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "is_driver_worker": self.is_driver_worker,
            "device": self.device,
            "worker_class": self.worker_class,
            "model_runner_class": self.model_runner_class,
            "model_runner_kind": self.model_runner_kind,
            "model_class": self.model_class,
            "model_module_file": self.model_module_file,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "world_size": self.world_size,
            "cuda_visible_devices": self.cuda_visible_devices,
            "process_title": self.process_title,
            "tp_rank": self.tp_rank,
            "pp_rank": self.pp_rank,
        }


@dataclass(frozen=True)
class CompileState:
    """Is the model run eagerly (Python hooks fire) or through torch.compile / CUDA graphs?
    (None: the reply did not say.)"""

    enforce_eager: bool | None = None
    compilation_mode: str | None = None
    cudagraph_mode: str | None = None
    compiled: bool | None = None
    compiled_modules: list[str] = field(default_factory=list)  # the first 20 that vLLM compiles
    cudagraphs: bool | None = None
    eager: bool | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CompileState:
        return cls(
            enforce_eager=opt_bool(data.get("enforce_eager")),
            compilation_mode=opt_str(data.get("compilation_mode")),
            cudagraph_mode=opt_str(data.get("cudagraph_mode")),
            compiled=opt_bool(data.get("compiled")),
            compiled_modules=str_list(data.get("compiled_modules")),
            cudagraphs=opt_bool(data.get("cudagraphs")),
            eager=opt_bool(data.get("eager")),
        )

    @classmethod
    def read(cls, value: Any) -> CompileState | None:
        """A reply's ``compile`` entry, None when it has none."""
        return cls.from_wire(value) if isinstance(value, dict) else None

    def to_wire(self) -> dict[str, Any]:
        return {
            "enforce_eager": self.enforce_eager,
            "compilation_mode": self.compilation_mode,
            "cudagraph_mode": self.cudagraph_mode,
            "compiled": self.compiled,
            "compiled_modules": list(self.compiled_modules),
            "cudagraphs": self.cudagraphs,
            "eager": self.eager,
        }


@dataclass(frozen=True)
class Anatomy:
    """``doctor_anatomy``: the worker's identity and how it runs the model."""

    identity: WorkerIdentity = field(default_factory=WorkerIdentity)
    compile: CompileState | None = None
    wire_version: int = WIRE_VERSION

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Anatomy:
        data = mapping(data)
        return cls(WorkerIdentity.from_wire(data), CompileState.read(data.get("compile")), version(data))

    def to_wire(self) -> dict[str, Any]:
        return {
            VERSION_KEY: WIRE_VERSION,
            **self.identity.to_wire(),
            "compile": self.compile.to_wire() if self.compile is not None else None,
        }
