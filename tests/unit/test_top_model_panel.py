"""What ``top``'s model panel and its help say: units and what is summed, the mode the server
runs, and why a forward time is missing (issue 47: "slowest layers" was a window sum in ms beside
per-step times, the help said "eager mode" on a compiled server, "fwd n/a" had no reason)."""

from __future__ import annotations

from typing import Any

from tests.unit.test_live_metrics import exposition
from vllm_doctor.analysis.records import LayerTotal, PhaseSummary
from vllm_doctor.facts.anatomy import CompileState
from vllm_doctor.live.derive import Deriver
from vllm_doctor.live.glossary import glossary
from vllm_doctor.live.sources import Frame, ModelSummary, run_mode
from vllm_doctor.tui.panels import model_panel


def _panel(**summary: Any) -> str:
    model = ModelSummary(available=True, model_class="pkg.TinyDoctorForCausalLM", steps=200, **summary)
    frame = Frame(
        seq=1, t=0.0, url="u", interval_s=1.0, metrics=Deriver().update(0.0, exposition()), model=model
    )
    return model_panel(frame, 80).plain


def test_slowest_layers_are_per_timed_step_like_the_forward() -> None:
    layers = [LayerTotal(layer=0, total_s=0.008), LayerTotal(layer=1, total_s=0.004)]
    text = _panel(slowest_layers=layers, layers_timed_steps=4, mode="eager")
    assert "slowest layers/step: #0 2.00 ms · #1 1.00 ms" in text, text
    # a recording from before the count: its numbers are named for what they are
    assert "slowest layers, window sum: #0 8.00 ms" in _panel(slowest_layers=layers)


def test_a_missing_forward_says_why() -> None:
    decode = PhaseSummary(steps=180, step_s_p50=0.003)
    compiled = _panel(phases={"decode": decode}, mode="torch.compile + CUDA graphs", sample_every=64)
    assert "fwd –  p50 step 3.00 ms" in compiled and "n/a" not in compiled
    reason = "fwd –: not timed under torch.compile + CUDA graphs (the doctor times the forward in eager mode)"
    assert reason in " ".join(line.strip() for line in compiled.splitlines()), compiled  # wrapped, never cut
    # a recording that does not say the mode: that many decode steps had a sampled one
    unknown = " ".join(_panel(phases={"decode": decode}).split())
    assert "fwd –: not timed on this server (the doctor times the forward in eager mode)" in unknown, unknown
    timed = PhaseSummary(steps=20, forward_s_mean=0.002, forward_steps=1, forward_steps_step_s_mean=0.003)
    few = PhaseSummary(steps=30, step_s_p50=0.003)  # fewer than the sampling cadence
    eager = _panel(phases={"prefill": timed, "decode": few}, mode="eager", sample_every=64)
    assert "fwd –: no decode step sampled in this window (1 step in 64 is)" in " ".join(eager.split()), eager
    assert "fwd –:" not in _panel(phases={"prefill": timed}, mode="eager")


def test_the_help_names_the_mode_the_server_runs() -> None:
    def layers_row(mode: str | None) -> str:
        return next(source for panel, number, source, _ in glossary(mode) if number.startswith("slowest layers"))

    compiled = layers_row("torch.compile + CUDA graphs")
    assert "this server runs torch.compile + CUDA graphs" in compiled and "eager mode" not in compiled
    assert "this server runs eager" in layers_row("eager") and "module forwards" in layers_row("eager")
    assert "eager mode" in layers_row(None) and "compiled modes" in layers_row(None)  # not known: both


def test_the_mode_from_the_workers_compile_state() -> None:
    assert run_mode(CompileState(eager=True, enforce_eager=True)) == "eager"
    assert run_mode(CompileState(eager=False, compiled=True, cudagraphs=True)) == "torch.compile + CUDA graphs"
    assert run_mode(CompileState(eager=False, compiled=True, cudagraphs=False)) == "torch.compile"
    assert run_mode(None) is None and run_mode(CompileState()) is None
