"""The check catalogue: one function per check, registered with :func:`check`.

A check is a pure function ``(facts) -> Iterable[Finding]``. Its metadata (:class:`CheckMeta`)
is the single source of the catalogue (``vllm-doctor rules``), the README table and the docs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vllm_doctor.model import CheckMeta, Explanation, Finding, Outcome, Severity, Stage

F = TypeVar("F")


@dataclass(frozen=True)
class Check(Generic[F]):
    meta: CheckMeta
    run: Callable[[F], Iterable[Finding]]


CATALOGUE: dict[str, Check[Any]] = {}


class Emit:
    """Builds findings for one check (keeps code/severity consistent)."""

    def __init__(self, meta: CheckMeta) -> None:
        self.meta = meta

    def _make(self, outcome: Outcome, message: str, subject: str, evidence: dict[str, Any] | None, hint: str, severity: Severity | None) -> Finding:
        return Finding(
            code=self.meta.code,
            outcome=outcome,
            severity=severity or self.meta.severity,
            message=message,
            subject=subject,
            evidence=evidence or {},
            hint=hint,
        )

    def fail(self, message: str, subject: str = "", evidence: dict[str, Any] | None = None, hint: str = "", severity: Severity | None = None) -> Finding:
        return self._make(Outcome.FAIL, message, subject, evidence, hint, severity)

    def warn(self, message: str, subject: str = "", evidence: dict[str, Any] | None = None, hint: str = "", severity: Severity | None = None) -> Finding:
        return self._make(Outcome.WARN, message, subject, evidence, hint, severity)

    def ok(self, message: str, subject: str = "", evidence: dict[str, Any] | None = None) -> Finding:
        return self._make(Outcome.PASS, message, subject, evidence, "", None)

    def skip(self, reason: str, subject: str = "") -> Finding:
        return self._make(Outcome.SKIP, reason, subject, None, "", None)

    def not_applicable(self, reason: str, subject: str = "") -> Finding:
        return self._make(Outcome.NOT_APPLICABLE, reason, subject, None, "", None)


def check(
    code: str,
    name: str,
    summary: str,
    *,
    severity: Severity,
    stage: Stage,
    what: str,
    why: str,
    example: str,
    fix: str,
    references: tuple[str, ...] = (),
    requires: tuple[str, ...] = (),
) -> Callable[[Callable[[F, Emit], Iterable[Finding]]], Callable[[F, Emit], Iterable[Finding]]]:
    """Register a check. The function receives the facts and an :class:`Emit` for its code."""
    meta = CheckMeta(
        code=code,
        name=name,
        summary=summary,
        explanation=Explanation(what=what, why=why, example=example, fix=fix, references=references),
        severity=severity,
        stage=stage,
        requires=requires,
    )

    def decorate(fn: Callable[[F, Emit], Iterable[Finding]]) -> Callable[[F, Emit], Iterable[Finding]]:
        if code in CATALOGUE:
            raise ValueError(f"duplicate check code {code}")
        emit = Emit(meta)
        CATALOGUE[code] = Check(meta=meta, run=lambda facts: fn(facts, emit))
        return fn

    return decorate
