"""The unit tier's rule, "no vLLM", for every Python process a tests/unit test starts.

tests/unit/conftest.py puts this folder first on PYTHONPATH while a unit test runs, so Python
imports this module at start-up in each child (the doctor's children, and theirs, inherit it).
``install`` puts a finder in front of ``sys.meta_path``: locating vLLM
(``importlib.util.find_spec("vllm")``) still works, importing it raises ImportError and appends
one JSON line (pid, argv, the importing line) to the file named by ``VLLM_DOCTOR_UNIT_TIER_LOG``;
the conftest fails the test with those lines. The conftest installs the same finder in its own
process. Self-contained on purpose: a child need not have the repository on sys.path.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

LOG_ENV = "VLLM_DOCTOR_UNIT_TIER_LOG"
RULE = (
    "tests/unit imports no vLLM, neither in the test's process nor in a subprocess it starts "
    "(a doctor child running the import pass, weights pass or engine stage imports vLLM): "
    "move the test to tests/integration (imports vLLM, starts no engine) or tests/engine "
    "(starts an engine); docs/development.md"
)


def is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def importing_line() -> str:
    """The first frame outside importlib and this file: the line that imported vLLM."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        if (
            frame.filename.startswith("<frozen ")
            or "importlib" in Path(frame.filename).parts
            or frame.filename == __file__
        ):
            continue
        return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return "?"


class _BlockedLoader(importlib.abc.Loader):
    def __init__(self, name: str, record: Callable[[dict[str, Any]], None]) -> None:
        self.name = name
        self.record = record

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        where = importing_line()
        self.record({"pid": os.getpid(), "argv": sys.argv, "module": self.name, "where": where})
        raise ImportError(f"import {self.name} at {where}: {RULE}", name=self.name)

    def exec_module(self, module: ModuleType) -> None:  # never reached: create_module raises
        raise ImportError(RULE, name=self.name)


class NoVllmFinder(importlib.abc.MetaPathFinder):
    """vLLM is found where it is installed (its spec's origin is the real one) but not imported."""

    def __init__(self, record: Callable[[dict[str, Any]], None]) -> None:
        self.record = record

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not is_vllm(fullname):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None  # not installed: the ordinary ModuleNotFoundError
        spec.loader = _BlockedLoader(fullname, self.record)
        return spec


def append_to_log(entry: dict[str, Any]) -> None:
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as fh:  # one short line per write: appends do not interleave
            fh.write(json.dumps(entry) + "\n")


if os.environ.get(LOG_ENV) and not any(isinstance(f, NoVllmFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, NoVllmFinder(append_to_log))
