"""The check catalogue: one function per check, registered with :func:`check`.

A check is a pure function ``(facts, emit) -> Iterable[Finding]`` over a snapshot that was
complete before any check ran; it only reads. Its metadata (:class:`CheckMeta`) is the single
source of the catalogue (``vllm-doctor rules``), the README table and the docs.

``requires=`` names *gates* (:func:`gate`): each one looks at the facts and returns the
``skip`` / ``not_applicable`` finding to give instead of running the check, or ``None``. The
runner (:func:`run_checks`) evaluates a check's gates in order, so a check's body starts where
its inputs are known to be there. A gate registered with ``after_import=True`` needs the
import pass (or the weights pass that runs beside it): such checks wait for it.

Every check has one *topic* (:data:`TOPICS`): what it is about. Front ends ask for checks by
topic (:func:`codes_for`) instead of keeping lists of codes: the pytest plugin's assertions,
the weights pass, the report view's KV pane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vllm_doctor.model import CheckMeta, Explanation, Finding, Outcome, Severity, Stage
from vllm_doctor.units import clip

F = TypeVar("F")


@dataclass(frozen=True)
class Check(Generic[F]):
    meta: CheckMeta
    run: Callable[[F], Iterable[Finding]]


CATALOGUE: dict[str, Check[Any]] = {}

# topic -> what its checks are about (each check has exactly one; `vllm-doctor rules` shows it)
TOPICS: dict[str, str] = {
    "registry": "how vLLM finds the model class: registrations, plugins, the Transformers fallback",
    "config": "config.json as vLLM and transformers read it",
    "contract": "what vLLM expects of a model class: constructor, forward, attention prefixes, a model it can build",
    "weights": "the checkpoint against the model's parameters",
    "ranks": "the model split over tensor- and pipeline-parallel ranks",
    "start-up": "the engine starting in vLLM's execution mode",
    "placement": "the device and dtype of each worker's tensors",
    "probe": "what the forward pass does op by op: devices, host syncs",
    "kv-cache": "the KV cache's size, spec and pressure",
    "memory": "where a worker's memory goes",
    "performance": "why the model is slower than it should be: fusion, vLLM's layers, compilation, Python loops",
    "doctor": "the doctor's own passes and hooks",
}


@dataclass(frozen=True)
class Gate:
    name: str
    test: Callable[[Any, Emit], Finding | None]  # the finding to give instead, or None
    after_import: bool = False


GATES: dict[str, Gate] = {}
T = TypeVar("T")


def gate(
    name: str, *, after_import: bool = False
) -> Callable[[Callable[[Any, Emit], Finding | None]], Callable[[Any, Emit], Finding | None]]:
    """Register a gate that checks can name in ``requires=``."""

    def decorate(fn: Callable[[Any, Emit], Finding | None]) -> Callable[[Any, Emit], Finding | None]:
        if name in GATES:
            raise ValueError(f"duplicate gate {name}")
        GATES[name] = Gate(name, fn, after_import)
        return fn

    return decorate


def needs_import(code: str) -> bool:
    """Does the check need the import pass (one of its gates says so)?"""
    return any(GATES[name].after_import for name in CATALOGUE[code].meta.requires)


LIST_LIMIT = 20  # items of a config.json list a message or an evidence field repeats


def capped(items: Any, limit: int = LIST_LIMIT) -> Any:
    """A list cut to its first ``limit`` items plus one ``"... (N more)"`` entry; anything else as is.

    Findings repeat config.json's lists (``architectures``) in messages and evidence: cut, a
    10,000-name list costs each finding a constant, so the report stays linear in the input."""
    if not isinstance(items, list) or len(items) <= limit:
        return items
    return [*items[:limit], f"... ({len(items) - limit} more)"]


def shown(value: Any, limit: int = LIST_LIMIT, chars: int = 2000) -> str:
    """``repr`` of :func:`capped` ``value``, at most ``chars`` characters."""
    text = repr(capped(value, limit))
    return text if len(text) <= chars else f"{text[:chars]}... ({len(text)} characters)"


MAX_REPEATED = 20  # findings one check gives about one kind of problem; the rest become one summary
MAX_LISTED = 10_000  # subjects a summary finding's evidence names (a million tensors: the first 10,000)
_OUTCOME_ORDER = {Outcome.CRASH: 0, Outcome.FAIL: 1, Outcome.WARN: 2}


def crashed(code: str, exc: Exception) -> Finding:
    """The finding of a check that raised (called in its ``except``: the traceback is the current one)."""
    import traceback

    return Finding(
        code=code,
        outcome=Outcome.CRASH,
        severity=Severity.ERROR,
        message=f"the check itself failed: {type(exc).__name__}: {exc}",
        evidence={"traceback": traceback.format_exc()},
        hint="this is a vllm-doctor bug; please report it with the traceback",
    )


def capped_findings(
    findings: Iterable[Finding],
    emit: Emit,
    what: str,
    *,
    limit: int = MAX_REPEATED,
    total: int | None = None,
    subject: str | None = None,
) -> list[Finding]:
    """At most ``limit`` of ``findings`` plus ONE summary ``"... and N more <what> (see the JSON
    report's evidence)"``, so that one problem repeated per tensor, per index entry or per plugin
    costs the report a constant.

    The findings shown are the worst first (fail before warn, error before info; otherwise in the
    order given). The summary takes the worst outcome and severity of the findings it stands for,
    and its evidence names them: ``subjects`` (the first :data:`MAX_LISTED`), ``not_shown`` and
    ``severities`` (how many of each). ``total``: how many there are when the caller built only
    the first ones (as VD101 does, where each finding costs a registry search); the summary then
    takes the shown findings' worst outcome and lists no subjects. ``subject``: the summary's
    subject (default ``"(N more)"``).
    """
    ordered = sorted(findings, key=lambda f: (_OUTCOME_ORDER.get(f.outcome, 3), -f.severity.rank))
    shown, rest = ordered[:limit], ordered[limit:]
    more = len(rest) if total is None else max(0, total - len(shown))
    if not more:
        return shown
    like = rest or shown
    worst = min(like, key=lambda f: (_OUTCOME_ORDER.get(f.outcome, 3), -f.severity.rank))
    severities: dict[str, int] = {}
    for f in rest:
        severities[f.severity.value] = severities.get(f.severity.value, 0) + 1
    evidence: dict[str, Any] = {"not_shown": more}
    if rest:
        evidence["subjects"] = [f.subject for f in rest[:MAX_LISTED]]
        evidence["severities"] = severities
        if len(rest) > MAX_LISTED:
            evidence["subjects_not_listed"] = len(rest) - MAX_LISTED
    message = f"... and {more} more {what} (see the JSON report's evidence)"
    summary = Finding(
        code=emit.meta.code,
        outcome=worst.outcome,
        severity=worst.severity,
        message=message,
        subject=subject or f"({more} more)",
        evidence=evidence,
        hint=worst.hint,
    )
    return [*shown, summary]


def informative_line(summary: str, limit: int = 600) -> str:
    """The informative line of vLLM's error: pydantic wraps vLLM's own message in `Value error, ...`."""
    lines = [line.strip() for line in summary.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Value error, "):
            return clip(f"{lines[0]}: {line[len('Value error, ') :].split(' [type=')[0]}", limit)
    return clip(" ".join(lines), limit)


def known(value: T | None) -> T:
    """A value a gate has already established (for the type checker; a gate bug raises here)."""
    if value is None:
        raise RuntimeError("a check ran without the input its gate guarantees")
    return value


class Emit:
    """Builds findings for one check (keeps code/severity consistent)."""

    def __init__(self, meta: CheckMeta) -> None:
        self.meta = meta

    def _make(
        self,
        outcome: Outcome,
        message: str,
        subject: str,
        evidence: dict[str, Any] | None,
        hint: str,
        severity: Severity | None,
    ) -> Finding:
        return Finding(
            code=self.meta.code,
            outcome=outcome,
            severity=severity or self.meta.severity,
            message=message,
            subject=subject,
            evidence=evidence or {},
            hint=hint,
        )

    def fail(
        self,
        message: str,
        subject: str = "",
        evidence: dict[str, Any] | None = None,
        hint: str = "",
        severity: Severity | None = None,
    ) -> Finding:
        return self._make(Outcome.FAIL, message, subject, evidence, hint, severity)

    def warn(
        self,
        message: str,
        subject: str = "",
        evidence: dict[str, Any] | None = None,
        hint: str = "",
        severity: Severity | None = None,
    ) -> Finding:
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
    topic: str,
    references: tuple[str, ...] = (),
    requires: tuple[str, ...] = (),
    defers_to: tuple[str, ...] = (),
    reads_startup_error: bool = False,
    also: tuple[Severity, ...] = (),
) -> Callable[[Callable[[F, Emit], Iterable[Finding]]], Callable[[F, Emit], Iterable[Finding]]]:
    """Register a check. The function receives the facts and an :class:`Emit` for its code.

    ``topic`` is one of :data:`TOPICS`. Every name in ``requires`` must be a gate registered
    before the check (:func:`gate`). ``reads_startup_error``: the check reads vLLM's error when
    the engine did not start (the engine stage runs it on that engine's facts, never only on an
    eager re-run's). ``also``: the other severities its findings can take (given per finding), which
    the catalogue and ``rule`` show beside ``severity``."""
    unknown = [name for name in requires if name not in GATES]
    if unknown:
        raise ValueError(f"{code}: unknown gate(s) {unknown}")
    if topic not in TOPICS:
        raise ValueError(f"{code}: unknown topic {topic!r} (one of {', '.join(TOPICS)})")
    meta = CheckMeta(
        code=code,
        name=name,
        summary=summary,
        explanation=Explanation(what=what, why=why, example=example, fix=fix, references=references),
        severity=severity,
        stage=stage,
        requires=requires,
        defers_to=defers_to,
        topic=topic,
        reads_startup_error=reads_startup_error,
        also=also,
    )

    def decorate(fn: Callable[[F, Emit], Iterable[Finding]]) -> Callable[[F, Emit], Iterable[Finding]]:
        if code in CATALOGUE:
            raise ValueError(f"duplicate check code {code}")
        emit = Emit(meta)
        CATALOGUE[code] = Check(meta=meta, run=lambda facts: fn(facts, emit))
        return fn

    return decorate


# code -> what the check can tell from config.json alone, for ``check --fast`` (no vLLM import):
# a check that needs the import pass registers one with :func:`from_config` (same code, its own
# words); the full check never runs it, it has vLLM's own answer
FROM_CONFIG: dict[str, Callable[[Any, Emit], Iterable[Finding]]] = {}


def from_config(
    code: str,
) -> Callable[[Callable[[F, Emit], Iterable[Finding]]], Callable[[F, Emit], Iterable[Finding]]]:
    """Register what the import-pass check ``code`` finds in config.json alone (``check --fast``)."""

    def decorate(fn: Callable[[F, Emit], Iterable[Finding]]) -> Callable[[F, Emit], Iterable[Finding]]:
        if code not in CATALOGUE or code in FROM_CONFIG:
            raise ValueError(f"{code}: from_config needs a registered check, once")
        if not needs_import(code):
            raise ValueError(f"{code} runs in --fast already")
        FROM_CONFIG[code] = fn
        return fn

    return decorate


def run_from_config(facts: Any, code: str) -> list[Finding]:
    """The problems :data:`FROM_CONFIG`'s function for ``code`` finds in config.json (none: [], also
    for a code without one); a function that raises is a ``crash`` finding, as in :func:`run_checks`."""
    fn = FROM_CONFIG.get(code)
    if fn is None:
        return []
    try:
        return [f for f in fn(facts, Emit(CATALOGUE[code].meta)) if f.is_problem]
    except Exception as exc:  # a bug in a check must not hide the other findings
        return [crashed(code, exc)]


def codes_for(*topics: str, stage: Stage | None = None, at_least: Severity | None = None) -> tuple[str, ...]:
    """The catalogue's codes of any of ``topics`` (sorted), of ``stage`` only if given, and only
    those whose default severity is ``at_least`` if given (the pytest plugin's assertions take
    the error-level checks of their topics)."""
    unknown = [t for t in topics if t not in TOPICS]
    if unknown:
        raise ValueError(f"unknown topic(s) {unknown} (one of {', '.join(TOPICS)})")
    return tuple(
        code
        for code in sorted(CATALOGUE)
        if (meta := CATALOGUE[code].meta).topic in topics
        and (stage is None or meta.stage is stage)
        and (at_least is None or meta.severity.rank >= at_least.rank)
    )


def reads_startup_error(code: str) -> bool:
    """Does the check read vLLM's own error when the engine did not start?"""
    return CATALOGUE[code].meta.reads_startup_error


def _matches(code: str, patterns: Iterable[str]) -> bool:
    return any(code.startswith(p) for p in patterns)


def select_codes(stages: Iterable[Stage], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[str]:
    """The catalogue's codes of ``stages``, narrowed by ``--select`` / ``--ignore`` prefixes."""
    stages, select, ignore = set(stages), set(select), set(ignore)
    return [
        c
        for c in sorted(CATALOGUE)
        if CATALOGUE[c].meta.stage in stages and (not select or _matches(c, select)) and not _matches(c, ignore)
    ]


def _deferred(meta: CheckMeta, produced: list[Finding], earlier: list[Finding], emit: Emit) -> list[Finding]:
    """A check whose failure an earlier failing check already explains (``meta.defers_to``)
    skips and names that check, so that one cause is reported once."""
    if not meta.defers_to or not any(f.outcome is Outcome.FAIL for f in produced):
        return produced
    causes = sorted({f.code for f in earlier if f.outcome is Outcome.FAIL and _matches(f.code, meta.defers_to)})
    if not causes:
        return produced
    first = next(f for f in produced if f.outcome is Outcome.FAIL)
    return [
        emit.skip(clip(f"{', '.join(causes)} names the cause of this failure: {first.message}", 800), first.subject)
    ]


def run_checks(facts: Any, codes: Iterable[str]) -> list[Finding]:
    """Run each check behind its gates; one that raises becomes a ``crash`` finding and the run
    goes on."""
    findings: list[Finding] = []
    for code in codes:
        entry = CATALOGUE[code]
        emit = Emit(entry.meta)
        try:
            for name in entry.meta.requires:
                instead = GATES[name].test(facts, emit)
                if instead is not None:
                    findings.append(instead)
                    break
            else:
                findings.extend(_deferred(entry.meta, list(entry.run(facts)), findings, emit))
        except Exception as exc:  # a bug in a check must not hide the other findings
            findings.append(crashed(code, exc))
    return findings
