"""The test suite's own layout: four tiers by cost, one folder each (docs/development.md).

- tests/unit: imports no vLLM, in process or in a subprocess (tests/unit/conftest.py makes any
  such import fail the test; here: no module-level ``import vllm`` in the tier's files);
- tests/integration: imports vLLM (in process or in a doctor child), starts no engine;
- tests/engine: starts real vLLM engines (the ``engine`` marker comes from tests/engine/conftest.py);
- tests/gpu: needs CUDA (marker ``gpu``; skips without it).

Every test file lives in one of them, and only tests/engine and tests/gpu use what starts an
engine. What starts one is read from each file's syntax tree (names, imports, string constants,
doctor command lines), so a test that starts an engine outside tests/engine fails here with its
file, line and what it used.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
TIERS = ("unit", "integration", "engine", "gpu")
ENGINE_TIERS = ("engine", "gpu")

# names (called, imported, or taken as a fixture argument) that start a real vLLM engine
STARTER_NAMES: dict[str, str] = {
    "served_engine": "the session's served engine (tests/conftest.py)",
    "ServedEngine": "tests/served.py: a vLLM API server",
    "BlockingEngine": "tests/served.py: a vLLM API server held in a step",
    "blocking_engine": "tests/served.py: a vLLM API server held in a step",
    "start_engine": "vllm_doctor.compat.llm.start_engine: vllm.LLM in this process",
    "LLM": "vllm.LLM",
    "LLMEngine": "vllm.LLMEngine",
    "AsyncLLM": "vllm's AsyncLLM",
    "AsyncLLMEngine": "vllm.AsyncLLMEngine",
    "run_variant": "tests/engine_harness.py: an example variant on a real engine",
    "run_variants": "tests/engine_harness.py: example variants on real engines",
    "EngineJob": "tests/engine_harness.py: a real-engine job",
    "job_for_variant": "tests/engine_harness.py: a real-engine job",
    "run_engines": "tests/fixtures/weights_engine.py: weight fixtures on real engines",
    "run_engine_stage": "vllm_doctor.stages.engine: the engine stage",
    "diagnose_engine": "vllm_doctor.stages.engine: the engine stage's owner",
    "check_engine": "vllm_doctor.check_engine: the engine stage from Python",
    "run_author_tests": "examples/pytest_for_model_authors on real engines",
}
# modules and scripts that start one (imported, or a string constant naming them: `-m MODULE`,
# a worker extension MODULE.Class, a path part)
STARTER_MODULES: dict[str, str] = {
    "tests.engine_harness": "the real-engine harness",
    "engine_harness.py": "the real-engine harness",
    "tests.fixtures.weights_engine": "weight fixtures on real engines",
    "tests.fixtures.mp_attach_child": "a multiprocess engine in a child",
    "tests.fixtures.preemption_child": "a small-KV engine in a child",
    "tests.gpu.gpu_child": "a GPU engine in a child",
    "vllm.entrypoints.openai.api_server": "a vLLM API server",
    "pytest_for_model_authors": "the example's author tests (real engines)",
}
# a doctor command line (a list, tuple or call's arguments) holding these starts an engine
STARTER_ARGS: dict[tuple[str, ...], str] = {
    ("--engine",): "`vllm-doctor check --engine`",
    ("profile", "--out"): "`vllm-doctor profile`",
}
# a test that replaces the engine start (monkeypatch.setattr(module, NAME, ...)) starts none, and so
# does a test that takes a fixture doing it
ENGINE_START_SEAMS = ("run_engine_stage", "diagnose_engine")


@dataclass(frozen=True)
class Use:
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.line}: {self.what}"


def tier_test_files() -> list[Path]:
    """Every file pytest collects under tests/ (``test_*.py``, ``*_test.py``)."""
    found = {*TESTS.rglob("test_*.py"), *TESTS.rglob("*_test.py")}
    return sorted(p for p in found if "data" not in p.relative_to(TESTS).parts)


def tier_of(path: Path) -> str | None:
    parts = path.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements (docstrings, bare strings): prose, not code."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _seamed(tree: ast.AST) -> list[tuple[int, int]]:
    """Line ranges of the functions that replace the engine start with ``monkeypatch.setattr``, and
    of the functions that take such a function as a fixture argument."""
    functions = [fn for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)]
    seams = {
        fn.name
        for fn in functions
        for node in ast.walk(fn)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "setattr"
        and any(isinstance(a, ast.Constant) and a.value in ENGINE_START_SEAMS for a in node.args)
    }
    return [
        (fn.lineno, fn.end_lineno or fn.lineno)
        for fn in functions
        if fn.name in seams or any(a.arg in seams for a in fn.args.args)
    ]


def engine_starts(source: str) -> list[Use]:
    """What in ``source`` starts a real vLLM engine, by line."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    seamed = _seamed(tree)
    uses: list[Use] = []

    def add(node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        if not any(lo <= line <= hi for lo, hi in seamed):
            uses.append(Use(line, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in STARTER_NAMES:
            add(node, f"{node.id} ({STARTER_NAMES[node.id]})")
        elif isinstance(node, ast.Attribute) and node.attr in STARTER_NAMES:
            add(node, f".{node.attr} ({STARTER_NAMES[node.attr]})")
        elif isinstance(node, ast.arg) and node.arg in STARTER_NAMES:
            add(node, f"fixture {node.arg} ({STARTER_NAMES[node.arg]})")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module in STARTER_MODULES:
                    add(node, f"import {module} ({STARTER_MODULES[module]})")
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in STARTER_NAMES:
                        add(node, f"import {alias.name} ({STARTER_NAMES[alias.name]})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            for module, why in STARTER_MODULES.items():
                if node.value == module or node.value.startswith(f"{module}."):  # `-m MODULE`, `MODULE.Class`
                    add(node, f"{node.value!r} ({why})")
        if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Call):
            items = node.args if isinstance(node, ast.Call) else node.elts
            strings = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
            for args, why in STARTER_ARGS.items():
                if set(args) <= strings:
                    add(node, why)
    return sorted(set(uses), key=lambda u: (u.line, u.what))


def module_level_vllm_imports(source: str) -> list[Use]:
    """``import vllm...`` / ``pytest.importorskip("vllm")`` outside any function or class."""
    uses = []
    for node in ast.parse(source).body:
        for sub in ast.walk(node):
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                break
            names: list[str] = []
            if isinstance(sub, ast.Import):
                names = [a.name for a in sub.names]
            elif isinstance(sub, ast.ImportFrom) and not sub.level:
                names = [sub.module or ""]
            elif isinstance(sub, ast.Call) and getattr(sub.func, "attr", None) in ("importorskip", "import_module"):
                names = [a.value for a in sub.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            uses += [Use(sub.lineno, f"import {n}") for n in names if n == "vllm" or n.startswith("vllm.")]
    return uses


def test_every_test_file_is_in_a_tier() -> None:
    outside = [str(p.relative_to(REPO)) for p in tier_test_files() if tier_of(p) is None]
    assert outside == [], (
        "test files outside the four tiers; move each (git mv) to tests/unit (no vLLM), tests/integration "
        "(imports vLLM, no engine), tests/engine (starts engines) or tests/gpu (CUDA): docs/development.md"
    )


def test_only_the_engine_and_gpu_tiers_start_engines() -> None:
    offenders = []
    for path in tier_test_files():
        if tier_of(path) in ENGINE_TIERS or path == Path(__file__).resolve():  # this file names them all
            continue
        offenders += [f"{path.relative_to(REPO)}:{use}" for use in engine_starts(path.read_text(encoding="utf-8"))]
    assert offenders == [], "these start a real vLLM engine: move the test (or split the file) to tests/engine"


def test_no_unit_file_imports_vllm_at_module_level() -> None:
    offenders = []
    for path in sorted((TESTS / "unit").rglob("*.py")):
        offenders += [f"{path.relative_to(REPO)}:{use}" for use in module_level_vllm_imports(path.read_text(encoding="utf-8"))]
    assert offenders == [], "tests/unit imports no vLLM: move these to tests/integration"


def test_the_engine_marker_comes_from_the_engine_folder() -> None:
    """``pytest.mark.engine`` is put on every test under tests/engine by its conftest; elsewhere
    (but the GPU tier, marked as before) it would say a test starts an engine that does not."""
    offenders = []
    for path in tier_test_files():
        if tier_of(path) in ENGINE_TIERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "engine" and getattr(node.value, "attr", None) == "mark":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def test_the_engine_folder_marks_its_tests_engine(pytester: pytest.Pytester) -> None:
    """tests/engine/conftest.py in a folder of its own: its tests carry ``engine``, a sibling's do not."""
    engine = pytester.mkdir("engine")
    shutil.copy(TESTS / "engine" / "conftest.py", engine / "conftest.py")
    (engine / "test_e.py").write_text("def test_starts_one():\n    pass\n")
    pytester.makepyfile(test_other="def test_plain():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider", "-m", "engine").assert_outcomes(passed=1, deselected=1)
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "not engine", "-v")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*test_other.py::test_plain PASSED*"])


def test_the_readers_catch_each_kind_of_engine_start() -> None:
    """The readers above can fail: each way in is seen, prose and a replaced engine start are not."""
    src = textwrap.dedent('''
        """Docstrings may name tests.engine_harness and vllm.entrypoints.openai.api_server."""
        from tests.engine_harness import run_variants
        import tests.fixtures.weights_engine
        from vllm_doctor.compat.llm import start_engine

        def test_served(served_engine):
            pass

        def test_cli(doctor):
            doctor("check", "m", "--engine", "--json")
            run_doctor(["profile", "m", "--out", "o"])
            subprocess.run([sys.executable, "-m", "tests.fixtures.preemption_child"])
            llm = vllm.LLM(model="m")

        def test_seam(monkeypatch):
            monkeypatch.setattr(engine_stage, "run_engine_stage", boom)
            main(["check", "m", "--fast", "--engine"])
            main(["profile", "m", "--out", "o"])

        def test_plain():
            report = {"profile": {"steps": []}}
            run_doctor(["check", "m", "--fast"])

        @pytest.fixture
        def replaced(monkeypatch):
            monkeypatch.setattr(api, "diagnose_engine", boom)

        def test_through_the_fixture(replaced):
            main(["check", "m", "--engine"])

        def test_without_it(monkeypatch):
            main(["check", "m", "--engine"])
    ''')
    assert sorted({use.line for use in engine_starts(src)}) == [3, 4, 5, 7, 11, 12, 13, 14, 33]
    assert module_level_vllm_imports("import vllm.config\nfrom vllm import LLM\npytest.importorskip('vllm')\n"
                                     "def f():\n    import vllm\n") == [Use(1, "import vllm.config"), Use(2, "import vllm"),
                                                                        Use(3, "import vllm")]


@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_is_a_package_with_tests(tier: str) -> None:
    assert (TESTS / tier / "__init__.py").is_file()
    assert any(tier_of(p) == tier for p in tier_test_files())


def test_the_unit_tier_fails_a_test_that_imports_vllm(pytester: pytest.Pytester) -> None:
    """tests/unit/conftest.py in a folder of its own: an import of vLLM in the test's process
    (even one the test catches) and one in a subprocess each fail their test with the importing
    line; finding vLLM without importing it passes."""

    shutil.copy(TESTS / "unit" / "conftest.py", pytester.path / "conftest.py")
    shutil.copytree(TESTS / "unit" / "no_vllm", pytester.path / "no_vllm", ignore=shutil.ignore_patterns("__pycache__"))
    pytester.makepyfile(
        test_tier=textwrap.dedent("""
            import importlib.util, os, subprocess, sys

            def test_caught():
                try:
                    import vllm.config
                except ImportError:
                    pass

            def test_child():
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # an environment of its own
                subprocess.run([sys.executable, "-c", "import vllm"], env=env, capture_output=True)

            def test_found_not_imported():
                assert importlib.util.find_spec("vllm") is not None
        """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*vLLM imported in the unit tier: this process: import vllm at *test_tier.py:* (import vllm.config)*",
        "*vLLM imported in the unit tier: subprocess * (-c): import vllm at <string>:1*",
    ], consecutive=False)
    assert result.stdout.str().count("tests/unit imports no vLLM") >= 2


def stream_paths(target: str) -> list[str]:
    """The test paths a Makefile stream runs, as make prints its pytest line (-n: nothing runs; BIN
    outside the checkout: no setup)."""
    shown = subprocess.run(["make", "-s", "-n", "-C", str(TESTS.parent), target, "BIN=/nowhere/bin"],
                           capture_output=True, text=True, check=True).stdout
    pytest_line = next(line for line in shown.splitlines() if line.startswith("mkdir"))
    args = pytest_line.split("-m pytest", 2)[2].split(";")[0].split()
    return [a for a in args if a.startswith("tests")]


def test_make_test_runs_every_tier_once_cheapest_first_in_three_streams() -> None:
    """``make test`` runs the engine tier in two streams (every engine file in exactly one) and the
    other tiers, cheapest first, in a third, side by side; it names the tier folders and nothing
    above them: given ``tests`` too, pytest collects the tiers alphabetically and the unit tier runs
    last, after the engine tier's session fixtures exist (CI failed that way: an engine fixture's
    shutdown at the session's end imported vLLM inside the last unit test's teardown). The summary
    at its end reads the same streams the Makefile runs."""
    make = (TESTS.parent / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    tiers = re.search(r"^TIERS := (.+)$", make, re.M)
    assert tiers is not None and tiers.group(1).split() == [f"tests/{t}" for t in TIERS]
    streams = re.search(r"^STREAMS := (.+)$", make, re.M)
    assert streams is not None and tuple(streams.group(1).split()) == suite_budget_streams()
    recipe = re.search(r"^test: .*\n\t(.+)$", make, re.M)
    assert recipe is not None and "$(addprefix test-stream-,$(STREAMS))" in recipe.group(1) and "-j3" in recipe.group(1)
    assert "--streams $(STREAMS)" in recipe.group(1)
    engine_a, engine_b = stream_paths("test-stream-engine-a"), stream_paths("test-stream-engine-b")
    engine_files = sorted(str(p.relative_to(TESTS.parent)) for p in (TESTS / "engine").glob("test_*.py"))
    assert sorted(engine_a + engine_b) == engine_files  # each engine file once, none missing, none made up
    # the served engine (a session fixture of tests/conftest.py) is started once: its files share a stream
    served = {str(p.relative_to(TESTS.parent)) for p in (TESTS / "engine").glob("test_*.py") if "served_engine" in p.read_text()}
    assert served and (served <= set(engine_a) or served <= set(engine_b)), served
    assert stream_paths("test-stream-rest") == ["tests/unit", "tests/integration", "tests/gpu"]


def suite_budget_streams() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("suite_budget_streams", TESTS.parent / "tools" / "suite_budget.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return tuple(module.STREAMS)


def test_the_sessions_last_teardown_is_not_the_unit_tiers() -> None:
    """When a unit test is the session's last item (``nextitem`` None) its teardown also tears
    down every other tier's session fixtures (an engine's shutdown imports vLLM lazily): the rule
    is not switched on for it; any other teardown is guarded."""
    from tests.unit import conftest as tier

    def finders_during(nextitem: object) -> int:
        hook = tier.pytest_runtest_teardown.__wrapped__ if hasattr(tier.pytest_runtest_teardown, "__wrapped__") else tier.pytest_runtest_teardown
        gen = hook(None, nextitem)
        next(gen)
        during = sys.meta_path.count(tier._guard.finder)
        with contextlib.suppress(StopIteration):
            gen.send(None)
        return during

    outside = sys.meta_path.count(tier._guard.finder)  # this test's own call is guarded
    assert finders_during(None) == outside
    assert finders_during(object()) == outside + 1
