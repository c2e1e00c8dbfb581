"""The doctor's data model: plain dataclasses shared by every front end.

Nothing here imports vLLM, torch or NVML. Every front end (CLI, pytest plugin, reports, TUI)
reads and writes these types, and :meth:`Report.to_dict` is the one JSON schema
(``SCHEMA_VERSION``) they all emit; ``docs/report-schema.json`` documents it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = "1.0"


class Outcome(str, enum.Enum):
    """What happened when a check ran against one subject."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"  # could not run: a prerequisite is unavailable (reason in the message)
    NOT_APPLICABLE = "not_applicable"  # nothing to check here (e.g. no plugins installed)
    CRASH = "crash"  # the check itself raised; the run went on


class Severity(str, enum.Enum):
    ERROR = "error"
    WARN = "warn"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"info": 0, "warn": 1, "error": 2}[self.value]


class Stage(str, enum.Enum):
    STATIC = "static"  # config.json, vLLM's registry tables, plugin entry points, the model class
    ENGINE = "engine"  # inside a running engine's workers
    LIVE = "live"  # while serving


@dataclass(frozen=True)
class Explanation:
    what: str
    why: str
    example: str
    fix: str
    references: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckMeta:
    """Static description of one check; ``vllm-doctor rule CODE`` renders it."""

    code: str  # stable, e.g. "VD101"
    name: str  # kebab-case, names the problem: "architecture-not-registered"
    summary: str
    explanation: Explanation
    severity: Severity
    stage: Stage
    requires: tuple[str, ...] = ()  # facts it needs: "config", "registry", "model_class", ...
    # codes (or prefixes) that name the cause of this check's failure when they fail in the same
    # run: then this check says so in a skip instead of reporting the same cause twice
    defers_to: tuple[str, ...] = ()
    # what the check is about ("registry", "weights", "placement", "kv-cache", ...: one of
    # vllm_doctor.checks.base.TOPICS); front ends pick checks by topic (checks.base.codes_for)
    topic: str = ""
    # the check reads vLLM's own start-up error (an engine that did not start), not only the workers
    reads_startup_error: bool = False
    # the other severities its findings take where the case says so (VD206: an error where the
    # installed vLLM requires the method); the catalogue and `rule` name them beside ``severity``
    also: tuple[Severity, ...] = ()

    @property
    def severity_text(self) -> str:
        """``warn`` or ``warn (or error)``: every severity the check's findings can have."""
        others = " or ".join(s.value for s in self.also)
        return f"{self.severity.value} (or {others})" if others else self.severity.value

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.value
        data["also"] = [s.value for s in self.also]
        data["stage"] = self.stage.value
        data["explanation"]["references"] = list(self.explanation.references)
        data["requires"] = list(self.requires)
        data["defers_to"] = list(self.defers_to)
        return data


@dataclass
class Finding:
    """One result of one check for one subject."""

    code: str
    outcome: Outcome
    severity: Severity
    message: str
    subject: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    hint: str = ""

    @property
    def is_problem(self) -> bool:
        return self.outcome in (Outcome.FAIL, Outcome.WARN, Outcome.CRASH)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "outcome": self.outcome.value,
            "severity": self.severity.value,
            "message": self.message,
            "subject": self.subject,
            "evidence": self.evidence,
            "hint": self.hint,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            code=data["code"],
            outcome=Outcome(data["outcome"]),
            severity=Severity(data["severity"]),
            message=data["message"],
            subject=data.get("subject", ""),
            evidence=dict(data.get("evidence", {})),
            hint=data.get("hint", ""),
        )


def report_order(finding: Finding) -> tuple[int, int, str, str]:
    """Where a finding stands in a report: problems first, the most severe first, then by code
    and subject (stable: the same findings always come out in the same order)."""
    if finding.is_problem:
        return (0, -finding.severity.rank, finding.code, finding.subject)
    return (1, 0, finding.code, finding.subject)


def _json(value: Any) -> Any:
    """A section's entry as report.json holds it: a record (anything with ``to_json``, e.g.
    :class:`vllm_doctor.facts.wire.Record`) written, plain JSON as it is."""
    if isinstance(value, (list, tuple)):  # a list of records (facts["plugins"])
        return [_json(v) for v in value]
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


# what reads a section's entry back into its record: (section, key) -> reader, e.g.
# ("profiles", "engine") -> EngineProfile.of (vllm_doctor.analysis.records.SECTIONS)
SectionReaders = Mapping[tuple[str, str], Callable[[Any], Any]]


@dataclass
class Report:
    """Everything one doctor run found: environment, findings, timings, profiles.

    ``facts`` and ``profiles`` hold records where the doctor has one (the engine's anatomy and
    profile, the workload, the A/B: :data:`vllm_doctor.analysis.records.SECTIONS`) and plain JSON
    for the rest; :meth:`to_dict` writes the records, :meth:`from_dict` reads them back."""

    target: str
    environment: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # probe snapshots worth keeping: records or JSON
    profiles: dict[str, Any] = field(default_factory=dict)

    def problems(self, at_least: Severity = Severity.INFO) -> list[Finding]:
        """Findings that count against the exit code at the given threshold, the most severe first."""
        return sorted(
            (
                f
                for f in self.findings
                if f.outcome in (Outcome.FAIL, Outcome.WARN, Outcome.CRASH) and f.severity.rank >= at_least.rank
            ),
            key=report_order,
        )

    def by_code(self, code: str) -> list[Finding]:
        return [f for f in self.findings if f.code == code]

    def merge(self, other: Report) -> Report:
        """Add ``other``'s findings, facts, profiles and timings to this report (in place; returns it).

        The engine stage's report merges into the static stage's this way (``check --engine``): its
        findings join these in report order (:func:`report_order`), its facts and profiles are added by key (``other``'s
        win), and an environment this report lacks is taken from ``other``."""
        self.findings = sorted(self.findings + other.findings, key=report_order)
        self.facts.update(other.facts)
        self.profiles.update(other.profiles)
        self.timings.update(other.timings)
        for key, value in other.environment.items():
            self.environment.setdefault(key, value)
        return self

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.outcome.value] = counts.get(f.outcome.value, 0) + 1
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "vllm-doctor",
            "target": self.target,
            "environment": self.environment,
            "summary": counts,
            "findings": [f.to_dict() for f in sorted(self.findings, key=report_order)],
            "timings": self.timings,
            "facts": {k: _json(v) for k, v in self.facts.items()},
            "profiles": {k: _json(v) for k, v in self.profiles.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], records: SectionReaders | None = None) -> Report:
        """The report from its JSON; ``records`` read the sections that have a record
        (:func:`vllm_doctor.analysis.records.read_report` passes them all); without it the
        sections stay JSON."""
        readers = records or {}

        def section(name: str) -> dict[str, Any]:
            given = data.get(name)
            entries = dict(given) if isinstance(given, dict) else {}
            return {k: readers[(name, k)](v) if (name, k) in readers else v for k, v in entries.items()}

        return cls(
            target=data["target"],
            environment=dict(data.get("environment", {})),
            findings=[Finding.from_dict(f) for f in data.get("findings", [])],
            timings=dict(data.get("timings", {})),
            facts=section("facts"),
            profiles=section("profiles"),
        )
