"""The package's layout: who may import whom (the table docs/design.md draws; tests/unit/test_docs.py
keeps the two equal and docs/design.md naming every module).

Every import in vllm_doctor (module level or inside a function) is read from the source; an
import the table does not allow fails here with its file and line. Third-party packages are
allowed only where the table names them; everything else is the standard library.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "vllm_doctor"

# unit -> the units of vllm_doctor it may import (besides itself and the lazy package root,
# which imports nothing eagerly). A unit is a top-level module or package, or a module of
# compat/ named on its own.
MAY_IMPORT: dict[str, set[str]] = {
    # plain data and helpers: import nothing of the doctor's
    "constants": set(),
    "errors": set(),
    "model": set(),
    "units": set(),
    "files": set(),
    "procfs": set(),
    # the private channel's wire format and directory rules, shared by both ends (stdlib only;
    # procfs: whether a socket's process still runs)
    "channel": {"constants", "procfs"},  # constants: DIR_ENV, the private directory's variable
    "facts": {"model", "errors", "constants"},  # constants: the wire names both sides share
    # gateways to foreign APIs (vLLM, torch, transformers, NVML); worker-side readers of vLLM
    "compat": {"constants", "errors", "model", "facts"},
    # the two vllm.general_plugins entry points: switches that import their side only when opted in
    "plugins": {"constants", "engine", "live"},
    # runs INSIDE vLLM's processes: reads vLLM objects only through the worker-side gateways
    "engine": {
        "constants",
        "files",
        "channel",
        "compat.common",
        "compat.worker",
        "compat.worker_facts",
        "compat.mixers",
        "compat.roles",
        "compat.quant",
    },
    # collectors (in process or in a child)
    "probes": {"constants", "errors", "model", "facts", "compat", "files"},
    # pure logic over facts
    "analysis": {"model", "facts", "units"},
    "checks": {"model", "facts", "analysis", "units"},
    # the doctor's side of a running engine
    "live": {
        "constants",
        "errors",
        "model",
        "facts",
        "compat",
        "probes",
        "checks",
        "analysis",
        "procfs",
        "units",
        "channel",
    },
    # the passes and the one child-process helper
    "stages": {
        "constants",
        "errors",
        "model",
        "facts",
        "compat",
        "probes",
        "checks",
        "analysis",
        "live",
        "files",
        "units",
        "procfs",
    },
    # renderers
    "report": {"model", "checks", "analysis", "units", "files"},
    # front ends: never compat/ or vLLM
    "api": {"constants", "errors", "model", "report", "stages"},
    # cli starts the TUI (top, replay, view); the TUI never imports cli
    "cli": {"constants", "errors", "model", "files", "units", "probes", "checks", "stages", "live", "report", "tui"},
    # files: the session report, written atomically; checks: the catalogue's topics (codes_for);
    # stages: only stages.options, the engine options its --vllm-doctor-* options are generated from
    # (the engine itself is reached through api.check_engine: tests/unit/test_one_engine_stage.py)
    "pytest_plugin": {"errors", "model", "api", "files", "checks", "stages"},
    "tui": {"constants", "errors", "model", "units", "files", "checks", "analysis", "live", "report"},
    "__main__": {"cli"},
}

THIRD_PARTY: dict[str, set[str]] = {
    "compat": {"vllm", "torch", "transformers", "pynvml", "numpy", "PIL", "prometheus_client"},
    "engine": {"torch"},
    "probes": {"safetensors"},
    "pytest_plugin": {"pytest", "_pytest"},
    "tui": {"textual", "rich"},
}
FRONT_ENDS = ("api", "cli", "pytest_plugin", "tui", "report")


def unit_of(module: str) -> str:
    """``vllm_doctor.compat.worker.x`` -> ``compat.worker`` for compat, else the top-level name."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "compat" and len(parts) > 1:
        return f"compat.{parts[1]}"
    return parts[0]


def allowed(src: str, dst: str) -> bool:
    if dst in ("__init__", src) or src.split(".")[0] == dst.split(".")[0]:
        return True
    rules = MAY_IMPORT[src.split(".")[0]]
    return dst in rules or dst.split(".")[0] in rules


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            for alias in node.names:  # `from pkg import x`: x may be a submodule of pkg
                sub = ROOT.parent.joinpath(*f"{name}.{alias.name}".split("."))
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.append((f"{name}.{alias.name}" if is_module else name, node.lineno))
    return found


def test_every_module_belongs_to_a_unit_of_the_table() -> None:
    units = {unit_of(m).split(".")[0] for m, _ in _modules()} - {"__init__"}
    assert units <= set(MAY_IMPORT), units - set(MAY_IMPORT)


def test_imports_follow_the_table() -> None:
    offenders = []
    for module, path in _modules():
        src = unit_of(module)
        for name, line in _imports(module, path):
            top = name.split(".")[0]
            where = f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
            if top == "vllm_doctor":
                if src != "__init__" and not allowed(src, unit_of(name)):
                    offenders.append(where)
            elif top not in sys.stdlib_module_names and top != "__future__":
                if top not in THIRD_PARTY.get(src.split(".")[0], set()):
                    offenders.append(where)
    assert offenders == []


def test_the_named_rules_hold_in_the_table() -> None:
    """The issue's rules, stated on their own so a loosened table cannot hide them."""
    assert not MAY_IMPORT["engine"] & {"checks", "report", "stages", "live", "cli", "probes"}
    for front in FRONT_ENDS:
        assert "compat" not in MAY_IMPORT[front] and not any(u.startswith("compat.") for u in MAY_IMPORT[front])
        assert "vllm" not in THIRD_PARTY.get(front, set())
    for unit, packages in THIRD_PARTY.items():
        assert "vllm" not in packages or unit == "compat"


def test_the_table_catches_an_offender(tmp_path: Path) -> None:
    """The reader sees function-level and relative imports (so the table test can fail)."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from ..compat import llm\n    import vllm.config\n", encoding="utf-8")
    found = _imports("vllm_doctor.cli.m", src)
    assert ("vllm_doctor.compat.llm", 2) in found and ("vllm.config", 3) in found
    assert not allowed("cli", unit_of("vllm_doctor.compat.llm"))
    assert allowed("engine", "compat.worker") and not allowed("engine", "compat.llm")


def _after_calling(entry: str, env: dict[str, str]) -> list[str]:
    """The modules a fresh interpreter loads to import vllm_doctor.plugins and call ``entry`` in
    the environment ``env`` (the doctor's own switches taken out first)."""
    code = (
        "import sys, json; before = set(sys.modules)\n"
        f"import vllm_doctor.plugins as p; p.{entry}()\n"
        "exporter = sys.modules.get('vllm_doctor.live.exporter')\n"
        "assert exporter is None or exporter._collector is None, 'the exporter started outside an API server'\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_DOCTOR")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**base, **env}
    ).stdout
    return list(json.loads(out))


@pytest.mark.parametrize("entry", ["register", "register_metrics"])
def test_engine_plugin_imports_nothing_beyond_the_standard_library(entry: str) -> None:
    """vLLM imports vllm_doctor.plugins (both entry points) in every engine process and calls both:
    without VLLM_DOCTOR=1 they load constants and nothing else, no third party."""
    new = _after_calling(entry, {})
    ours = [m for m in new if m.split(".")[0] == "vllm_doctor"]
    assert ours == ["vllm_doctor", "vllm_doctor.constants", "vllm_doctor.plugins"]
    assert [m for m in new if m.split(".")[0] not in sys.stdlib_module_names and m not in ours] == []


def test_the_metrics_entry_point_needs_both_switches_and_starts_nothing_outside_the_api_server() -> None:
    """VLLM_DOCTOR=1 alone leaves the exporter unimported; with VLLM_DOCTOR_METRICS=1 too it is
    imported and asked, and in a process that is not ``vllm serve``'s API server it starts nothing
    (no collector; _after_calling asserts it), loading no third-party package."""
    from vllm_doctor.constants import DOCTOR_ENV, METRICS_ENV

    alone = _after_calling("register_metrics", {DOCTOR_ENV: "1"})
    assert [m for m in alone if m.split(".")[0] == "vllm_doctor"] == [
        "vllm_doctor",
        "vllm_doctor.constants",
        "vllm_doctor.plugins",
    ]
    both = _after_calling("register_metrics", {DOCTOR_ENV: "1", METRICS_ENV: "1"})
    assert "vllm_doctor.live.exporter" in both
    assert [
        m
        for m in both
        if m.split(".")[0] not in (*sys.stdlib_module_names, "vllm_doctor", "__mp_main__")  # multiprocessing's alias
    ] == []


def test_the_two_vllm_plugins_sit_together() -> None:
    """pyproject's vllm.general_plugins entry points are functions of vllm_doctor.plugins, which
    imports engine/ and live/ only inside them (the package's own imports stay one way)."""
    import tomllib

    import vllm_doctor.plugins as plugins

    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    targets = project["entry-points"]["vllm.general_plugins"]
    assert {t.partition(":")[0] for t in targets.values()} == {"vllm_doctor.plugins"}
    assert sorted(t.partition(":")[2] for t in targets.values()) == sorted(plugins.__all__)
    tree = ast.parse((ROOT / "plugins.py").read_text(encoding="utf-8"))
    top_level = [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert top_level == ["__future__", "vllm_doctor.constants"]


def test_the_weights_pass_bookkeeping_is_pure() -> None:
    """stages/weights_trace.py (the weights pass's accounting, moved out of compat/weights.py)
    loads no vLLM or torch and no other module of the doctor's: compat's hooks hand it plain data."""
    code = (
        "import sys; import vllm_doctor.stages.weights_trace\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'vllm_doctor')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['vllm_doctor', 'vllm_doctor.stages', 'vllm_doctor.stages.weights_trace']"


def test_package_root_is_lazy() -> None:
    code = (
        "import sys; import vllm_doctor\n"
        "print(sorted(m for m in sys.modules if m.startswith('vllm_doctor')))\n"
        "vllm_doctor.Severity; assert 'vllm_doctor.model' in sys.modules\n"
        "import vllm_doctor.live.attach as m; assert vllm_doctor.attach is m.attach"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['vllm_doctor']"


# the worker-side records of facts/: the worker imports them (compat.worker_facts builds them)
WIRE_RECORDS = ("wire", "anatomy", "placement", "kv", "memory", "perf", "quant")
# the engine stage's check modules, one per topic (attention: VD208, the model's contract seen in the engine)
ENGINE_CHECK_MODULES = {
    "startup": "start-up",
    "placement": "placement",
    "quant_layers": "placement",
    "probe": "probe",
    "ranks": "ranks",
    "kv_cache": "kv-cache",
    "memory": "memory",
    "attention": "contract",
    "doctor": "doctor",
}


def test_the_wire_records_pull_in_nothing_but_themselves_and_the_standard_library() -> None:
    """Inside vLLM's workers they must not bring the doctor's checks, analysis or stages along."""
    code = (
        "import sys, json; before = set(sys.modules)\n"
        + "".join(f"import vllm_doctor.facts.{name}\n" for name in WIRE_RECORDS)
        + "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    new = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    ours = {m for m in new if m.split(".")[0] == "vllm_doctor"}
    assert ours == {"vllm_doctor", "vllm_doctor.facts", *(f"vllm_doctor.facts.{name}" for name in WIRE_RECORDS)}
    assert [m for m in new if m.split(".")[0] not in sys.stdlib_module_names and m not in ours] == []


def _checks_in(path: Path) -> list[tuple[str, dict[str, str]]]:
    """(code, its literal keyword arguments) of each @check(...) in a module's source."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == "check":
                code = dec.args[0].value if isinstance(dec.args[0], ast.Constant) else "?"
                kwargs = {k.arg: ast.unparse(k.value) for k in dec.keywords if k.arg}
                found.append((str(code), kwargs))
    return found


def test_engine_checks_sit_in_one_module_per_topic_and_every_family_is_registered() -> None:
    from vllm_doctor.checks import CATALOGUE

    assert not (ROOT / "checks" / "engine.py").exists()
    codes = set()
    for path in sorted((ROOT / "checks").glob("*.py")):
        checks = _checks_in(path)
        codes |= {code for code, _ in checks}
        if path.stem in ENGINE_CHECK_MODULES:
            assert checks, f"{path.name} defines no check"
            for code, kwargs in checks:
                assert kwargs["topic"] == repr(ENGINE_CHECK_MODULES[path.stem]), (path.name, code)
                assert kwargs["stage"] == "Stage.ENGINE", (path.name, code)
    assert codes == set(CATALOGUE)  # checks/__init__ imports every module that defines checks


# --- every VLLM_DOCTOR* environment variable is spelled once, in constants.py ------------------

ENV_NAME = re.compile(r"VLLM_DOCTOR\w*")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are a module's, class's or function's docstring."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def env_name_literals(source: str) -> list[tuple[str, int]]:
    """(value, line) of each string constant of ``source`` that is a VLLM_DOCTOR* variable's name
    (or its start, as in ``f"VLLM_DOCTOR_{x}"``): docstrings and comments left out, and so is prose
    that names one (``"start the server with VLLM_DOCTOR=1"``)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [
        (node.value, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and ENV_NAME.fullmatch(node.value)
    ]


def test_every_doctor_environment_variable_is_named_once_in_constants() -> None:
    offenders = []
    for module, path in _modules():
        if module == "vllm_doctor.constants":
            continue
        offenders += [
            f"{path.relative_to(ROOT.parent)}:{line}: {value!r}"
            for value, line in env_name_literals(path.read_text(encoding="utf-8"))
        ]
    assert offenders == [], "name these through vllm_doctor.constants"
    from vllm_doctor import constants

    names = [v for v, _ in env_name_literals((ROOT / "constants.py").read_text(encoding="utf-8"))]
    assert len(names) == len(set(names)), names  # and each only once there
    assert {"VLLM_DOCTOR", "VLLM_DOCTOR_DIR", "VLLM_DOCTOR_METRICS"} <= set(names)
    assert constants.DOCTOR_ENV == "VLLM_DOCTOR"


def test_the_environment_scan_catches_a_literal() -> None:
    source = (
        '"""Reads VLLM_DOCTOR_DIR."""\n'
        "import os\n"
        "# VLLM_DOCTOR_X in a comment\n"
        'HINT = "start the server with VLLM_DOCTOR=1"\n'
        'def f():\n    """VLLM_DOCTOR"""\n    return os.environ.get("VLLM_DOCTOR_NEW"), f"VLLM_DOCTOR_{1}"\n'
    )
    assert env_name_literals(source) == [("VLLM_DOCTOR_NEW", 7), ("VLLM_DOCTOR_", 7)]


# --- each package says in its __init__ what it owns and may import ------------------------------

DOCUMENTED_PACKAGES = ("analysis", "facts", "live", "stages", "compat")
CODE_NAME = re.compile(r"``([\w.]+)``")


def package_roles(docstring: str) -> tuple[set[str], set[str]]:
    """(the modules an __init__ docstring's "Owns:" list names, the units its "May import" paragraph
    names): one ``- ``module``: ...`` line per module, the units as ``name`` in that paragraph."""
    owns = set(re.findall(r"^- ``(\w+)``", docstring, flags=re.MULTILINE))
    start = docstring.find("\nMay import")
    assert start >= 0, "no 'May import' paragraph"
    paragraph = docstring[start:].split("\n\n")[0]
    return owns, set(CODE_NAME.findall(paragraph))


def role_problems(package_dir: Path, row: set[str]) -> list[str]:
    """What the package's __init__ docstring gets wrong: a module it does not name (one line each),
    one it names that is not there, a "May import" that is not ``row``, no "Never" paragraph."""
    docstring = ast.get_docstring(ast.parse((package_dir / "__init__.py").read_text(encoding="utf-8"))) or ""
    owns, may_import = package_roles(docstring)
    modules = {p.stem for p in package_dir.glob("*.py")} - {"__init__"}
    problems = [f"no line for module {m}" for m in sorted(modules - owns)]
    problems += [f"a line for {m}, which is not a module" for m in sorted(owns - modules)]
    if may_import != row:
        problems.append(f"'May import' names {sorted(may_import)}, MAY_IMPORT has {sorted(row)}")
    if "\nNever" not in docstring:
        problems.append("nothing of what the package never does")
    return problems


@pytest.mark.parametrize("package", DOCUMENTED_PACKAGES)
def test_each_package_init_names_its_modules_and_what_it_may_import(package: str) -> None:
    """The docstring names every module of the package (one line each) and exactly its row of
    MAY_IMPORT, so a module added without a line, or a table changed alone, fails here."""
    assert role_problems(ROOT / package, MAY_IMPORT[package]) == [], f"vllm_doctor/{package}/__init__.py"


def test_a_module_added_without_a_line_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "analysis"
    package.mkdir()
    for path in (ROOT / "analysis").glob("*.py"):
        (package / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert role_problems(package, MAY_IMPORT["analysis"]) == []
    (package / "brand_new.py").write_text('"""A new summary."""\n', encoding="utf-8")
    assert role_problems(package, MAY_IMPORT["analysis"]) == ["no line for module brand_new"]
    assert role_problems(ROOT / "analysis", MAY_IMPORT["analysis"] | {"live"}) == [
        "'May import' names ['facts', 'model', 'units'], MAY_IMPORT has ['facts', 'live', 'model', 'units']"
    ]
