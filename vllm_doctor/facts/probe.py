"""The forward probe's part of a worker's ``doctor_collect`` reply (``profile["probe"]``):
what the forward pass did op by op on the probed steps. Built by
:meth:`vllm_doctor.engine.probe.ProbeRecorder.snapshot` and the session's ``probe_snapshot``;
VD403 / VD404 read its events, the performance lint its op counts. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import wire


@dataclass(frozen=True)
class ProbeEvent:
    """One kind of op one module did on the probed steps (counted)."""

    kind: str = ""  # "wrong_device_create", "cross_device_copy", "host_sync", ...
    op: str = ""
    module: str = ""  # the module's path ("<model>": outside any module)
    module_class: str = ""
    vllm_builtin: bool = False  # the module is one of vLLM's own layers
    count: int = 0
    where: list[str] = field(default_factory=list)  # the user frames that made it, innermost last
    device: str | None = None  # where the tensor landed
    from_device: str | None = field(default=None, metadata=wire.rules(key="from"))  # a copy's source


@dataclass(frozen=True)
class ProbeReply:
    """The probe's snapshot: the steps it watched and the events it counted."""

    complete: bool = False  # every planned step was probed
    worker_device: str = ""
    steps: list[Any] = field(default_factory=list)  # the probed steps, as the profiler saw them
    events: list[dict[str, Any]] = field(default_factory=list)  # ProbeEvent's, as sent (findings show them so)
    op_counts: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> module class -> aten ops
    reason: str | None = None  # why the probe did not run
    waiting_for: list[str] | None = None  # the phases still to probe


@dataclass(frozen=True)
class ProfileProbe:
    """A ``doctor_collect`` reply, for its ``probe`` part."""

    probe: ProbeReply = field(default_factory=ProbeReply)
