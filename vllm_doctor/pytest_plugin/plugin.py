"""Fixtures and options for checking a model in the author's own test suite.

    def test_my_model_is_servable(vllm_doctor_check):
        report = vllm_doctor_check("path/to/model")
        vllm_doctor_check.assert_clean(report)            # no error-severity finding

Options: ``--vllm-doctor-fail-on {error,warn,info}``, ``--vllm-doctor-fast``. Reports are cached
per (path, options) for the session, so many tests on one model pay for one check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from vllm_doctor.model import Report, Severity


@dataclass
class DoctorSession:
    fail_on: Severity = Severity.ERROR
    fast: bool = False
    cache: dict[tuple[Any, ...], Report] = field(default_factory=dict)

    def check(
        self, model: str, *, trust_remote_code: bool = False, select: Iterable[str] = (), ignore: Iterable[str] = ()
    ) -> Report:
        from vllm_doctor.api import check

        key = (str(model), trust_remote_code, tuple(sorted(select)), tuple(sorted(ignore)), self.fast)
        if key not in self.cache:
            self.cache[key] = check(
                str(model), trust_remote_code=trust_remote_code, fast=self.fast, select=select, ignore=ignore
            )
        return self.cache[key]


SESSION_KEY = pytest.StashKey[DoctorSession]()


class DoctorCheck:
    """The ``vllm_doctor_check`` fixture: call it with a model path; assert with assert_clean."""

    def __init__(self, session: DoctorSession) -> None:
        self._session = session

    def __call__(self, model: str, **kwargs: Any) -> Report:
        return self._session.check(model, **kwargs)

    def assert_clean(self, report: Report, fail_on: Severity | str | None = None) -> None:
        threshold = Severity(fail_on) if fail_on is not None else self._session.fail_on
        found = report.problems(threshold)
        if found:
            lines = [
                f"{f.code} [{f.severity.value}] {f.subject}: {f.message}" + (f"\n    fix: {f.hint}" if f.hint else "")
                for f in found
            ]
            pytest.fail(
                f"vllm-doctor found {len(found)} problem(s) in {report.target}:\n" + "\n".join(lines), pytrace=False
            )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vllm-doctor")
    group.addoption(
        "--vllm-doctor-fail-on",
        choices=[s.value for s in Severity],
        default="error",
        help="lowest severity that fails vllm_doctor_check.assert_clean (default: error)",
    )
    group.addoption("--vllm-doctor-fast", action="store_true", help="fast pass only (no vLLM import)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[SESSION_KEY] = DoctorSession(
        fail_on=Severity(config.getoption("--vllm-doctor-fail-on")),
        fast=bool(config.getoption("--vllm-doctor-fast")),
    )


@pytest.fixture
def vllm_doctor_check(request: pytest.FixtureRequest) -> DoctorCheck:
    """Run vllm-doctor on a model directory; ``.assert_clean(report)`` fails with every finding."""
    return DoctorCheck(request.config.stash[SESSION_KEY])
