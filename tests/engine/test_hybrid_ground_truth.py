"""Ground truth for custom hybrid (Mamba 2 + attention) models: what the real vLLM CPU engine
does with each example of make_examples.py's hybrid family, and the doctor's finding on each
before launch (``vllm-doctor check``: the import and weights passes, no engine).

examples/tiny_hybrid_plugin is a Nemotron-H-like model (vLLM's MambaMixer2 and Attention,
pattern M*M-); examples/hybrid/NAME are its broken variants. Each runs once on its own engine
(tests/engine_tokens.py: eager, engine core in process). vLLM's messages for these mistakes name
neither the class nor the interface: a bare AssertionError, a TypeError about None; VD214 and
VD215 name the layer and what is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CHECK_LIMIT, make_examples, run_doctor
from tests.engine_tokens import PROMPTS, run_tokens

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Expected:
    """What vLLM 0.32 (CPU, eager, engine core in process) did, and the doctor's finding."""

    phase: str  # "ran" | "engine start" | "load"
    error: str | None = None  # the caller's exception chain holds this
    finding: tuple[str, str, str] | None = None  # (code, subject, start of the message)


EXPECTED: dict[str, Expected] = {
    "hybrid-ok": Expected(phase="ran"),
    # vLLM never sizes a state cache: a bare assert while the KV cache is set up
    "hybrid-not-declared": Expected(
        phase="engine start",
        error="builtins.AssertionError",
        finding=("VD214", "model.layers.0.mixer", "the model builds 2 state mixer(s) (model.layers.0.mixer, "),
    ),
    "hybrid-no-state-shape": Expected(
        phase="engine start",
        error="TypeError: 'NoneType' object is not iterable",
        finding=("VD214", "model.layers.0.mixer", "the model builds 2 state mixer(s)"),
    ),
    "hybrid-pattern-not-built": Expected(
        phase="load",
        error="There is no module or parameter named 'model.layers.1.o_proj' in TinyHybridForCausalLM",
        finding=("VD215", "model.layers.1", "layer 1: hybrid_override_pattern says attention, the model builds"),
    ),
    "hybrid-pattern-unknown-letter": Expected(
        phase="load",
        error="builtins.KeyError: 'X'",
        finding=("VD215", "config.json:hybrid_override_pattern[2]", "hybrid_override_pattern[2] is 'X'"),
    ),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("hybrid-examples"), *EXPECTED)


@pytest.fixture(scope="module")
def runs(built: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("hybrid-engines")
    return {name: run_tokens(name, built / name, work / name) for name in EXPECTED}


@pytest.fixture(scope="module")
def checks(built: Path) -> dict[str, Any]:
    """``vllm-doctor check --json`` of each variant, its plugin site on PYTHONPATH."""
    out = {}
    for name in EXPECTED:
        env = dict(os.environ, PYTHONPATH=str(built / name / "site"))
        proc = run_doctor(["check", str(built / name / "model"), "--json", *CHECK_LIMIT], env=env, timeout=600)
        out[name] = (proc.returncode, json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None, proc)
    return out


def test_every_hybrid_variant_has_an_expectation() -> None:
    on_disk = {p.name for p in (EXAMPLES / "hybrid").iterdir() if (p / "variant.py").is_file()}
    assert on_disk | {"hybrid-ok"} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vllm_behaviour(name: str, runs: dict[str, dict[str, Any]]) -> None:
    result, expected = runs[name], EXPECTED[name]
    shown = json.dumps({k: v for k, v in result.items() if k != "log_tail"}, indent=1)[:3000]
    assert result["phase"] == expected.phase, shown
    if expected.phase == "ran":
        assert len(result["token_ids"]) == len(PROMPTS) and all(result["token_ids"]), shown
        assert result["model_class"] == "tiny_hybrid_model.model.TinyHybridForCausalLM", shown
        return
    assert expected.error is not None and expected.error in result["error_message"], shown


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_doctor_names_the_cause_before_launch(name: str, checks: dict[str, Any]) -> None:
    code, report, proc = checks[name]
    assert report is not None, proc.stderr[-3000:]
    expected = EXPECTED[name]
    alarms = [
        (f["code"], f["subject"], f["message"]) for f in report["findings"] if f["outcome"] in ("fail", "warn", "crash")
    ]
    if expected.finding is None:
        assert code == 0 and not alarms, alarms
        assert {f["code"]: f["outcome"] for f in report["findings"]}.keys() >= {"VD214", "VD215"}
        return
    want_code, subject, start = expected.finding
    assert code == 1
    assert any(c == want_code and s == subject and m.startswith(start) for c, s, m in alarms), alarms
