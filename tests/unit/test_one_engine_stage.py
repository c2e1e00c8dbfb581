"""One owner for the engine stage: every front end that starts an engine goes through
``stages.engine.diagnose_engine``, and engine reports are built in one function.

Read from the source (AST), so a new caller that starts the engine child or builds a report on
its own fails here with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "vllm_doctor"
OWNER = "stages/engine.py"


def calls(name: str) -> list[tuple[str, int]]:
    """Every call of a function named ``name`` in the package: (file relative to the package, line)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if called == name:
                    found.append((str(path.relative_to(ROOT)), node.lineno))
    return found


def engine_child_runs() -> list[tuple[str, int]]:
    """Calls of ``run_child("engine", ...)``: the child that starts a real engine."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "run_child":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and first.value == "engine":
                    found.append((str(path.relative_to(ROOT)), node.lineno))
    return found


def test_only_the_engine_stage_starts_the_engine_child() -> None:
    runs = engine_child_runs()
    assert runs and {f for f, _ in runs} == {OWNER}, runs
    assert {f for f, _ in calls("run_engine_stage")} == {OWNER}, calls("run_engine_stage")


def test_every_front_end_that_starts_an_engine_calls_diagnose_engine() -> None:
    callers = {f for f, _ in calls("diagnose_engine")}
    assert callers == {"api.py", "cli/check.py", "cli/profile.py"}, callers
    # the pytest plugin's engine assertions reach it through the API (check_engine), not on their own
    plugin = (ROOT / "pytest_plugin" / "plugin.py").read_text()
    assert "check_engine(" in plugin and "run_engine_stage" not in plugin and "build_engine_report" not in plugin


def test_engine_reports_are_built_in_one_function() -> None:
    """``build_engine_report`` is the one builder: the stage, an attached engine (``attach``,
    ``EngineDoctor.report``) and top's model channel call it; no front end assembles one itself."""
    assert {f for f, _ in calls("build_engine_report")} == {OWNER, "live/attach.py", "live/sources.py"}
    for front_end in ("cli", "pytest_plugin", "tui"):
        for path in (ROOT / front_end).rglob("*.py"):
            text = path.read_text()
            assert "facts[\"engine_failure\"] =" not in text and "facts['engine_failure'] =" not in text, path
