"""The unit tier: no vLLM (tests/unit/no_vllm/sitecustomize.py holds the rule's text).

While anything under tests/unit is collected or runs (its fixtures' set-up and tear-down too),
``import vllm`` raises ImportError -- in this process (a finder first on ``sys.meta_path``, with
vLLM's modules that an earlier tier imported hidden from ``sys.modules``) and in every Python
subprocess started meanwhile (no_vllm/ first on PYTHONPATH, also where the test hands
``subprocess.Popen`` an environment of its own). Each attempt is recorded, so the
test fails with the importing line even where the ImportError was caught (``importorskip``, a
doctor child reporting it as a finding).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

NO_VLLM_DIR = Path(__file__).resolve().parent / "no_vllm"


def _load_rule() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_vllm_doctor_unit_tier", NO_VLLM_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rule = _load_rule()


class Guard:
    def __init__(self) -> None:
        fd, log = tempfile.mkstemp(prefix="vllm-doctor-unit-tier-", suffix=".jsonl")
        os.close(fd)
        self.log = Path(log)
        self.records: list[dict[str, Any]] = []
        self.finder = rule.NoVllmFinder(self.records.append)

    def child_env(self, env: Any) -> Any:
        """``env`` with the rule on: no_vllm/ first on its PYTHONPATH, the log named."""
        if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
            return env
        env = dict(env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(NO_VLLM_DIR), env.get("PYTHONPATH", "")) if p)
        env[rule.LOG_ENV] = str(self.log)
        return env

    @contextmanager
    def active(self) -> Iterator[None]:
        hidden = {name: sys.modules.pop(name) for name in [n for n in sys.modules if rule.is_vllm(n)]}
        saved = {key: os.environ.get(key) for key in ("PYTHONPATH", rule.LOG_ENV)}
        sys.meta_path.insert(0, self.finder)
        os.environ.update(self.child_env(dict(os.environ)))
        popen_init = subprocess.Popen.__init__
        guard = self

        def init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
            if kwargs.get("env") is not None:
                kwargs["env"] = guard.child_env(kwargs["env"])
            popen_init(self, *args, **kwargs)

        subprocess.Popen.__init__ = init  # type: ignore[method-assign]
        try:
            yield
        finally:
            subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
            if self.finder in sys.meta_path:
                sys.meta_path.remove(self.finder)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            sys.modules.update(hidden)

    def violations(self) -> str | None:
        """What imported vLLM since the last call (and forget it), or None."""
        found = list(self.records)
        self.records.clear()
        try:
            text = self.log.read_text(encoding="utf-8")
            self.log.write_text("", encoding="utf-8")
        except OSError:
            text = ""
        found += [json.loads(line) for line in text.splitlines() if line.strip()]
        if not found:
            return None
        lines = []
        for entry in found:
            who = (
                "this process"
                if entry.get("pid", os.getpid()) == os.getpid()
                else (f"subprocess {entry['pid']} ({' '.join(entry.get('argv', []))[:200]})")
            )
            lines.append(f"{who}: import {entry['module']} at {entry['where']}")
        lines = list(dict.fromkeys(lines))
        more = "".join(f"\n  {line}" for line in lines[1:])
        return f"vLLM imported in the unit tier: {lines[0]}{more}\n{rule.RULE}"


_guard = Guard()


def pytest_unconfigure(config: pytest.Config) -> None:
    _guard.log.unlink(missing_ok=True)


def _guarded() -> Generator[None, object, object]:
    with _guard.active():
        try:
            result = yield
        except BaseException:
            found = _guard.violations()
            if found:  # the rule's message instead of the ImportError it caused
                raise pytest.fail.Exception(found, pytrace=False) from None
            raise
    found = _guard.violations()
    if found:
        pytest.fail(found, pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    with _guard.active():
        report = yield
    found = _guard.violations()
    if found:
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: {found}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    if nextitem is None:  # the session's last item: every tier's session fixtures tear down here
        # (an engine fixture's shutdown imports vLLM lazily), not only this tier's
        return (yield)
    return (yield from _guarded())
