"""examples/pytest_for_model_authors/ run as an author would: pytest on its tests/ folder, against
a real vLLM engine and the example's Hugging Face reference (float32, CPU).

The working example passes every assertion, with one engine-stage run and one parity run for
the whole session (the session cache). Each broken port (examples/pytest_for_model_authors/ports:
loads and runs in vLLM without error, computes something else) fails assert_logprobs_close and
names the first divergent decoder layer its variant.json expects. An in-tree architecture is
compared with transformers' own class (AutoModelForCausalLM).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, make_examples, variant_env

EXAMPLE_TESTS = REPO / "examples" / "pytest_for_model_authors" / "tests"
PORTS = sorted(p.name for p in (REPO / "examples" / "pytest_for_model_authors" / "ports").iterdir() if p.is_dir())
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("ports"), "ok", "arch-typo", *PORTS)


def _plugin_arg() -> list[str]:
    """``-p`` for the doctor's pytest plugin where its entry point is not installed (a source
    checkout on PYTHONPATH, as on the GPU machine)."""
    from tests.fixtures.entry_points import doctor_entry_point, entry_point_installed

    return [] if entry_point_installed("pytest11") else ["-p", doctor_entry_point("pytest11")]


def run_author_tests(built: Path, name: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(EXAMPLE_TESTS), "-p", "no:cacheprovider", "-rA", *_plugin_arg(),
         "--vllm-doctor-model", str(built / name / "model"), "--vllm-doctor-report", str(report), *args],
        env=variant_env(built, name), capture_output=True, text=True, timeout=900, cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert report.is_file(), proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc, json.loads(report.read_text())


def test_the_working_model_passes_every_assertion(built: Path, tmp_path: Path) -> None:
    # --vllm-doctor-eager: a fast engine for the engine assertions (the example compiles in vLLM's
    # default mode; the fixture in that mode: tests/engine/test_engine_front_ends.py)
    proc, report = run_author_tests(built, "ok", tmp_path, "--vllm-doctor-eager")
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "6 passed" in proc.stdout
    assert [(o["assertion"], o["ok"]) for o in report["outcomes"]] == [
        ("checks_pass", True), ("weights_cover", True), ("kv_cache_fits", True), ("on_device", True),
        ("logprobs_close", True), ("logprobs_close", True),
    ]  # fmt: skip
    # one engine-stage run serves both engine assertions; one parity engine serves both parity
    # assertions (different prompts); two engines started in all
    assert report["runs"] == {"check": 1, "engine": 1, "parity": 2, "parity_engine": 1}
    assert report["engine_runs"] == 2
    parity = next(o for o in report["outcomes"] if o["assertion"] == "logprobs_close")["details"]["parity"]
    assert parity["max_logprob_diff"] < 1e-4  # a correct float32 port matches to ~1e-6 here
    assert parity["first_divergent_layer"] is None
    assert "vllm-doctor" in proc.stdout and "PASS logprobs_close" in proc.stdout  # the terminal summary


@pytest.mark.parametrize("port", PORTS)
def test_a_broken_port_fails_and_names_its_first_divergent_layer(built: Path, tmp_path: Path, port: str) -> None:
    expected = json.loads((built / port / "variant.json").read_text())["expect_first_divergent_layer"]
    proc, report = run_author_tests(built, port, tmp_path, "-k", "hf_reference")
    assert proc.returncode == 1, proc.stdout[-6000:]
    assert "1 failed" in proc.stdout
    assert f"first divergent layer: {expected} (model.layers.{expected})" in proc.stdout
    assert "Traceback" not in proc.stdout  # the failure is the doctor's message, not a stack
    (outcome,) = report["outcomes"]
    parity = outcome["details"]["parity"]
    assert outcome["ok"] is False and parity["first_divergent_layer"] == expected
    # a bug on every step shows on the prefill first; the layers are compared there, no second round
    assert parity["first_difference"]["phase"] == "prefill" and parity["layers_on"] == parity["first_difference"]
    where = f"prefill of prompt {parity['first_difference']['prompt']}"
    assert f"{where}: layer {expected}'s output differs first" in proc.stdout
    assert [c["diverging"] for c in parity["layer_checks"]][-1] is True
    rows = {row["layer"]: row for row in parity["layers"]}
    assert all(rows[i]["max_rel"] <= parity["hidden_rtol"] for i in range(expected))  # the layers before agree
    assert rows[expected]["max_rel"] > parity["hidden_rtol"]
    assert parity["hint"]


def test_an_in_tree_architecture_is_compared_with_auto_model_for_causal_lm(tmp_path: Path) -> None:
    """No author class: vLLM's own Llama against transformers' LlamaForCausalLM (the API underneath)."""
    from tests.fixtures.engine_models import build_llama_dir
    from vllm_doctor.api import compare_with_reference

    model = build_llama_dir(tmp_path / "llama", ["LlamaForCausalLM"], dtype="float32")
    result = compare_with_reference(str(model), prompts=[[5, 9, 13, 40, 77, 101, 3, 8]], max_tokens=8, device="cpu")
    assert result.ok, result.message()
    assert result.reference == "Hugging Face (transformers.models.llama.modeling_llama.LlamaForCausalLM)"
    assert result.max_logprob_diff < 1e-4 and [row.layer for row in result.layers] == [0, 1]
    assert all(row.max_rel < 1e-4 for row in result.layers)  # vLLM's (hidden, residual) pairs summed right


def test_an_engine_that_refuses_the_model_is_a_clear_failure_not_a_traceback(built: Path, tmp_path: Path) -> None:
    """vLLM cannot build the model (arch-typo): the test fails with vLLM's own reason, no stack."""
    proc, report = run_author_tests(built, "arch-typo", tmp_path, "-k", "hf_reference")
    assert proc.returncode == 1, proc.stdout[-6000:]
    assert "vllm-doctor: the parity check could not run: vLLM could not run" in proc.stdout
    assert "TinyDoctorForCausalLm" in proc.stdout and "are not supported for now" in proc.stdout
    assert "Traceback" not in proc.stdout and "During handling" not in proc.stdout
    assert f"`vllm-doctor check {built / 'arch-typo' / 'model'}` diagnoses" in proc.stdout
    (outcome,) = report["outcomes"]
    assert outcome["ok"] is False and outcome["summary"] == "could not run"
