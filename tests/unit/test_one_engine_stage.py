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
    # stages/twin.py: `profile --twin` runs the port and then its in-tree twin through it, one after the other
    assert callers == {"api.py", "cli/check.py", "cli/profile.py", "stages/twin.py"}, callers
    # the pytest plugin's engine assertions reach it through the API (check_engine), not on their own
    plugin = "".join(path.read_text() for path in sorted((ROOT / "pytest_plugin").glob("*.py")))
    assert "check_engine(" in plugin and "run_engine_stage" not in plugin and "build_engine_report" not in plugin
    for path in (ROOT / "pytest_plugin").glob("*.py"):  # of stages/, only the options' declaration
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm_doctor.stages"):
                assert node.module == "vllm_doctor.stages.options", (path.name, node.module)


def test_engine_reports_are_built_in_one_function() -> None:
    """``build_engine_report`` is the one builder: the stage, an attached engine (``attach``,
    ``EngineDoctor.report``) and top's model channel call it; no front end assembles one itself."""
    assert {f for f, _ in calls("build_engine_report")} == {OWNER, "live/attach.py", "live/sources.py"}
    for front_end in ("cli", "pytest_plugin", "tui"):
        for path in (ROOT / front_end).rglob("*.py"):
            text = path.read_text()
            assert "facts[\"engine_failure\"] =" not in text and "facts['engine_failure'] =" not in text, path


def test_report_merge_adds_findings_in_report_order_and_keeps_the_static_environment() -> None:
    from vllm_doctor.model import Finding, Outcome, Report, Severity

    static = Report(target="/m", environment={"vllm": "0.32.0"}, facts={"model_dir": "/m"}, timings={"total_s": 1.0})
    static.findings = [Finding("VD301", Outcome.PASS, Severity.ERROR, "ok", "a"), Finding("VD101", Outcome.PASS, Severity.ERROR, "ok")]
    engine = Report(target="/m", environment={"vllm": "other", "torch": "2.13"}, facts={"engine_failure": "x"},
                    timings={"engine_start_s": 2.0}, profiles={"engine": {"steps": []}})
    engine.findings = [Finding("VD500", Outcome.FAIL, Severity.ERROR, "failed"), Finding("VD401", Outcome.PASS, Severity.ERROR, "ok", "rank 0")]
    merged = static.merge(engine)
    assert merged is static
    # the problems first, the most severe first; then the rest by code (model.report_order)
    assert [f.code for f in merged.findings] == ["VD500", "VD101", "VD301", "VD401"]
    assert merged.facts == {"model_dir": "/m", "engine_failure": "x"}
    assert merged.timings == {"total_s": 1.0, "engine_start_s": 2.0}
    assert merged.profiles == {"engine": {"steps": []}}
    assert merged.environment == {"vllm": "0.32.0", "torch": "2.13"}


def test_engine_facts_say_what_ran_and_what_vllm_said() -> None:
    from vllm_doctor.facts.engine import EngineFacts, ExecutionMode, WorkerFacts

    default = ExecutionMode(requested="vllm-default", enforce_eager=False, summary="compilation VLLM_COMPILE, CUDA graphs FULL")
    ran = EngineFacts(workers=[WorkerFacts(rank=0)], mode=default)
    assert ran.failure_text() == ""
    assert ran.mode_text() == "execution mode: compilation VLLM_COMPILE, CUDA graphs FULL (vLLM's default; --eager forces eager)"
    failed = EngineFacts(startup_error="RuntimeError: capture failed\n  more", startup_phase="graph capture", mode=default,
                         diagnosis=EngineFacts(workers=[WorkerFacts(rank=0)], mode=ExecutionMode(requested="eager")))
    assert failed.failure_text() == (
        "the engine did not start (failed in graph capture; mode: compilation VLLM_COMPILE, CUDA graphs FULL):\n"
        "  RuntimeError: capture failed"
    )
    assert failed.mode_text().endswith("; re-run eagerly to find the cause: it ran")
    workload = EngineFacts(workers=[WorkerFacts(rank=0)], runtime_error="ValueError: bad\nx", mode=ExecutionMode(requested="eager"))
    assert workload.failure_text() == "the engine started, then the workload failed (mode: eager):\n  ValueError: bad"
    assert workload.mode_text() == "execution mode: eager"


def test_the_guard_stops_the_engine_for_sizes_not_for_a_nan_elsewhere_in_config() -> None:
    """VD305 and VD309's model sizes keep the engine from starting; a NaN rms_norm_eps (VD309 too,
    kind not-finite) does not: vLLM builds that model, and the engine stage shows what it does."""
    from vllm_doctor.model import Finding, Outcome, Report, Severity
    from vllm_doctor.stages.engine import blocking_findings

    size = Finding("VD309", Outcome.FAIL, Severity.ERROR, "vocab_size = 0", evidence={"kind": "size"})
    nan = Finding("VD309", Outcome.FAIL, Severity.ERROR, "rms_norm_eps = NaN", evidence={"kind": "not-finite"})
    split = Finding("VD305", Outcome.FAIL, Severity.ERROR, "heads")
    passed = Finding("VD305", Outcome.PASS, Severity.ERROR, "ok")
    assert blocking_findings(Report(target="/m", findings=[size, nan, split, passed])) == [size, split]
    assert blocking_findings(Report(target="/m", findings=[nan, passed])) == []
