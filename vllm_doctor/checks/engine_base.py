"""What every engine-stage check shares: its two gates, each worker's record, subjects, caps.

The engine-stage checks (:mod:`~vllm_doctor.checks.startup`, :mod:`~vllm_doctor.checks.placement`,
:mod:`~vllm_doctor.checks.probe`, :mod:`~vllm_doctor.checks.ranks`,
:mod:`~vllm_doctor.checks.kv_cache`, :mod:`~vllm_doctor.checks.memory`,
:mod:`~vllm_doctor.checks.attention`, :mod:`~vllm_doctor.checks.doctor`) read an
:class:`EngineFacts` snapshot gathered through the doctor's worker extension
(``vllm-doctor check DIR --engine`` or ``vllm_doctor.attach(llm)``). A worker-side probe that
failed becomes a ``crash`` finding of every check that needed it; the engine kept serving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from vllm_doctor.checks.base import Emit, gate
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.kv import KvCache
from vllm_doctor.facts.memory import MemoryFacts
from vllm_doctor.facts.placement import Placement
from vllm_doctor.facts.quant import QuantFacts
from vllm_doctor.model import Finding, Outcome, Severity

R = TypeVar("R")

MAX_FINDINGS_PER_WORKER = 10
NEEDS_ENGINE = "engine stage: run `vllm-doctor check MODEL --engine`, or vllm_doctor.attach(llm) in your script"


def subject(w: WorkerFacts, dev: str | None = None) -> str:
    """``rank 1`` or ``rank 1 / cuda:1``: the subject of a worker's findings."""
    return f"rank {w.rank}" + (f" / {dev}" if dev else "")


def crash(emit: Emit, w: WorkerFacts, part: str, error: dict[str, Any]) -> Finding:
    """The finding for a worker whose probe of ``part`` raised (the engine kept serving)."""
    return Finding(
        code=emit.meta.code,
        outcome=Outcome.CRASH,
        severity=Severity.ERROR,
        message=f"the worker-side probe for {part!r} failed: {error.get('type')}: {error.get('message')}",
        subject=subject(w),
        evidence={"traceback": error.get("traceback", "")},
        hint=(
            "the engine kept serving; this is a vllm-doctor bug or an incompatibility with this vLLM: please report it"
        ),
    )


@gate("engine-facts")
def engine_facts(facts: Any, emit: Emit) -> Finding | None:
    """The facts come from an engine (``check --engine`` or ``attach``), started or not."""
    return None if isinstance(facts, EngineFacts) else emit.skip(NEEDS_ENGINE)


@gate("engine")
def engine_started(facts: Any, emit: Emit) -> Finding | None:
    """As ``engine-facts``, and the engine started and its workers answered."""
    instead = engine_facts(facts, emit)
    if instead is not None or facts.started:
        return instead
    if facts.runtime_error:
        return emit.skip(f"the engine started, then the workload failed: {facts.runtime_error.splitlines()[0][:300]}")
    return emit.skip(f"the engine did not start: {(facts.startup_error or 'no worker replied').splitlines()[0][:300]}")


def _workers(
    facts: EngineFacts, emit: Emit, part: str, read: Callable[[WorkerFacts], R | None]
) -> tuple[list[tuple[WorkerFacts, R]], list[Finding]]:
    """Each worker's record of ``part``, and a crash finding for each worker whose probe of it failed."""
    pairs: list[tuple[WorkerFacts, R]] = []
    crashes: list[Finding] = []
    for w in facts.workers:
        if part in w.errors:
            crashes.append(crash(emit, w, part, w.errors[part]))
        elif (record := read(w)) is not None:
            pairs.append((w, record))
    return pairs, crashes


def placements(facts: EngineFacts, emit: Emit) -> tuple[list[tuple[WorkerFacts, Placement]], list[Finding]]:
    """Each worker's :class:`Placement`, and the crash findings of workers whose probe failed."""
    return _workers(facts, emit, "placement", lambda w: w.placement)


def quants(facts: EngineFacts, emit: Emit) -> tuple[list[tuple[WorkerFacts, QuantFacts]], list[Finding]]:
    """Each worker's :class:`QuantFacts` (``doctor_quant``), and the crash findings of workers whose probe failed."""
    return _workers(facts, emit, "quant", lambda w: w.quant)


def kv_caches(facts: EngineFacts, emit: Emit) -> tuple[list[tuple[WorkerFacts, KvCache]], list[Finding]]:
    """Each worker's :class:`KvCache`, and the crash findings of workers whose probe failed."""
    return _workers(facts, emit, "kv", lambda w: w.kv)


def memories(facts: EngineFacts, emit: Emit) -> tuple[list[tuple[WorkerFacts, MemoryFacts]], list[Finding]]:
    """Each worker's :class:`MemoryFacts`, and the crash findings of workers whose probe failed."""
    return _workers(facts, emit, "memory", lambda w: w.memory)


def profiles(facts: EngineFacts, emit: Emit) -> tuple[list[tuple[WorkerFacts, dict[str, Any]]], list[Finding]]:
    """Each worker's ``doctor_collect`` reply (its steps: :meth:`WorkerFacts.steps`), and the
    crash findings of workers whose profiler failed."""
    return _workers(facts, emit, "profile", lambda w: w.get("profile"))


def capped_per_worker(
    findings: list[Finding], emit: Emit, w: WorkerFacts, what: str, total: int, limit: int = MAX_FINDINGS_PER_WORKER
) -> Iterable[Finding]:
    """The first ``limit`` of one worker's ``total`` findings, then one warning that counts the
    rest (the JSON report has every one)."""
    yield from findings[:limit]
    if total > limit:
        yield emit.warn(f"... and {total - limit} more {what} (see the JSON report)", subject(w))


def vllms_own_model(w: WorkerFacts) -> bool:
    """Is the worker's model one of vLLM's own classes? vLLM runs those correctly by definition:
    their layout and layer names are vLLM's choice, not a port's mistake."""
    model_class = w.anatomy.identity.model_class if w.anatomy is not None else None
    return bool(model_class) and str(model_class).startswith("vllm.")
