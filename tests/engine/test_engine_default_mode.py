"""The doctor on a REAL engine in vLLM's default mode (CPU: torch.compile, inductor), vLLM's own Llama.

One session-scoped single-process engine, started as users start it (no ``enforce_eager``): the
forward is compiled, so the per-layer timings come from the attention calls (the compiled graph's
only Python calls), the forward's from the runner's call of the model (vLLM's V1 runner, which the
CPU runner subclasses: ``_model_forward``, where a GPU's FULL CUDA graph replays). Asserts that the outputs
are bit-identical with and without the doctor (every step sampled, per-layer wrappers on), that
forward and per-layer times exist and account for the forward, and that the steps fit in the wall
time of the workload (steps of one engine do not overlap). No wall-clock thresholds.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]
PROMPTS = ["hello world", "the doctor is in my name", "a of and to in is the"]
MAX_TOKENS = 12
LAYERS = 2


@dataclass
class Run:
    base: list[list[int]]
    during: list[list[int]]
    after: list[list[int]]
    wall_s: float
    report: Any
    mode: dict[str, Any]
    layer_wrappers: int  # the doctor's wrappers while attached (attention calls)
    left_on_impls: int  # attention implementations still carrying one after detach
    timer_targets: list[str]  # what the doctor's timers time while attached
    left_on_runner: list[str]  # the doctor's instance attributes left on the model runner after detach


def _generate(llm: Any) -> list[list[int]]:
    from vllm_doctor.compat.llm import greedy

    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy(MAX_TOKENS, ignore_eos=True))]


@pytest.fixture(scope="session")
def default_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    from tests.fixtures.engine_models import build_llama_dir
    from vllm_doctor.compat.llm import execution_mode, shutdown, start_engine

    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    model = build_llama_dir(tmp_path_factory.mktemp("default-mode") / "llama", ["LlamaForCausalLM"],
                            {"num_hidden_layers": LAYERS})
    llm = start_engine(str(model), max_model_len=256, kv_cache_memory_bytes=64 * 2**20)  # vLLM's default mode
    try:
        import vllm_doctor
        from vllm_doctor.compat import worker as wv
        from vllm_doctor.compat.llm import EngineHandle
        from vllm_doctor.compat.mixers import mixer_calls

        base = _generate(llm)
        with vllm_doctor.attach(llm, sample_every=1, probe=False) as doc:
            t = time.perf_counter()
            during = _generate(llm)
            wall = time.perf_counter() - t
            status = EngineHandle(llm).rpc("doctor_status")[0]["data"]
        after = _generate(llm)
        worker = llm.llm_engine.model_executor.driver_worker.worker
        left = sum(1 for c in mixer_calls(wv.forward_context(worker)) if set(c.attrs) & set(vars(c.obj)))
        on_runner = [k for k in ("_model_forward", "execute_model", "sample_tokens") if k in vars(worker.model_runner)]
        yield Run(base, during, after, wall, doc.report(), execution_mode(llm), status["layer_wrappers"], left,
                  status["timer_targets"], on_runner)
    finally:
        shutdown(llm)
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def test_the_engine_runs_compiled(default_mode: Run) -> None:
    assert default_mode.mode["enforce_eager"] is False and default_mode.mode["compilation_mode"] != "NONE"
    compile_state = default_mode.report.to_dict()["facts"]["engine"]["compile"]
    assert compile_state["compiled"] and not compile_state["eager"], compile_state


def test_outputs_are_bit_identical_with_and_without_the_doctor_in_default_mode(default_mode: Run) -> None:
    assert default_mode.base == default_mode.during == default_mode.after
    assert all(len(t) == MAX_TOKENS for t in default_mode.base)


def test_forward_and_per_layer_times_in_default_mode(default_mode: Run) -> None:
    profile = default_mode.report.to_dict()["profiles"]["engine"]
    assert profile["layers_on"] is True and profile["layers_reason"].startswith("compiled mode: timed at the token mixers' calls")
    steps = profile["steps"]
    assert steps and all(s["sampled"] and s["forward_s"] and 0 < s["forward_s"] <= s["step_s"] for s in steps)
    assert all(s["layers_timed"] for s in steps)
    for phase in ("prefill", "decode"):
        assert profile["phases"][phase]["forward_s_mean"] > 0 and 0 < profile["phases"][phase]["forward_share"] <= 1
    layers = profile["layers"]
    assert layers["timed_fraction"] >= 0.9
    assert [b["layer"] for b in layers["by_layer"]] == list(range(LAYERS))
    assert all(b["kinds"]["attention"] > 0 and b["kinds"]["dense"] > 0 for b in layers["by_layer"])
    assert {"embedding", "attention", "dense", "logits"} <= set(layers["by_kind"])
    # the steps on the wall clock fit in the workload's wall time (steps of one engine do not overlap)
    assert profile["clock"] == "wall_clock" and sum(s["step_s"] for s in steps) <= default_mode.wall_s


def test_the_steps_and_the_idle_time_between_them_account_for_the_wall_time(default_mode: Run) -> None:
    """Each step's idle_before_s is the time since the previous step ended on the same clock: on
    the wall clock a step's time plus the next step's idle time is the distance between their
    starts; the steps and the idle time between them fit in the workload's wall time (what is
    left ran before the first step and after the last: in this short workload the prompts'
    tokenization and the outputs' detokenization are a fifth of it)."""
    from vllm_doctor.analysis.engine import time_accounting
    from vllm_doctor.analysis.records import EngineProfile, WorkloadRun

    profile = default_mode.report.to_dict()["profiles"]["engine"]
    steps = profile["steps"]
    assert steps[0]["idle_before_s"] is None and all(s["idle_before_s"] >= 0 for s in steps[1:])
    for a, b in itertools.pairwise(steps):
        assert b["t"] - a["t"] == pytest.approx(a["step_s"] + b["idle_before_s"], abs=2e-3)
    acc = time_accounting(EngineProfile.of(profile), WorkloadRun(wall_s=default_mode.wall_s))
    assert acc is not None and acc.between_steps_s == pytest.approx(sum(s["idle_before_s"] for s in steps[1:]))
    # measured, not capped: the steps and the gaps between them fit in the wall time
    assert acc.steps_s + sum(s["idle_before_s"] for s in steps[1:]) <= default_mode.wall_s
    assert acc.accounted_share is not None and 0 < acc.accounted_share <= 1.0
    assert acc.edges_s is not None and acc.edges_s >= 0


def test_no_rate_above_a_peak_and_none_claimed_on_cpu(default_mode: Run) -> None:
    roof = default_mode.report.to_dict()["profiles"]["engine"]["roofline"]
    assert roof["available"] and not roof.get("above_peak")
    for phase in roof["phases"].values():
        assert phase["bytes_per_s"] > 0 and phase["bandwidth_share"] is None  # a CPU's peak is unknown


def test_detach_takes_the_attention_wrappers_off(default_mode: Run) -> None:
    assert default_mode.layer_wrappers >= LAYERS  # each layer's attention (and KV write) calls were wrapped
    assert default_mode.left_on_impls == 0


def test_the_forward_is_timed_at_the_v1_runners_model_call_and_detach_takes_it_off(default_mode: Run) -> None:
    """vLLM's V1 runner calls the model through ``_model_forward`` (on a GPU a CUDAGraphWrapper that
    replays a FULL graph: no Python of the model runs): the doctor times the forward there, in place
    of the root model's forward (the two would nest), on sampled steps only, and detach takes it off."""
    runner_timers = [t for t in default_mode.timer_targets if t.endswith("._model_forward")]
    assert len(runner_timers) == 1 and "Runner" in runner_timers[0], default_mode.timer_targets
    others = [t for t in default_mode.timer_targets if t not in runner_timers]
    assert not any(t.startswith("LlamaForCausalLM.") for t in others), default_mode.timer_targets
    assert default_mode.left_on_runner == []  # nor the step wrappers
