"""VD400: the doctor's own hooks inside the workers (topic ``doctor``).

The profile part stays the worker's ``doctor_collect`` reply (its steps are read by
:meth:`~vllm_doctor.facts.engine.WorkerFacts.steps`).
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import profiles, subject
from vllm_doctor.facts.engine import EngineFacts
from vllm_doctor.model import Finding, Outcome, Severity, Stage


@check(
    "VD400",
    "doctor-probe-crashed",
    "A doctor hook inside a worker raised; it switched itself off and the engine kept serving.",
    severity=Severity.WARN,
    stage=Stage.ENGINE,
    topic="doctor",
    what=(
        "The doctor's forward profiler and probe run as hooks inside vLLM's workers. Each one runs under a guard: if "
        "it raises, the guard records the error, switches that piece off and returns, so vLLM's own forward goes on "
        "untouched."
    ),
    why=(
        "Part of the profile is missing (per-step or per-layer timings, or the VD403/VD404 probe) and the cause is in "
        "the doctor, not in your model."
    ),
    example="crash in component 'layers' at step 12: AttributeError: ...",
    fix=(
        "Report it with the traceback (vllm-doctor and vLLM versions are in the report); meanwhile attach with "
        "layers=False or probe=False."
    ),
    requires=("engine",),
)
def doctor_probe_crashed(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = profiles(facts, emit)
    yield from crashes
    found = bool(crashes)
    for w, profile in pairs:
        for c in profile.get("crashes", []):
            found = True
            yield Finding(
                code=emit.meta.code,
                outcome=Outcome.CRASH,
                severity=Severity.WARN,
                message=(
                    f"the doctor's {c.get('component')!r} hook raised at step {c.get('step')}: {c.get('type')}: "
                    f"{c.get('message')}; it was switched off"
                ),
                subject=subject(w),
                evidence={"traceback": c.get("traceback", ""), "component": c.get("component")},
                hint="the engine kept serving and its outputs are unaffected; please report this traceback",
            )
    if not found:
        yield emit.ok("no doctor hook raised")
