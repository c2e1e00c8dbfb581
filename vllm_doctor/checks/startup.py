"""VD500: the engine did not start (or died on its first steps), and why (topic ``start-up``).

It reads vLLM's own error, the phase it failed in, and, after a failure outside eager mode, what
the eager re-run with the op probe found (:func:`start_failure_causes`). The patterns of vLLM's
start-up errors that other checks explain (VD501, VD208) live here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, check, informative_line
from vllm_doctor.checks.registry import class_import_failure
from vllm_doctor.facts import wire
from vllm_doctor.facts.engine import EngineFacts, import_error_line
from vllm_doctor.model import Finding, Severity, Stage

# vLLM's start-up errors that VD501 and VD208 explain (VD500 points at them)
KV_TOO_SMALL = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \(([\d.]+) GiB\)"
)
ESTIMATED_LENGTH = re.compile(r"estimated maximum model length is (\d+)")
DUPLICATE_LAYER = re.compile(r"Duplicate layer name: ([^\s]+)")

_CAPTURE_COPY = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture",)
_CAPTURE_SYNC = (
    "cudaErrorStreamCaptureInvalidated",
    "operation not permitted when stream is capturing",
    "cudaErrorStreamCaptureUnsupported",
    "captures_underway",
)
_CAUSE_FIX = {
    "tensor on another device": (
        "create it without an explicit device in __init__ (vLLM's device context places it) or register it as a "
        "buffer; never build it with torch.from_numpy"
    ),
    "host tensor copied in forward": (
        "build the tensor once in __init__ as a buffer on the model's device (no .to(device) in forward); CUDA "
        "graphs cannot capture a copy from unpinned host memory"
    ),
    "tensor created on another device in forward": "create it with device=x.device (or as a buffer in __init__)",
    "host sync in forward": (
        "keep the value on the device (no .item()/.tolist()/int(tensor) in forward); CUDA graph capture cannot "
        "read a device value on the host"
    ),
    "data-dependent shape": "use fixed-shape ops (masking, torch.where) instead of nonzero / boolean indexing",
}


def start_failure_causes(error: str, diagnosis: EngineFacts | None) -> list[dict[str, Any]]:
    """What an eager re-run of the same model found that explains ``error``, most likely first."""
    if diagnosis is None or not diagnosis.started:
        return []
    causes: list[dict[str, Any]] = []
    for w in diagnosis.workers:
        for t in w.placement.misplaced if w.placement is not None else []:
            causes.append(
                {
                    "kind": "tensor on another device",
                    "subject": t.name,
                    "detail": f"{t.kind} {t.name} ({t.module_class}, {t.dtype}) is on {t.device}",
                    "where": [],
                }
            )
        for e in ((w.get("profile") or {}).get("probe") or {}).get("events") or []:
            kind = {
                "cross_device_copy": "host tensor copied in forward",
                "wrong_device_create": "tensor created on another device in forward",
                "host_sync": "host sync in forward",
                "data_dependent": "data-dependent shape",
            }.get(e.get("kind", ""))
            if kind is None or e.get("vllm_builtin"):
                continue
            causes.append(
                {
                    "kind": kind,
                    "subject": e.get("module") or "<model>",
                    "detail": f"{e.get('op')} in {e.get('module') or '<model>'} ({e.get('module_class')})",
                    "where": list(e.get("where") or []),
                }
            )
    copy_first = any(m in error for m in _CAPTURE_COPY)
    sync_first = any(m in error for m in _CAPTURE_SYNC)
    order = (
        ["host tensor copied in forward", "tensor on another device", "tensor created on another device in forward"]
        if copy_first
        else ["host sync in forward", "data-dependent shape"]
        if sync_first
        else []
    )
    causes.sort(key=lambda c: order.index(c["kind"]) if c["kind"] in order else len(order))
    for c in causes:
        c["fix"] = _CAUSE_FIX[c["kind"]]
    return causes


@check(
    "VD500",
    "engine-failed-to-start",
    "vLLM could not build, load, capture or run the model: its error, the phase, and the cause.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="start-up",
    reads_startup_error=True,
    what=(
        "The engine stage starts a real engine in the execution mode vLLM would serve with (on a GPU: torch.compile "
        "and CUDA graphs, unless you pass vLLM's own flags or --eager). When vLLM refuses, this finding carries its "
        "exception and the phase it failed in (load, profile run, KV cache allocation, graph capture, first step). "
        "If the mode was not eager, the doctor re-runs the model in eager mode with its op probe and names the cause: "
        "module, file:line, the op, and the fix."
    ),
    why=(
        "A model that runs eagerly can still fail to serve: CUDA graph capture rejects host syncs (`.item()`), "
        "copies from unpinned host memory and data-dependent shapes, and vLLM's message names none of your code."
    ),
    example=(
        "self.scale = torch.from_numpy(np.ones(hidden))   # float64 on the CPU\n"
        "...\n"
        "def forward(...): x = x * self.scale.to(x.device)  # capture: Cannot copy between CPU and CUDA tensors"
    ),
    fix=(
        "Do what the cause says (buffers made in __init__ on the model's device, no host reads in forward); "
        "`--eager` (vLLM's enforce_eager) serves without graphs meanwhile, more slowly."
    ),
    references=("vllm/v1/worker/gpu_model_runner.py:capture_model", "vllm-project/vllm#10439"),
    requires=("engine-facts",),
)
def engine_failed_to_start(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    mode = wire.write(facts.mode)  # as the evidence shows it
    mode_text = facts.mode.summary or ("eager" if facts.mode.enforce_eager else "vLLM's default execution mode")
    error = facts.startup_error or facts.runtime_error
    if error is None:
        if facts.started:
            yield emit.ok(f"the engine started ({mode_text}) and ran the workload", "engine start-up", {"mode": mode})
        return
    phase = facts.startup_phase or ("first step" if facts.runtime_error else "engine start-up")
    first = error.splitlines()[0][:400]
    causes = start_failure_causes(error, facts.diagnosis)
    evidence: dict[str, Any] = {"vllm_error": error[:2000], "phase": phase, "mode": mode, "causes": causes[:20]}
    if facts.startup_function:
        evidence["vllm_function"] = facts.startup_function
    message = f"vLLM failed in {phase} ({mode_text}): {first}"
    see = [code for code, pattern in (("VD501", KV_TOO_SMALL), ("VD208", DUPLICATE_LAYER)) if pattern.search(error)]
    if see:
        message += f" (see {', '.join(see)})"
    if facts.class_import_errors:  # vLLM said only "failed to be inspected": the class's own error
        said = f"vLLM failed in {phase} ({mode_text}): {informative_line(error, 400).rstrip('.')}"
        yield _class_import_failure(facts, emit, said, evidence, phase)
        return
    if mode.get("enforce_eager"):
        hint = "it fails in eager mode: fix what the error names"
    else:
        hint = "run with --eager to see whether the model itself works, then fix what the error names"
    own_line = re.search(r" at (\S+:\d+ in \S+)\)?$", first)
    if own_line:
        hint = f"fix the line named ({own_line.group(1)}); it fails the same way in every process vLLM starts"
    if causes:
        top = causes[0]
        where = f" at {top['where'][-1]}" if top["where"] else ""
        message += f"; cause: {top['kind']}: {top['detail']}{where}"
        hint = top["fix"]
    elif facts.diagnosis is not None:
        d = facts.diagnosis
        eager_error = d.startup_error or d.runtime_error
        if eager_error or not d.started:
            message += "; it fails in eager mode too: " + (eager_error or "no worker replied").splitlines()[0][:200]
        else:
            message += "; in eager mode it runs, and the op probe saw nothing that explains the failure"
    yield emit.fail(message, f"engine start-up / {phase}", evidence, hint)


def _class_import_failure(
    facts: EngineFacts, emit: Emit, message: str, evidence: dict[str, Any], phase: str
) -> Finding:
    """VD500 when vLLM's registry could not inspect the model class: vLLM imported it in a
    subprocess whose traceback went to the log; the engine child imported it again
    (``compat/runtime.uninspectable_classes``) and this finding says what the import raised and
    where, as VD106 does in ``check``."""
    record = facts.class_import_errors[0]
    target = str(record.get("target") or "?")
    said, found, fix = class_import_failure(
        target, str(record.get("import_error") or ""), str(record.get("import_error_summary") or "")
    )
    line = import_error_line(str(record.get("import_error") or ""), record.get("module_file"))
    message += f"; cause: {said}" + (f" (at {line})" if line else "")
    evidence = {
        **evidence,
        **found,
        "module_file": record.get("module_file"),
        "classes": [r.get("target") for r in facts.class_import_errors],
    }
    return emit.fail(message, f"engine start-up / {phase}", evidence, f"fix the import; {fix}")
