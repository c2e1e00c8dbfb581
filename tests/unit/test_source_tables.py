"""The fast pass reads vLLM's and transformers' tables from source; they must equal the imports
(vLLM's, imported in a subprocess: tests/integration/test_source_tables_imported.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_doctor.compat.source_tables import (
    find_module_file,
    read_dict_literals,
    read_transformers_model_types,
)


def test_read_dict_literals_handles_merges_ordereddict_update_and_comprehensions(tmp_path: Path) -> None:
    src = tmp_path / "tables.py"
    src.write_text(textwrap.dedent('''
        from collections import OrderedDict
        _A = {"X": ("x", "X"), "Y": ("y", "Y")}
        _B = {**_A, "Z": ("z", "Z"), **{k: v for k, v in _A.items() if k == "X"}}
        NAMES = OrderedDict([("a", "A"), ("b", "B")])
        NAMES.update({"c": "C"})
        LAZY = LazyConfigDict(m="MConfig")
        _NOT_LITERAL = make_table()
    '''))
    tables = read_dict_literals(src)
    assert tables["_B"] == {"X": ("x", "X"), "Y": ("y", "Y"), "Z": ("z", "Z")}
    assert tables["NAMES"] == {"a": "A", "b": "B", "c": "C"}
    assert tables["LAZY"] == {"m": "MConfig"}
    assert "_NOT_LITERAL" not in tables


def test_find_module_file_does_not_execute_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "boom_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('executed!')\n")
    (pkg / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_module_file("boom_pkg.mod") == pkg / "mod.py"
    assert "boom_pkg" not in sys.modules
    assert find_module_file("boom_pkg.missing") is None


def _live(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_transformers_model_types_read_from_source_equal_config_mapping() -> None:
    ours = read_transformers_model_types()
    assert ours is not None
    live = set(_live(
        "from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES as C\nprint('\\n'.join(C))"
    ).splitlines())
    assert ours == live


def test_compat_is_the_only_package_importing_vllm() -> None:
    """Layering: vLLM internals only in compat/ (and engine/, which runs inside vLLM)."""
    root = Path(__file__).resolve().parents[2] / "vllm_doctor"
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if rel[0] in ("compat", "engine"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            if any(n == "vllm" or n.startswith("vllm.") for n in names):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
