"""Shared fixtures: the example model variants, built once per session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def make_examples(out: Path, *names: str, variants_dir: Path | None = None, timeout: float = 300) -> Path:
    """examples/make_examples.py into ``out``: the variants (or ports) ``names``, every variant when none
    is named; ``variants_dir``: variants kept outside examples/ (the tests' own). Returns ``out``."""
    only = ["--only", *names] if names else []
    extra = ["--variants-dir", str(variants_dir)] if variants_dir else []
    subprocess.run([sys.executable, str(REPO / "examples" / "make_examples.py"), str(out), *only, *extra],
                   check=True, capture_output=True, timeout=timeout)
    return out


@pytest.fixture(scope="session")
def examples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every example variant (ok + broken), built by examples/make_examples.py."""
    return make_examples(tmp_path_factory.mktemp("examples"), timeout=1800)


def variant_env(examples_dir: Path, name: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # what PYTHONPATH already holds stays after them (the GPU machine carries vLLM in that way)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(examples_dir / name / "site"), str(REPO), env.get("PYTHONPATH", "")] if p)
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("VLLM_PLUGINS", None)
    env.update(extra)
    return env


def run_doctor(args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_doctor", *args],
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# the import and weights passes' limit in the examples' checks: the default 180 s is a hang's
# bound on a user's machine; CI's 2 cores, with the engine tests beside them, have taken longer
# (test_real_plugins' note; the likely cause of a VD209 skip that CI saw on a vision-language
# variant). A test that wants the limit passes its own.
CHECK_LIMIT = ["--import-timeout", "500"]


def check_family(out: Path, names: list[str]) -> dict[str, tuple[int, dict | None, subprocess.CompletedProcess[str], str]]:
    """``vllm-doctor check --json`` of each example variant of a family (built into ``out``, its
    plugin site on PYTHONPATH): name -> (exit code, report or None, the process, the variant's
    ``expect_code``)."""
    built = make_examples(out, *names)
    got = {}
    for name in names:
        env = dict(os.environ, PYTHONPATH=str(built / name / "site"))
        proc = run_doctor(["check", str(built / name / "model"), "--json", *CHECK_LIMIT], env=env, timeout=600)
        report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
        expect = json.loads((built / name / "variant.json").read_text())["expect_code"]
        got[name] = (proc.returncode, report, proc, expect)
    return got


def doctor_json(examples_dir: Path, name: str, *args: str, **extra_env: str) -> dict:
    proc = run_doctor(["check", str(examples_dir / name / "model"), "--json", "-q", *CHECK_LIMIT, *args],
                      variant_env(examples_dir, name, **extra_env), timeout=600)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def served_engine(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real vLLM server on 127.0.0.1 (the example model, VLLM_DOCTOR=1, dev mode) per session."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed")
    from tests.engine_harness import WORKER_EXTENSION
    from tests.served import ServedEngine

    served = ServedEngine(tmp_path_factory.mktemp("served"), ["--worker-extension-cls", WORKER_EXTENSION])
    with served.serving():
        yield served
