"""The pytest plugin (entry point ``pytest11``): a model author's test suite asserts on vLLM.

    def test_servable(vllm_doctor):                   # one session object for the whole run
        vllm_doctor.assert_checks_pass(MODEL, fail_on="warn")
        vllm_doctor.assert_weights_cover(MODEL)
        vllm_doctor.assert_on_device(MODEL)
        vllm_doctor.assert_kv_cache_fits(MODEL, max_model_len=4096)

    def test_matches_reference(vllm_doctor):
        vllm_doctor.assert_logprobs_close(MODEL, reference="hf", hf_class="my_pkg.hf:MyForCausalLM")

``MODEL`` may be left out: ``--vllm-doctor-model DIR`` gives it. Each distinct (model, options)
runs vLLM once per session (in a child process, shut down when its answer is in) and every test
that asks again reads the cached answer. vLLM or the model missing: the test is skipped with the
reason. The engine assertions run vLLM's default execution mode (torch.compile and CUDA graphs
where vLLM would use them), as ``vllm-doctor check --engine`` does, through the same engine stage;
``--vllm-doctor-eager`` runs them eagerly. Options: ``--vllm-doctor-model``,
``--vllm-doctor-fail-on``, ``--vllm-doctor-report FILE`` (the session's JSON report),
``--vllm-doctor-fast``, and every engine option of ``vllm-doctor check --engine`` as
``--vllm-doctor-<flag>`` (``--vllm-doctor-device``, ``--vllm-doctor-eager``,
``--vllm-doctor-max-model-len``, ...: generated from :class:`vllm_doctor.api.EngineOptions`); an
assertion's keyword (``assert_on_device(MODEL, eager=True)``) overrides the session's option.
Tests that use the fixture carry the ``vllm_doctor`` marker (``-m vllm_doctor`` selects them).

This module holds the hooks and the options; the session object is in :mod:`.session`, the
fixtures in :mod:`.fixtures`.
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_doctor.files import write_json_atomic
from vllm_doctor.model import Severity
from vllm_doctor.pytest_plugin.fixtures import vllm_doctor, vllm_doctor_check
from vllm_doctor.pytest_plugin.session import SESSION_KEY, DoctorSession
from vllm_doctor.stages.options import (
    NOT_GIVEN,
    PAIRS,
    EngineOptions,
    add_arguments,
    from_values,
    ini_name,
    specs,
    value_from_text,
)

# the fixtures are found in this module (the pytest11 entry point)
__all__ = ["pytest_addoption", "pytest_configure", "vllm_doctor", "vllm_doctor_check"]

MARKER = "vllm_doctor"
PREFIX = "vllm-doctor-"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vllm-doctor", "vllm-doctor: runtime assertions about a vLLM model")
    group.addoption(
        "--vllm-doctor-model",
        metavar="DIR",
        default=None,
        help="model directory the vllm_doctor fixture's assertions use when a test names none",
    )
    group.addoption(
        "--vllm-doctor-fail-on",
        choices=[s.value for s in Severity],
        default="error",
        help="lowest severity that fails assert_checks_pass / assert_clean (default: error)",
    )
    group.addoption(
        "--vllm-doctor-report",
        metavar="FILE",
        default=None,
        help="write the session's vllm-doctor results (every assertion, parity tables) to FILE as JSON",
    )
    group.addoption("--vllm-doctor-fast", action="store_true", help="static checks: fast pass only (no vLLM import)")
    # the engine options, generated from EngineOptions as the command line's and the API's are:
    # --vllm-doctor-device, --vllm-doctor-eager, --vllm-doctor-max-model-len, ...
    add_arguments(group.addoption, prefix=PREFIX, short=False)
    for spec in specs():  # and as ini keys (pytest.ini, pyproject.toml): vllm_doctor_device = cpu
        help = f"as --{PREFIX}{spec.flag} (the command line wins)"
        if spec.kind == PAIRS:
            parser.addini(ini_name(spec, PREFIX), help, type="linelist")
        else:
            parser.addini(ini_name(spec, PREFIX), help, type="string")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a test that runs vllm-doctor on a model (uses the vllm_doctor fixture)"
    )
    config.stash[SESSION_KEY] = DoctorSession(
        fail_on=Severity(config.getoption("--vllm-doctor-fail-on")),
        fast=bool(config.getoption("--vllm-doctor-fast")),
        model=config.getoption("--vllm-doctor-model"),
        report_path=config.getoption("--vllm-doctor-report"),
        engine=engine_options(config),
    )


def engine_options(config: pytest.Config) -> EngineOptions:
    """The session's engine options: each from the command line, else the ini file, else its default."""
    values: dict[str, Any] = {}
    for spec in specs():
        dest = PREFIX.replace("-", "_") + spec.name
        given = getattr(config.option, dest, NOT_GIVEN)
        if given is not NOT_GIVEN and not (given is None and spec.kind == PAIRS):  # None: --max-memory none
            values[dest] = given
            continue
        text = config.getini(ini_name(spec, PREFIX))
        if text in ("", [], None):
            continue
        try:
            values[dest] = value_from_text(spec, text)
        except ValueError as exc:
            raise pytest.UsageError(f"{ini_name(spec, PREFIX)} in {config.inipath}: {exc}") from None
    return from_values(values, prefix=PREFIX)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_doctor" in getattr(item, "fixturenames", ()):
            item.add_marker(MARKER)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.outcomes:
        return
    tr = terminalreporter
    tr.section("vllm-doctor")
    for o in session.outcomes:
        tr.write_line(f"{'PASS' if o.ok else 'FAIL'} {o.assertion:<15} {o.model}  {o.summary}  ({o.test})")
        if o.details.get("engine_mode_text"):
            tr.write_line(f"     {o.details['engine_mode_text']}")
    tr.write_line(f"vLLM engines started this session: {session.engine_runs}")
    if session.report_path:
        tr.write_line(f"report: {session.report_path}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(SESSION_KEY, None)
    if state is None:
        return
    state.close()  # the session's engines end with it
    if not state.report_path:
        return
    from dataclasses import asdict

    from vllm_doctor import __version__

    write_json_atomic(
        state.report_path,
        {
            "vllm_doctor": __version__,
            "engine_runs": state.engine_runs,
            "runs": state.runs,
            "options": state.options_record(),
            "outcomes": [asdict(o) for o in state.outcomes],
        },
    )
