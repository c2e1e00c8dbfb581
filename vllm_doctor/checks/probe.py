"""VD403 / VD404: what the forward pass does op by op on the probed steps (topic ``probe``).

They read the forward probe's events from each worker's ``doctor_collect`` reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import profiles, subject
from vllm_doctor.facts import wire
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.probe import ProbeEvent, ProfileProbe
from vllm_doctor.model import Finding, Severity, Stage

Event = tuple[ProbeEvent, dict[str, Any]]  # the event read, and as the worker sent it (the evidence)


def _probe_events(
    facts: EngineFacts, emit: Emit, kinds: set[str]
) -> tuple[list[tuple[WorkerFacts, str, Event | None]], list[Finding]]:
    """(worker, device, event or None when the worker's probe saw none of ``kinds``), and the
    findings for workers whose probe crashed or saw no step."""
    pairs, findings = profiles(facts, emit)
    items: list[tuple[WorkerFacts, str, Event | None]] = []
    for w, profile in pairs:
        probe = wire.read(ProfileProbe, profile).probe
        dev = probe.worker_device
        if not probe.steps and not probe.events:  # judge what was probed, even if incomplete
            findings.append(
                emit.skip(
                    probe.reason or f"the forward probe saw no step yet (waiting for {probe.waiting_for})", subject(w)
                )
            )
            continue
        events = [(e, raw) for raw in probe.events if (e := wire.read(ProbeEvent, raw)).kind in kinds]
        items += [(w, dev, e) for e in events] or [(w, dev, None)]
    return items, findings


def _probe_steps(w: WorkerFacts) -> list[Any]:
    return wire.read(ProfileProbe, w.get("profile")).probe.steps


@check(
    "VD403",
    "forward-wrong-device",
    "The forward pass creates tensors on another device than the worker's, or copies across devices every step.",
    severity=Severity.WARN,
    also=(Severity.INFO,),
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
def forward_wrong_device(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    items, findings = _probe_events(facts, emit, {"wrong_device_create", "cross_device_copy", "wrong_device_compute"})
    yield from findings
    for w, dev, event in items:
        if event is None:
            steps = _probe_steps(w)
            yield emit.ok(f"no op in {len(steps)} probed step(s) left {dev}", subject(w, dev), {"probed_steps": steps})
            continue
        e, raw = event
        what = {
            "wrong_device_create": f"creates a tensor on {e.device}",
            "cross_device_copy": f"copies a tensor from {e.from_device} to {e.device}",
            "wrong_device_compute": f"computes on {e.device}",
        }[e.kind]
        where = (e.where or [""])[-1]
        builtin = e.vllm_builtin
        yield emit.warn(
            (f"{e.module} ({e.module_class}) {what} ({e.op}, {e.count}x in the probed steps); the worker runs on {dev}")
            + (" [inside vLLM's own layer]" if builtin else ""),
            e.module,
            {**raw, "worker_device": dev, "rank": w.rank},
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
    also=(Severity.INFO,),
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
def host_sync_in_forward(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    items, findings = _probe_events(facts, emit, {"host_sync", "data_dependent"})
    yield from findings
    for w, dev, event in items:
        if event is None:
            steps = _probe_steps(w)
            yield emit.ok(
                f"no host read or data-dependent shape in {len(steps)} probed step(s)",
                subject(w, dev),
                {"probed_steps": steps},
            )
            continue
        e, raw = event
        what = "reads a tensor value on the host" if e.kind == "host_sync" else "has a data-dependent output shape"
        on_cpu = dev.startswith("cpu")
        builtin = e.vllm_builtin
        note = (
            " (a no-op on this CPU worker; on a GPU worker it waits for the GPU and breaks CUDA-graph capture)"
            if on_cpu
            else ""
        )
        where = (e.where or [""])[-1]
        yield emit.warn(
            f"{e.module} ({e.module_class}) {what}: {e.op}, {e.count}x in the probed steps{note}"
            + (" [inside vLLM's own layer]" if builtin else ""),
            e.module,
            {**raw, "worker_device": dev, "rank": w.rank},
            (f"at {where}: " if where else "")
            + "keep values on the device (masks, torch.where) or move the decision out of forward",
            severity=Severity.INFO if builtin else None,
        )
