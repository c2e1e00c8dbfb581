"""Unit tests of the engine stage's pure parts: no vLLM engine, fake workers and snapshots."""

from __future__ import annotations

import array
import json
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from vllm_doctor.analysis.engine import (
    anatomy,
    doctor_overhead,
    layer_tables,
    memory_breakdown,
    model_origin,
    process_memory,
    summarize,
)
from vllm_doctor.analysis.records import ProfileReply, RankSummary
from vllm_doctor.checks import CATALOGUE, run_checks
from vllm_doctor.checks.kv_cache import blocks_needed, largest_length
from vllm_doctor.compat import nvml
from vllm_doctor.compat.llm import EngineHandle, ExtensionMissing, engine_kwargs
from vllm_doctor.constants import STEP_CLOCK_STRIDE
from vllm_doctor.engine import EXTENSION_QUALNAME, SAMPLE_WARMUP_STEPS
from vllm_doctor.engine.clock import WallClock
from vllm_doctor.engine.extension import DoctorWorkerExtension
from vllm_doctor.engine.layers import layer_index, module_kind, moe_parts, select_modules
from vllm_doctor.engine.probe import ProbeModes, ProbeRecorder
from vllm_doctor.engine.profiler import MOE_SPAN, ForwardProfiler, OpenStep
from vllm_doctor.engine.steps import COUNT_FIELDS, StepTracker, counts_dict, phase_of
from vllm_doctor.facts import wire
from vllm_doctor.facts.engine import EngineFacts, ExecutionMode, WorkerFacts
from vllm_doctor.facts.kv import KvGroup
from vllm_doctor.facts.memory import MemoryFacts
from vllm_doctor.facts.placement import Shard
from vllm_doctor.facts.steps import StepTable
from vllm_doctor.model import Outcome, Severity, Stage
from vllm_doctor.report.profile import marks_cost_text
from vllm_doctor.stages.static import CheckOptions, selected_codes


def run(code: str, facts: Any) -> list[Any]:
    """One check through the runner (its gates first, as in every real run)."""
    return run_checks(facts, [code])


# ---- a toy model shaped like a decoder ------------------------------------------------------


class ToyAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj = nn.Linear(8, 8)
        self.rotary_emb = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv_proj(self.rotary_emb(x))


class ToyMLP(nn.Module):
    def __init__(self, faulty: bool = False) -> None:
        super().__init__()
        self.down_proj = nn.Linear(8, 8)
        self.faulty = faulty

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.faulty:
            x.sum().item()
            torch.nonzero(x)
            torch.empty(2, device="meta")
            x[:1].to("meta")
            x[:1].tolist()
        return self.down_proj(x)


class ToyLayer(nn.Module):
    def __init__(self, faulty: bool) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(8)
        self.self_attn = ToyAttention()
        self.mlp = ToyMLP(faulty)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.self_attn(self.input_layernorm(x)))


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(16, 8)
        self.layers = nn.ModuleList([ToyLayer(False), ToyLayer(True)])
        self.norm = nn.LayerNorm(8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class ToyForCausalLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = ToyModel()
        self.logits_processor = nn.Identity()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids)


def test_module_kinds_and_selection_times_topmost_modules_only() -> None:
    model = ToyForCausalLM()
    chosen = {m.name: (m.kind, m.layer) for m in select_modules(model)}
    assert chosen[""] == ("model", None)
    assert chosen["model.embed_tokens"] == ("embedding", None)
    assert chosen["model.layers.1"] == ("layer", 1)
    assert chosen["model.layers.1.self_attn"] == ("attention", 1)
    assert chosen["model.layers.0.mlp"] == ("mlp", 0)
    assert chosen["model.layers.0.input_layernorm"] == ("norm", 0)
    assert chosen["model.norm"] == ("norm", None)
    assert chosen["logits_processor"] == ("logits", None)
    assert "model.layers.0.self_attn.qkv_proj" not in chosen  # inside attention: not double counted
    assert "model.layers.0.self_attn.rotary_emb" not in chosen
    assert module_kind("lm_head", nn.Linear(2, 2)) == "logits"
    assert layer_index("model.layers.12.mlp.down_proj") == 12
    assert layer_index("model.norm") is None


class ToyExperts(nn.Module):
    """Asked as vLLM's fused experts are: a ``weight_loader`` that takes an ``expert_id``."""

    def __init__(self) -> None:
        super().__init__()
        self.w13_weight = nn.Parameter(torch.zeros(4, 16, 8))

    def weight_loader(self, param: Any, loaded_weight: Any, weight_name: str, shard_id: str, expert_id: int) -> None:
        pass


class ToyRunner(nn.Module):
    """vLLM's MoERunner: holds the routed experts, and sometimes the gate and shared expert it runs."""

    def __init__(self, held: tuple[nn.Module, ...] = ()) -> None:
        super().__init__()
        self.routed_experts = ToyExperts()
        self.held = nn.ModuleList(held)


class ToyMoeBlock(nn.Module):
    def __init__(self, shared_inside: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)
        self.shared_expert = ToyMLP()
        self.shared_expert_gate = nn.Linear(8, 1)
        self.experts = ToyRunner((self.gate, self.shared_expert) if shared_inside else ())


def test_an_moe_block_is_split_into_router_and_experts_never_counted_twice() -> None:
    model = ToyForCausalLM()
    model.model.layers[0].mlp = ToyMoeBlock(shared_inside=False)  # type: ignore[assignment]
    model.model.layers[1].mlp = ToyMoeBlock(shared_inside=True)  # type: ignore[assignment]
    chosen = {m.name: m.kind for m in select_modules(model)}
    assert "model.layers.0.mlp" not in chosen and "model.layers.1.mlp" not in chosen  # its parts are timed
    assert chosen["model.layers.0.mlp.gate"] == "router"
    assert chosen["model.layers.0.mlp.experts"] == "experts"
    assert chosen["model.layers.0.mlp.shared_expert"] == "mlp"  # a shared expert the block runs itself
    assert chosen["model.layers.0.self_attn"] == "attention"
    # the runner holds the gate and the shared expert (vLLM runs them inside the fused op): in "experts" only
    assert chosen["model.layers.1.mlp.experts"] == "experts"
    assert "model.layers.1.mlp.gate" not in chosen and "model.layers.1.mlp.shared_expert" not in chosen
    assert not any(n.startswith("model.layers.0.mlp.experts.") for n in chosen)
    assert moe_parts(ToyForCausalLM()) == {}  # a dense model has no MoE parts
    # "moe" in an MoE model's class names: the model and its decoder layers are no MLP
    assert module_kind("model", type("TinyMoeModel", (nn.Module,), {})()) is None
    assert module_kind("model.layers.0.block_sparse_moe", type("MixtralMoE", (nn.Module,), {})()) == "mlp"


def test_probe_names_module_for_host_syncs_and_wrong_device_ops() -> None:
    model = ToyForCausalLM()
    rec = ProbeRecorder(model, torch.device("cpu"))
    rec.install_hooks()
    modes = ProbeModes(rec)
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        expected = model(ids)
        modes.enter()
        try:
            got = model(ids)
        finally:
            modes.exit()
    rec.remove_hooks()
    assert torch.equal(expected, got)  # the modes only observe
    found = {(e["kind"], e["op"], e["module"]) for e in rec.snapshot()["events"]}
    assert ("host_sync", "Tensor.item", "model.layers.1.mlp") in found
    assert ("host_sync", "Tensor.tolist", "model.layers.1.mlp") in found
    assert ("data_dependent", "aten.nonzero.default", "model.layers.1.mlp") in found
    assert ("wrong_device_create", "aten.empty.memory_format", "model.layers.1.mlp") in found
    assert any(k == "cross_device_copy" and m == "model.layers.1.mlp" for k, _, m in found)
    assert not any(m.startswith("model.layers.0") for _, _, m in found)  # the clean layer is clean
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == 0


def _two_requests(steps: int, prompt: int = 3, restart_at: int | None = None) -> list[Any]:
    """SchedulerOutputs of two requests: a prefill, then one-token decode steps; at
    ``restart_at`` both finish and two new ones start."""
    out, ids, start = [], ("a", "b"), 0
    for i in range(steps):
        if i in (0, restart_at):
            finished = set(ids) if i else set()
            ids, start = (ids, 0) if not i else ((ids[0] + "'", ids[1] + "'"), i)
            out.append(
                _so(
                    [_new(r, prompt, [10 * i + k + 1]) for k, r in enumerate(ids)],
                    [],
                    dict.fromkeys(ids, prompt),
                    finished=finished,
                )
            )
        else:
            out.append(_so([], [(r, prompt + i - start - 1, None) for r in ids], dict.fromkeys(ids, 1)))
    return out


def test_forward_profiler_aggregates_steps_and_layers_with_wall_clock() -> None:
    model = ToyForCausalLM()
    timed = select_modules(model)
    prof = ForwardProfiler(WallClock(), timed)
    for so in _two_requests(2):
        prof.begin_step(so)
        prof.module_enter("")
        prof.module_enter("model.layers.0")
        prof.module_exit("model.layers.0")
        prof.module_exit("")
        prof.module_enter("logits_processor")
        prof.module_exit("logits_processor")
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    snap = prof.snapshot()
    assert [s["phase"] for s in StepTable.of(snap).rows()] == ["prefill", "decode"]
    assert [(s["prefill_tokens"], s["decode_tokens"], s["kv_blocks_used"]) for s in StepTable.of(snap).rows()] == [
        (6, 0, 2),
        (0, 2, 2),
    ]
    assert all(s["forward_s"] is not None and s["step_s"] >= s["forward_s"] for s in StepTable.of(snap).rows())
    layer0 = next(m for m in snap["layers"] if m["name"] == "model.layers.0")
    assert (layer0["prefill_calls"], layer0["decode_calls"]) == (1, 1)
    assert len(snap["trace"]) == 2 and snap["trace"][0]["layers"]


def test_per_layer_timing_samples_the_first_steps_of_each_phase_then_every_nth() -> None:
    prof = ForwardProfiler(WallClock(), select_modules(ToyForCausalLM()), sample_every=4)
    prof.layers_enabled = True
    timed = {}
    for i, so in enumerate(_two_requests(20, restart_at=10)):
        step = prof.begin_step(so)
        assert step is not None and step is prof.current
        timed[i] = isinstance(step, OpenStep) and step.layers_timed
        prof.after_execute(0.001, output_is_final=True)
    # both prefills (each phase has its own warm-up); decode steps 0-7 of that phase, then its 8th, 12th, 16th
    decode_steps = [i for i in range(20) if i not in (0, 10)]
    expected_decode = {decode_steps[n] for n in range(len(decode_steps)) if n < 8 or (n - 8) % 4 == 0}
    assert {i for i, t in timed.items() if t} == {0, 10} | expected_decode
    snap = prof.snapshot()
    assert [s["layers_timed"] for s in StepTable.of(snap).rows()] == [timed[i] for i in range(20)]
    assert [s["phase"] for s in StepTable.of(snap).rows()] == [
        "decode" if i in decode_steps else "prefill" for i in range(20)
    ]
    assert snap["sample_every"] == 4


def test_eager_per_layer_timing_splits_inside_the_layers_on_every_nth_timed_step_and_scales_those_modules() -> None:
    """The two grains: every step timed per layer times the decoder layers, every detail_every-th
    of them per phase (the first included) the modules inside them too; each module counts the
    steps it was timed on, and the layer tables scale an inner module's total to all timed steps."""
    prof = ForwardProfiler(WallClock(), select_modules(ToyForCausalLM()), sample_every=1, detail_every=3)
    prof.layers_enabled = True
    detail = []
    for so in _two_requests(8):  # one prefill, seven decode steps, all timed per layer
        step = prof.begin_step(so)
        assert isinstance(step, OpenStep) and step.layers_timed
        detail.append(step.layers_detail)
        prof.module_enter("")
        prof.module_enter("model.layers.0")
        if step.layers_detail:  # what the session arms on a detailed step only
            prof.module_enter("model.layers.0.self_attn")
        time.sleep(0.002)  # the attention runs on every step, timed or not
        if step.layers_detail:
            prof.module_exit("model.layers.0.self_attn")
        prof.module_exit("model.layers.0")
        prof.module_exit("")
        prof.after_execute(0.001, output_is_final=True)
    # the prefill phase's first step; decode's 1st, 4th and 7th
    assert detail == [True, True, False, False, True, False, False, True]
    snap = prof.snapshot()
    assert snap["detail_every"] == 3
    rows = StepTable.of(snap).rows()
    assert [r["layers_detail"] for r in rows] == detail and all(r["layers_timed"] for r in rows)
    stats = {m["name"]: m for m in snap["layers"]}
    assert (stats["model.layers.0"]["decode_steps"], stats["model.layers.0.self_attn"]["decode_steps"]) == (7, 3)
    attn, layer_stats = stats["model.layers.0.self_attn"], stats["model.layers.0"]
    # the layer's time on the detailed steps: the prefill's (its only step) and three decode steps'
    assert layer_stats["prefill_detail_s"] == layer_stats["prefill_s"]
    assert 0 < layer_stats["decode_detail_s"] < layer_stats["decode_s"]
    tables = layer_tables(ProfileReply.of(snap), StepTable.of(snap))
    assert tables.doctor_cost[0].measured is False  # every step timed: no untimed neighbour, nothing taken out
    scaled = next(m for m in tables.modules if m.name == "model.layers.0.self_attn")
    # scaled by its layer's time on all timed steps over its time on the detailed ones
    by_layer = layer_stats["decode_s"] / layer_stats["decode_detail_s"]
    assert scaled.total_s == pytest.approx(attn["prefill_s"] + attn["decode_s"] * by_layer)
    layer = next(m for m in tables.modules if m.name == "model.layers.0")
    assert layer.total_s == pytest.approx(layer_stats["prefill_s"] + layer_stats["decode_s"])


class StepperClock:
    """A device clock the test moves by hand: a mark is the time now (no events, no host)."""

    kind = "cuda_events"
    domain = "device"
    one_stream = True

    def __init__(self) -> None:
        self.now = 0.0

    def mark(self, refresh: bool = False) -> float:
        return self.now

    def reserve(self, count: int) -> None:
        pass

    @staticmethod
    def capturing() -> bool:
        return False

    def ready(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        pass

    def seconds(self, start: float, end: float) -> float:
        return end - start


@dataclass
class EagerRun:
    """An eager per-layer profile on a clock the test moves (:func:`_eager_run`)."""

    prof: ForwardProfiler
    kinds: list[str]  # per step: untimed, boundary or detail
    boundary: list[str]
    inner: dict[str, int | None]
    n_layers: int
    per_layer: int


def _eager_run(
    steps: int,
    cost: float,
    work: tuple[float, float, float, float],
    sample_every: int = 2,
    detail_every: int = 3,
    slowed: dict[int, float] | None = None,
) -> EagerRun:
    """Eager's two grains on a clock the test moves: a step timed at the boundaries marks each
    boundary module once where it is entered (its span runs to the next mark, the last to the
    forward's end), a detailed step marks every module's entry and return. Each of the doctor's
    marks costs ``cost`` on the device (the wrappers' Python and event between two launches);
    ``work``: a decoder layer's, a module's inside a layer, the embedding's (and the final norm's),
    the logits processor's; ``slowed``: step index -> time added to that step by something else
    (the host's noise), inside its forward."""
    layer_work, inner_work, embed_work, logits_work = work
    model = ToyForCausalLM()
    timed_modules = select_modules(model)
    clock = StepperClock()
    prof = ForwardProfiler(clock, timed_modules, sample_every=sample_every, detail_every=detail_every, own_budget=0.0)  # type: ignore[arg-type]
    prof.layers_enabled = True
    boundary = [
        m.name for m in timed_modules if m.kind in ("layer", "embedding") or (m.kind == "norm" and m.layer is None)
    ]
    inner = {m.name: m.layer for m in timed_modules if m.layer is not None and m.kind not in ("layer",)}
    n_layers = sum(1 for m in timed_modules if m.kind == "layer")
    per_layer = len(inner) // n_layers  # attention, MLP, a norm

    def mark(fn: Any, *args: Any) -> None:
        fn(*args)
        clock.now += cost  # the doctor's cost right after its mark

    def module_work(name: str) -> float:
        if name in inner:
            return inner_work
        return embed_work if name in ("model.embed_tokens", "model.norm") else layer_work - per_layer * inner_work

    kinds = []
    for i, so in enumerate(_two_requests(steps)):
        step = prof.begin_step(so)
        clock.now += 0.0001
        if not isinstance(step, OpenStep):  # untimed: the work alone
            clock.now += sum(module_work(n) for n in boundary) + n_layers * per_layer * inner_work + logits_work
            clock.now += (slowed or {}).get(i, 0.0)
            prof.after_execute(0.0, output_is_final=True)
            kinds.append("untimed")
            continue
        kinds.append("detail" if step.layers_detail else "boundary")
        mark(prof.module_enter, "", True)
        for name in boundary:
            if not step.layers_detail:
                mark(prof.module_mark, name)
                clock.now += module_work(name)
                if name.startswith("model.layers."):
                    clock.now += per_layer * inner_work
                continue
            mark(prof.module_enter, name)
            clock.now += module_work(name)
            for sub in (n for n, layer in inner.items() if f"model.layers.{layer}" == name):
                mark(prof.module_enter, sub)
                clock.now += inner_work
                mark(prof.module_exit, sub)
            mark(prof.module_exit, name)
        clock.now += (slowed or {}).get(i, 0.0)
        mark(prof.module_exit, "")
        mark(prof.module_enter, "logits_processor")
        clock.now += logits_work
        mark(prof.module_exit, "logits_processor")
        prof.after_execute(0.0, output_is_final=True)
    return EagerRun(prof, kinds, boundary, inner, n_layers, per_layer)


def test_eager_boundary_steps_mark_each_module_once_and_the_tables_take_the_marks_cost_out() -> None:
    """Each of the doctor's marks costs C on the device, each module W or w of work
    (:func:`_eager_run`): the timed steps set against their untimed neighbours give C per mark,
    and the layer tables give back the work alone."""
    cost, layer_work, inner_work, embed_work, logits_work = 0.001, 0.010, 0.002, 0.0005, 0.003
    run = _eager_run(40, cost, (layer_work, inner_work, embed_work, logits_work))
    prof, kinds, boundary, inner = run.prof, run.kinds, run.boundary, run.inner
    n_layers, per_layer = run.n_layers, run.per_layer
    assert per_layer == 3

    def work(name: str) -> float:
        if name in inner:
            return inner_work
        return embed_work if name in ("model.embed_tokens", "model.norm") else layer_work - per_layer * inner_work

    assert {"untimed", "boundary", "detail"} <= set(kinds)
    snap = prof.snapshot()
    assert snap["boundary_marks"] == "entry"
    steps = StepTable.of(snap)
    tables = layer_tables(ProfileReply.of(snap), steps)
    (decode,) = [c for c in tables.doctor_cost if c.bucket == "decode"]
    assert decode.per_mark_s == pytest.approx(cost) and decode.detail_per_mark_s == pytest.approx(cost)
    assert decode.boundary_marks == len(boundary) + 4
    assert decode.detail_marks == 2 * (len(boundary) + len(inner)) + 4
    assert decode.boundary_steps and decode.detail_steps and decode.pairs and decode.detail_pairs
    modules = {m.name: m for m in tables.modules}
    layer0, attn0, norm = modules["model.layers.0"], modules["model.layers.0.self_attn"], modules["model.norm"]
    # measured on the clock: a layer's span holds its marks' cost ...
    assert layer0.decode_s > decode.boundary_steps * layer_work + decode.detail_steps * layer_work
    # ... which the tables take out: the work per step is what is left
    assert layer0.bucket_s("decode") == pytest.approx(layer_work * (decode.boundary_steps + decode.detail_steps))
    assert attn0.bucket_s("decode") == pytest.approx(inner_work * decode.detail_steps)
    assert norm.bucket_s("decode") == pytest.approx(embed_work * (decode.boundary_steps + decode.detail_steps))
    assert modules["logits_processor"].bucket_s("decode") == pytest.approx(
        logits_work * (decode.boundary_steps + decode.detail_steps)
    )
    # the record keeps what the clock read; the layer totals and the forward are the corrected ones
    assert layer0.decode_cost_s > 0 and layer0.measured_s("decode") == layer0.decode_s
    forward_per_step = sum(work(n) for n in boundary) + n_layers * per_layer * inner_work
    rows = steps.rows()
    prefill_forward = sum(r["forward_s"] for r in rows if r["phase"] == "prefill")  # no neighbour: as measured
    decode_timed = sum(1 for r in rows if r["phase"] == "decode" and r["layers_timed"])
    assert tables.forward_total_s == pytest.approx(forward_per_step * decode_timed + prefill_forward)


def test_a_marks_cost_from_one_noisy_step_is_no_estimate_the_modules_keep_their_time() -> None:
    """A short eager run (vLLM's sampling: the first 8 decode steps and every 8th timed, every 4th
    of those detailed) has one detailed and one boundary step next to untimed ones. The host
    slowed both by 60 ms (noise, not the marks): as one reading per grain they made a mark
    cost 2.7 and 7.7 ms and took all of the logits processor's decode time out (a side of
    ``--twin`` with no logits time: its ratio None, the likely cause of
    the one CI run whose twin ratios were not all finite). Three readings of a grain are
    needed: this bucket is shown as measured, and says why."""
    work = (0.010, 0.002, 0.0005, 0.003)
    run = _eager_run(24, 0.0002, work, sample_every=8, detail_every=4, slowed={9: 0.060, 17: 0.060})
    assert (
        run.kinds[1:]
        == ["detail"]
        + ["boundary"] * 3
        + ["detail"]
        + ["boundary"] * 3
        + ["detail"]
        + ["untimed"] * 7
        + ["boundary"]
        + ["untimed"] * 6
    )
    snap = run.prof.snapshot()
    tables = layer_tables(ProfileReply.of(snap), StepTable.of(snap))
    (decode,) = [c for c in tables.doctor_cost if c.bucket == "decode"]
    assert (decode.pairs, decode.detail_pairs) == (1, 1)
    assert decode.per_mark_s is None and decode.detail_per_mark_s is None and not decode.measured
    logits = next(m for m in tables.modules if m.name == "logits_processor")
    assert logits.bucket_s("decode") == pytest.approx(logits.decode_s) and logits.decode_s > 0
    assert tables.doctor_cost[0].corrected_s == 0.0 and decode.corrected_s == 0.0
    text = marks_cost_text(tables)
    assert "decode as measured (2 timed step(s) next to an untimed one: too few to estimate a mark's cost, " in text
    assert "prefill as measured (no timed step next to an untimed one)" in text


def test_compiled_mode_profiles_and_old_reports_have_no_marks_correction() -> None:
    """The correction needs the worker to say how it marked (this doctor's eager mode): a
    profile without ``boundary_marks`` (compiled modes, a report from before) is read as measured."""
    prof = ForwardProfiler(WallClock(), select_modules(ToyForCausalLM()), sample_every=1)
    prof.layers_enabled = True
    for so in _two_requests(4):
        prof.begin_step(so)
        prof.module_enter("")
        prof.module_enter("model.layers.0")
        prof.module_exit("model.layers.0")
        prof.module_exit("")
        prof.after_execute(0.0, output_is_final=True)
    snap = prof.snapshot()
    snap.pop("boundary_marks")
    tables = layer_tables(ProfileReply.of(snap), StepTable.of(snap))
    assert tables.doctor_cost == []
    layer = next(m for m in tables.modules if m.name == "model.layers.0")
    assert layer.bucket_s("decode") == layer.decode_s and layer.decode_cost_s == 0.0


def test_unsampled_steps_are_plain_records_and_empty_steps_still_free_blocks() -> None:
    prof = ForwardProfiler(WallClock(), [], sample_every=4)
    sos = _two_requests(16, restart_at=6)
    for i, so in enumerate(sos):
        if i == 6:  # a step with nothing scheduled is no step, but its finished requests free their blocks
            assert prof.begin_step(_so([], [], {}, finished={"a", "b"})) is None and prof.current is None
            assert prof.tracker.held == set() and prof.tracker.extra == {}
        step = prof.begin_step(so)
        # decode steps 0-7 of the phase are samples, then its 8th, 12th: steps 1-5 and 7-15 decode
        assert isinstance(step, OpenStep) == (i not in (11, 12, 13, 15))
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    snap = prof.snapshot()
    assert [s["index"] for s in StepTable.of(snap).rows()] == list(range(16))
    assert [s["kv_blocks_used"] for s in StepTable.of(snap).rows()] == [2] * 16
    assert [s["phase"] for s in StepTable.of(snap).rows()].count("prefill") == 2
    plain = [s for s in StepTable.of(snap).rows() if not s["sampled"]]
    assert len(plain) == 4 and all(s["forward_s"] is None and s["host_execute_s"] == 0.001 for s in plain)
    assert all(s["step_clock"] == "wall_clock" and s["step_s"] > 0 for s in plain)


class Mark:
    """A point in time as an object (hashed by identity, like a CUDA event)."""

    def __init__(self, t: float) -> None:
        self.t = t


class CountingEventClock:
    """CUDA-event-like marks (recorded on the current stream, read back later) that count the
    calls the profiler makes: the logic under test is how few marks and readings a step needs.
    ``done``: marks up to this time have completed (None: all of them)."""

    kind = "cuda_events"
    domain = "device"

    def __init__(self) -> None:
        self.now, self.one_stream, self.calls = 0.0, True, {"mark": 0, "ready": 0, "seconds": 0}
        self.done: float | None = None

    def mark(self, refresh: bool = False) -> Mark:
        self.calls["mark"] += 1
        self.now += 1.0
        return Mark(self.now)

    @staticmethod
    def capturing() -> bool:
        return False

    def ready(self, mark: Mark) -> bool:
        self.calls["ready"] += 1
        return self.done is None or mark.t <= self.done

    def wait(self, mark: Mark) -> None:
        return None

    def seconds(self, start: Mark, end: Mark) -> float:
        self.calls["seconds"] += 1
        return float(end.t - start.t)


def _run_gpu_steps(prof: ForwardProfiler, sos: list[Any]) -> int:
    """Each step as the session runs it, the sampled ones with a forward and a logits processor."""
    samples = 0
    for so in sos:
        prof.begin_step(so)
        if isinstance(prof.current, OpenStep):
            samples += 1
            prof.module_enter("", True)
            prof.module_exit("")
            prof.module_enter("logits_processor", True)  # starts where the forward ended
            prof.module_exit("logits_processor")
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    return samples


def test_every_step_on_gpu_is_timed_by_an_event_pair_and_samples_add_three_events() -> None:
    """The every-step clock (``step_clock="every"``, the doctor's clock before the sampled one)."""
    clock = CountingEventClock()
    prof = ForwardProfiler(clock, select_modules(ToyForCausalLM()), step_clock="every", own_budget=0.0)  # type: ignore[arg-type]
    steps = _two_requests(300)
    samples = _run_gpu_steps(prof, steps)
    assert samples == 1 + 8 + 37  # the prefill, 8 warm-up decode steps, then every 8th of 291
    plain = len(steps) - samples
    # every step: an event as execute_model is entered and one as sample_tokens returns; a
    # sample also: the forward's start and end and the logits processor's end
    assert clock.calls["mark"] == 2 * len(steps) + 3 * samples
    snap = prof.snapshot()
    rows = StepTable.of(snap).rows()
    assert len(rows) == len(steps) and all(s["step_clock"] == "cuda_events" for s in rows)
    timed = [s for s in rows if s["sampled"]]
    assert all((s["forward_s"], s["logits_s"], s["step_s"]) == (1.0, 1.0, 4.0) for s in timed)
    assert all(s["step_s"] == 1.0 and s["forward_s"] is None for s in rows if not s["sampled"])
    # each mark read once, relative to its step's first: 4 per sample, 1 per plain step; and each
    # step after the first: the device's idle time since the previous one ended
    assert clock.calls["seconds"] == 4 * samples + plain + len(steps) - 1
    assert all(s["idle_before_s"] == 1.0 for s in rows[1:]) and rows[0]["idle_before_s"] is None
    # one stream: when the newest of the pending steps has completed, so have the others
    assert clock.calls["ready"] <= samples // 32 + plain // 128 + 2
    assert snap["step_clock"] == "every"


def test_the_sampled_step_clock_puts_events_on_the_samples_and_the_step_after_each_only() -> None:
    """The default step clock on GPU: a sampled step's event pair (and its forward and logits
    marks), and an event pair on the step after it (its untimed neighbour) and on every
    STEP_CLOCK_STRIDE-th step; every other step carries its host span, named as the host's, with
    no device idle time."""
    clock = CountingEventClock()
    prof = ForwardProfiler(clock, select_modules(ToyForCausalLM()), own_budget=0.0)  # type: ignore[arg-type]
    steps = _two_requests(300)
    samples = _run_gpu_steps(prof, steps)
    assert samples == 1 + 8 + 37  # as with the every-step clock: the same steps are sampled
    # steps 0-9 are samples (the prefill, 8 warm-up decode steps, the 8th after them), then every 8th
    neighbours = 37  # the step after step 9, 17, ..., 297
    # every STEP_CLOCK_STRIDE-th step of a phase is on the clock too: at this cadence decode's 32nd,
    # 64th, ... are samples already (every 8th after the warm-up), so no step more
    assert STEP_CLOCK_STRIDE % 8 == 0
    assert clock.calls["mark"] == 5 * samples + 2 * neighbours
    snap = prof.snapshot()
    assert snap["step_clock"] == "sampled"
    rows = StepTable.of(snap).rows()
    assert [r["index"] for r in rows] == list(range(300))
    device = [r for r in rows if r["step_clock"] == "cuda_events"]
    host = [r for r in rows if r["step_clock"] == "host"]
    assert len(device) == samples + neighbours and len(host) == 300 - samples - neighbours
    after_sample = {r["index"] + 1 for r in rows if r["sampled"]}
    assert all(r["index"] in after_sample and not r["sampled"] for r in device if not r["sampled"])
    assert all(r["step_s"] == 1.0 for r in device if not r["sampled"])
    # a sample's neighbour has the device's idle time since the sample ended; a strided step none
    # (the step before it carried no event)
    assert all(r["idle_before_s"] == (1.0 if r["index"] in after_sample else None) for r in device if not r["sampled"])
    assert all(r["step_s"] >= 0 and r["idle_before_s"] is None and not r["sampled"] for r in host)
    # the counts are every step's, whichever clock timed it
    assert [(r["decode_tokens"], r["kv_blocks_used"]) for r in rows[1:]] == [(2, 2)] * 299


def test_a_host_clock_step_with_an_encoder_call_waits_for_its_events() -> None:
    """On the sampled step clock an unsampled step off the device clock is a record once counted,
    but an encoder call's events (any step that runs the encoder) are read only once completed."""
    clock = CountingEventClock()
    prof = ForwardProfiler(clock, [], sample_every=1 << 20, own_budget=0.0)  # type: ignore[arg-type]
    sos = _two_requests(14)
    for i, so in enumerate(sos):
        step = prof.begin_step(so)
        if i == 12:  # a host-clock step (the samples are 0-9, the device-clock neighbour 10)
            assert isinstance(step, list) and step[5] is None
            clock.done = clock.now  # what ran so far has completed, the encoder's events not yet
            prof.encoder_exit(prof.encoder_enter())
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    prof.resolve(block=False)
    assert 12 not in {row[0] for row in prof.steps} and 13 in {row[0] for row in prof.steps}
    clock.done = None
    rows = StepTable.of(prof.snapshot()).rows()
    encoded = rows[12]
    assert encoded["step_clock"] == "host" and encoded["encoder_s"] == 1.0 and encoded["idle_before_s"] is None
    assert [r["step_clock"] for r in rows[9:14]] == ["cuda_events", "cuda_events", "host", "host", "host"]


class RecyclingEventClock(CountingEventClock):
    """Marks given back are re-recorded by later marks, as CudaEventClock reuses its events: a
    mark released while a step still needs it would read another time."""

    def __init__(self) -> None:
        super().__init__()
        self.free: list[Mark] = []
        self.released = 0

    def mark(self, refresh: bool = False) -> Mark:
        self.calls["mark"] += 1
        self.now += 1.0
        if self.free:
            m = self.free.pop()
            m.t = self.now
            return m
        return Mark(self.now)

    def release(self, *marks: Mark) -> None:
        for m in marks:
            assert all(m is not f for f in self.free), "a mark given back twice"
            self.free.append(m)
            self.released += 1


@pytest.mark.parametrize("step_clock", ["every", "sampled"])
@pytest.mark.parametrize("collect_every", [1, 3, 1000])
def test_the_devices_idle_time_between_steps_is_measured_and_no_event_is_reused_while_needed(
    collect_every: int, step_clock: str
) -> None:
    """Each step's idle_before_s is the time from the previous step's end mark to its start mark.
    The previous end is shared by two steps: with events reused from a free list, giving it back
    before both read it would make the next step read a re-recorded event. Collected after every
    step (the next step begins after its predecessor was resolved), every 3rd, or at the end.
    On the sampled step clock only a step on the device clock after one on it has an idle time
    (a window's first step is on it: collected after every step, every step is)."""
    clock = RecyclingEventClock()
    prof = ForwardProfiler(clock, [], sample_every=3, step_clock=step_clock, own_budget=0.0)  # type: ignore[arg-type]
    gaps = {}
    rows = []
    for i, so in enumerate(_two_requests(60)):
        gaps[i] = float(i % 5)  # the host's time between steps, the device idle
        clock.now += gaps[i]
        prof.begin_step(so)
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
        if (i + 1) % collect_every == 0:
            rows += StepTable.of(prof.snapshot(reset=True)).rows()
    rows += StepTable.of(prof.snapshot(reset=True)).rows()
    assert [r["index"] for r in rows] == list(range(60))
    # the first step has no predecessor; each later one is idle for the gap plus the mark of its start
    assert rows[0]["idle_before_s"] is None
    device = [r["step_clock"] == "cuda_events" for r in rows]
    assert [r["idle_before_s"] for r in rows[1:]] == [
        gaps[i] + 1.0 if device[i - 1] and device[i] else None for i in range(1, 60)
    ]
    assert any(r["sampled"] for r in rows) and any(not r["sampled"] for r in rows)
    if step_clock == "every" or collect_every == 1:  # a window's first step is on the clock: here each one
        assert all(device)
    else:
        assert 0 < sum(device) < 60
    pairs = sum(1 for i in range(1, 60) if device[i - 1] and device[i])
    assert clock.released >= 2 * pairs  # events do go back for reuse (all but the newest end)


def test_an_aborted_step_leaves_no_idle_time_to_the_next() -> None:
    clock = RecyclingEventClock()
    prof = ForwardProfiler(clock, [], sample_every=1, own_budget=0.0)  # type: ignore[arg-type]
    sos = _two_requests(4)
    prof.begin_step(sos[0])
    prof.after_sample(0.0005)
    prof.begin_step(sos[1])
    prof.abort_step()  # execute_model raised
    for so in sos[2:]:
        prof.begin_step(so)
        prof.after_sample(0.0005)
    rows = StepTable.of(prof.snapshot()).rows()
    assert [r["index"] for r in rows] == [0, 2, 3]
    assert [r["idle_before_s"] is None for r in rows] == [True, True, False]


def test_gpu_steps_become_records_only_once_their_events_completed() -> None:
    clock = CountingEventClock()
    prof = ForwardProfiler(clock, [], sample_every=1 << 30, step_clock="every", own_budget=0.0)  # type: ignore[arg-type]
    sos = _two_requests(200)
    clock.done = 0.0  # nothing has run on the device yet
    for so in sos:
        prof.begin_step(so)
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    assert prof.steps == []  # no step's end event has completed: no record yet, none lost
    clock.one_stream = False
    clock.done = clock.now / 2  # the first half has completed
    prof.resolve(block=False)
    done_steps = len(prof.steps)
    assert 0 < done_steps < len(sos)
    prof.resolve(block=True)  # collection waits for the rest
    assert len(prof.steps) == len(sos) and not prof.pending_plain and not prof.pending
    assert all(row[4] for row in prof.steps)  # every one on the device clock


def test_layer_tables_compare_layer_times_with_the_sampled_steps_only() -> None:
    steps = [{"forward_s": 1.0, "layers_timed": True}, {"forward_s": 5.0, "layers_timed": False}]
    profile = {
        "layers": [{"name": "model.layers.0", "kind": "layer", "layer": 0, "decode_s": 0.9, "decode_calls": 1}],
        "sample_every": 4,
    }
    tables = layer_tables(ProfileReply.of(profile), StepTable.of({"steps": steps}))
    assert tables.forward_total_s == 1.0 and tables.timed_fraction == pytest.approx(0.9)
    assert tables.timed_steps == 1 and tables.sample_every == 4
    assert "total_s" not in profile["layers"][0]  # new records: the worker's reply is left as it came
    assert tables.modules[0].total_s == 0.9 and tables.modules[0].calls == 1


def _new(rid: str, prompt: int, blocks: list[int], computed: int = 0) -> Any:
    return SimpleNamespace(
        req_id=rid, prompt_token_ids=list(range(prompt)), block_ids=(blocks,), num_computed_tokens=computed
    )


def _so(
    new: list[Any],
    cached: list[tuple[str, int, list[int] | None]],
    sched: dict[str, int],
    finished: set[str] = frozenset(),
) -> Any:  # type: ignore[assignment]
    return SimpleNamespace(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[c[0] for c in cached],
            num_computed_tokens=[c[1] for c in cached],
            new_block_ids=[(c[2],) if c[2] is not None else None for c in cached],
            resumed_req_ids=set(),
        ),
        num_scheduled_tokens=sched,
        total_num_scheduled_tokens=sum(sched.values()),
        scheduled_spec_decode_tokens={},
        finished_req_ids=set(finished),
    )


def test_step_tracker_splits_prefill_and_decode_and_counts_kv_blocks() -> None:
    t = StepTracker()
    raw = t.observe(_so([_new("a", 5, [1]), _new("b", 3, [2])], [], {"a": 5, "b": 3}))
    first = counts_dict(raw)
    assert (first["prefill_tokens"], first["decode_tokens"], first["kv_blocks_used"], first["num_reqs"]) == (8, 0, 2, 2)
    assert phase_of(raw) == "prefill" and set(first) == {*COUNT_FIELDS, "num_reqs"}
    raw = t.observe(_so([_new("c", 4, [3, 4])], [("a", 5, [5]), ("b", 3, None)], {"a": 1, "b": 1, "c": 4}))
    second = counts_dict(raw)
    assert (second["prefill_tokens"], second["decode_tokens"], second["num_reqs"]) == (4, 2, 3)
    assert second["kv_blocks_used"] == 5 and phase_of(raw) == "mixed"
    # a pure decode step takes the fast path (nothing new, finished or added; all past their prompt)
    assert t.observe(_so([], [("a", 6, None), ("b", 4, None), ("c", 4, None)], {"a": 1, "b": 1, "c": 1})) == (
        0,
        3,
        0,
        3,
        3,
        5,
        0,
        0,
    )
    third = counts_dict(t.observe(_so([], [("c", 4, None)], {"c": 1}, finished={"a", "b"})))
    assert (third["decode_tokens"], third["kv_blocks_used"]) == (1, 2)


def test_step_tracker_phases_of_resumed_and_mid_run_requests() -> None:
    t = StepTracker()
    t.observe(_so([_new("a", 4, [1])], [], {"a": 4}))
    assert phase_of(t.observe(_so([], [("a", 4, None)], {"a": 1}))) == "decode"
    assert "a" not in t.in_prompt
    # preempted and brought back: its prompt and outputs are recomputed, a prefill again
    so = _so([], [("a", 0, [7])], {"a": 5})
    so.scheduled_cached_reqs.resumed_req_ids = {"a"}
    raw = t.observe(so)
    assert phase_of(raw) == "prefill" and raw[6:] == (0, 1) and (t.held, t.extra) == ({7}, {})
    # requests already running when the doctor attached: one token is decode, more is a prompt chunk
    raw = t.observe(_so([], [("a", 5, None), ("x", 40, [8]), ("y", 16, [9])], {"a": 1, "x": 1, "y": 16}))
    assert counts_dict(raw)["decode_reqs"] == 2 and counts_dict(raw)["prefill_tokens"] == 16
    assert raw[5] == 3 and not t.in_prompt  # (y's prompt is not known: the step's total finds it, not a follow)


# ---- the extension envelope on a fake worker --------------------------------------------------


class FakeWorker(DoctorWorkerExtension):
    rank = 0


def test_extension_returns_crash_envelope_instead_of_raising() -> None:
    worker = FakeWorker()
    assert worker.doctor_kv()["ok"] is True  # capability detection: missing attributes are "unavailable"
    reply = worker.doctor_install()  # no model loaded: the method raises inside
    assert reply["ok"] is False and reply["method"] == "doctor_install"
    assert reply["error"]["type"] == "RuntimeError" and "no model" in reply["error"]["message"]
    json.dumps(reply)  # JSON-able
    assert worker.doctor_ping()["ok"] is True
    # the fault hook is no worker method: nothing that calls methods by name (vLLM's HTTP
    # /collective_rpc in dev mode, the private channel) reaches it; a test calls it on the worker
    assert not hasattr(worker, "doctor_inject_fault")
    from tests.fixtures.faults import inject_fault

    assert inject_fault(worker, "rpc:doctor_ping") == {"faults": ["rpc:doctor_ping"]}
    assert worker.doctor_ping()["error"]["type"] == "InjectedFault"


class FakeLLM:
    def __init__(self, error: Exception | None, ext: str = "") -> None:
        self.error = error
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(worker_extension_cls=ext))
        )

    def collective_rpc(self, method: str, timeout: Any = None, args: tuple[Any, ...] = ()) -> list[Any]:
        if self.error is not None:
            raise self.error
        return [{"ok": True, "method": method, "rank": 0, "data": {}}]


def test_missing_extension_explains_the_fix() -> None:
    handle = EngineHandle(FakeLLM(AttributeError("'CPUWorker' object has no attribute 'doctor_ping'")))
    with pytest.raises(ExtensionMissing) as info:
        handle.ensure_extension()
    assert EXTENSION_QUALNAME in str(info.value) and "engine_kwargs" in str(info.value)
    with pytest.raises(ExtensionMissing, match=r"json\.JSONDecoder"):  # another extension, not ours
        EngineHandle(FakeLLM(None, ext="json.JSONDecoder")).ensure_extension()
    assert engine_kwargs(enforce_eager=True) == {"worker_extension_cls": EXTENSION_QUALNAME, "enforce_eager": True}


# ---- checks over synthetic snapshots ----------------------------------------------------------


def worker(rank: int = 0, **parts: Any) -> WorkerFacts:
    return WorkerFacts(rank=rank, parts=dict(parts))


def placement(device: str = "cpu", misplaced: list[dict[str, Any]] | None = None, **dev: Any) -> dict[str, Any]:
    dtype_mismatch = [
        {"name": "gain", "dtype": "torch.float32", "shape": [1], "module_class": "M", "vllm_builtin": False}
    ]
    return {
        "model": "m.M",
        "model_dtype": "torch.bfloat16",
        "device": {
            "device": device,
            "type": device.split(":")[0],
            "index": int(device.split(":")[1]) if ":" in device else None,
            **dev,
        },
        "counts": {"parameters": 3, "buffers": 1, "misplaced": len(misplaced or []), "dtype_mismatch": 1},
        "misplaced": misplaced or [],
        "dtype_mismatch": dtype_mismatch,
    }


def test_engine_checks_skip_without_an_engine_and_are_not_run_by_the_static_pass() -> None:
    engine_codes = [c for c in CATALOGUE if CATALOGUE[c].meta.stage is Stage.ENGINE]
    assert set(engine_codes) >= {
        "VD208",
        "VD400",
        "VD401",
        "VD402",
        "VD403",
        "VD404",
        "VD405",
        "VD501",
        "VD503",
        "VD504",
    }
    for code in engine_codes:
        findings = run(code, object())
        assert [f.outcome for f in findings] == [Outcome.SKIP] and "--engine" in findings[0].message
    assert not set(selected_codes(CheckOptions())) & set(engine_codes)


def test_vd401_names_each_misplaced_tensor_and_passes_when_none() -> None:
    bad = [
        {
            "name": "model.layers.0.mlp.inv_freq",
            "kind": "buffer",
            "device": "cpu",
            "dtype": "torch.float32",
            "shape": [4],
            "bytes": 16,
            "module_class": "MyMLP",
            "vllm_builtin": False,
        }
    ]
    findings = run("VD401", EngineFacts(workers=[worker(placement=placement("cuda:0", bad))]))
    assert [(f.outcome, f.subject) for f in findings] == [
        (Outcome.FAIL, "rank 0 / cuda:0 / model.layers.0.mlp.inv_freq")
    ]
    assert findings[0].evidence["expected"] == "cuda:0" and findings[0].evidence["actual"] == "cpu"
    ok = run("VD401", EngineFacts(workers=[worker(placement=placement("cpu"))]))
    assert [f.outcome for f in ok] == [Outcome.PASS]


def test_vd402_flags_rank_device_mismatch_and_shared_gpu() -> None:
    w0 = worker(
        0, placement=placement("cuda:0", local_rank=0, current_device=0, device_count=2, uuid="GPU-a", hostname="h")
    )
    w1 = worker(
        1, placement=placement("cuda:0", local_rank=1, current_device=0, device_count=2, uuid="GPU-a", hostname="h")
    )
    findings = run("VD402", EngineFacts(workers=[w0, w1]))
    outcomes = [(f.outcome, f.subject) for f in findings]
    assert (Outcome.PASS, "rank 0 / cuda:0") in outcomes
    assert (Outcome.FAIL, "rank 1 / cuda:0") in outcomes
    assert any(f.outcome is Outcome.FAIL and f.evidence.get("ranks") == [0, 1] for f in findings)
    cpu = run("VD402", EngineFacts(workers=[worker(placement=placement("cpu"))]))
    assert [f.outcome for f in cpu] == [Outcome.NOT_APPLICABLE]


def _probe(events: list[dict[str, Any]], device: str = "cpu") -> dict[str, Any]:
    return {
        "profiling": True,
        "crashes": [],
        "probe": {"complete": True, "worker_device": device, "steps": [{"phase": "prefill"}], "events": events},
    }


def test_vd403_vd404_report_probe_events_with_module_and_severity() -> None:
    ev = [
        {
            "kind": "host_sync",
            "op": "Tensor.item",
            "module": "model.layers.1.mlp",
            "module_class": "MyMLP",
            "vllm_builtin": False,
            "count": 2,
            "where": ["m.py:3 in forward"],
        },
        {
            "kind": "wrong_device_create",
            "op": "aten.zeros.default",
            "module": "model.layers.1.mlp",
            "module_class": "MyMLP",
            "vllm_builtin": False,
            "count": 1,
            "device": "cpu",
            "where": [],
        },
        {
            "kind": "host_sync",
            "op": "Tensor.cpu",
            "module": "model.layers.0.self_attn.attn",
            "module_class": "Attention",
            "vllm_builtin": True,
            "count": 1,
            "where": [],
        },
    ]
    facts = EngineFacts(workers=[worker(profile=_probe(ev, "cuda:0"))])
    vd404 = run("VD404", facts)
    assert [(f.subject, f.severity) for f in vd404] == [
        ("model.layers.1.mlp", Severity.WARN),
        ("model.layers.0.self_attn.attn", Severity.INFO),
    ]
    assert "m.py:3" in vd404[0].hint
    vd403 = run("VD403", facts)
    assert [(f.outcome, f.subject) for f in vd403] == [(Outcome.WARN, "model.layers.1.mlp")]
    assert "creates a tensor on cpu" in vd403[0].message
    clean = EngineFacts(workers=[worker(profile=_probe([]))])
    assert [f.outcome for f in run("VD403", clean)] == [Outcome.PASS]
    waiting = EngineFacts(
        workers=[worker(profile={"probe": {"complete": False, "events": [], "steps": [], "waiting_for": ["prefill"]}})]
    )
    assert [f.outcome for f in run("VD404", waiting)] == [Outcome.SKIP]
    half = EngineFacts(
        workers=[worker(profile={"probe": {"complete": False, "events": [], "steps": [{"phase": "prefill"}]}})]
    )
    assert [f.outcome for f in run("VD404", half)] == [Outcome.PASS]


def test_vd405_is_info() -> None:
    findings = run("VD405", EngineFacts(workers=[worker(placement=placement())]))
    assert [(f.outcome, f.severity, f.subject) for f in findings] == [(Outcome.WARN, Severity.INFO, "gain")]


def test_vd405_leaves_vllms_own_float32_parameters_to_vllm() -> None:
    """vLLM's Mamba 2 mixer keeps A in float32 in a bfloat16 model (Nemotron-H): vLLM's choice,
    named in the pass, no warning; the port's own float32 parameter beside it still warns."""
    p = placement()
    own_a = {"name": "model.layers.0.mixer.A", "dtype": "torch.float32", "shape": [8], "module_class": "MambaMixer2",
             "vllm_builtin": True}  # fmt: skip
    only_vllm = {**p, "dtype_mismatch": [own_a], "counts": {**p["counts"], "dtype_mismatch": 1}}
    (ok,) = run("VD405", EngineFacts(workers=[worker(placement=only_vllm)]))
    assert ok.outcome is Outcome.PASS
    assert ok.message.endswith("but 1 that vLLM's own layers keep in torch.float32 on purpose (A)")
    both = {**p, "dtype_mismatch": [own_a, *p["dtype_mismatch"]], "counts": {**p["counts"], "dtype_mismatch": 2}}
    assert [f.subject for f in run("VD405", EngineFacts(workers=[worker(placement=both)]))] == ["gain"]


FULL = {"spec": {"type": "FullAttentionSpec", "block_size": 16, "num_kv_heads": 2, "head_size": 32}}


def test_kv_capacity_math() -> None:
    full = KvGroup.of(FULL)
    assert blocks_needed([full, full], 33) == 6
    sliding = KvGroup.of({"spec": {"type": "SlidingWindowSpec", "block_size": 16, "sliding_window": 32}})
    assert blocks_needed([sliding], 10_000) == 3
    assert largest_length([full], 10, cap=10_000) == 160
    assert largest_length([full, full], 10, cap=10_000) == 80


def kv(**over: Any) -> dict[str, Any]:
    layers = [
        {
            "prefix": f"model.layers.{i}.self_attn.attn",
            "num_kv_heads": 2,
            "head_size": 32,
            "module_paths": [f"model.layers.{i}.self_attn.attn"],
        }
        for i in range(2)
    ]
    base = {
        "num_blocks": 11,
        "max_model_len": 64,
        "storage_bytes": 1000,
        "planned_bytes": 1000,
        "num_storages": 1,
        "groups": [{"layer_names": [layer["prefix"] for layer in layers], **FULL}],
        "attention_layers": layers,
        "tensor_parallel_size": 1,
        "hf_config": {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2},
    }
    return {**base, **over}


def test_vd501_from_running_engine_and_from_vllms_startup_error() -> None:
    ok = run("VD501", EngineFacts(workers=[worker(kv=kv())]))
    assert ok[0].outcome is Outcome.PASS and ok[0].evidence["largest_length"] == 160  # (11 - null block) x 16
    assert ok[0].evidence["full_length_requests_at_once"] == 2
    small = run("VD501", EngineFacts(workers=[worker(kv=kv(num_blocks=3))]))
    assert small[0].outcome is Outcome.FAIL and small[0].evidence["largest_length"] == 32
    err = (
        "ValueError: To serve at least one request with the model's max seq len (2048), (0.03 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, "
        "the estimated maximum model length is 672. Try increasing ..."
    )
    failed = run("VD501", EngineFacts(startup_error=err))
    assert failed[0].outcome is Outcome.FAIL and failed[0].evidence["largest_length"] == 672
    assert "max_model_len=672" in failed[0].hint


def test_vd504_catches_ignored_gqa_and_unplanned_bytes() -> None:
    assert [f.outcome for f in run("VD504", EngineFacts(workers=[worker(kv=kv())]))] == [Outcome.PASS]
    bad = kv(storage_bytes=2000)
    for layer in bad["attention_layers"]:
        layer["num_kv_heads"] = 4
    bad["groups"][0]["spec"] = {**FULL["spec"], "num_kv_heads": 4}
    msgs = [f.message for f in run("VD504", EngineFacts(workers=[worker(kv=bad)]))]
    assert any("2x larger than needed" in m for m in msgs)
    assert any("planned 1000" in m for m in msgs)


def test_vd208_prefix_vs_module_path_and_duplicate_error() -> None:
    bad = kv()
    bad["attention_layers"][1]["module_paths"] = ["model.layers.1.attention.core"]
    findings = run("VD208", EngineFacts(workers=[worker(kv=bad)]))
    assert [(f.outcome, f.subject) for f in findings] == [(Outcome.WARN, "model.layers.1.self_attn.attn")]
    dup = run("VD208", EngineFacts(startup_error="ValueError: Duplicate layer name: model.layers.0.attn"))
    assert dup[0].outcome is Outcome.FAIL and dup[0].subject == "model.layers.0.attn"


def test_probe_crash_becomes_crash_finding_of_dependent_checks() -> None:
    w = WorkerFacts(rank=0, errors={"kv": {"type": "RuntimeError", "message": "boom", "traceback": "tb"}})
    for code in ("VD501", "VD504", "VD208"):
        findings = run(code, EngineFacts(workers=[w]))
        assert [f.outcome for f in findings] == [Outcome.CRASH] and "boom" in findings[0].message
    hook = {
        "crashes": [{"component": "layers", "type": "InjectedFault", "message": "x", "traceback": "", "step": 3}],
        "probe": {},
    }
    assert [f.outcome for f in run("VD400", EngineFacts(workers=[worker(profile=hook)]))] == [Outcome.CRASH]


def test_memory_breakdown_adds_up_on_gpu_and_says_what_cpu_cannot_measure() -> None:
    gpu = {
        "pid": 7,
        "device": "cuda:0",
        "parameter_bytes": 100,
        "buffer_bytes": 0,
        "kv_bytes": 500,
        "vllm_model_memory_usage": 120,
        "vllm_peak_activation_memory": 50,
        "cuda": {"allocated": 700, "reserved": 800, "max_allocated": 750, "device_total": 10_000, "device_free": 8_000},
        "compile": {"cudagraphs": False},
    }
    snap = {"available": True, "devices": [{"processes": [{"pid": 7, "used_memory": 1_000}]}]}
    b = memory_breakdown(MemoryFacts.of(gpu), snap)
    assert b["total"] == 1_000 and b["total_source"].startswith("NVML")
    assert sum(v for v in b["parts"].values() if v) == b["total"]
    assert b["parts"]["peak_activations"] == 50
    without = memory_breakdown(MemoryFacts.of(gpu), {"available": False, "reason": "no driver"})
    assert without["total"] == 800 and any("NVML unavailable" in n for n in without["notes"])
    cpu = memory_breakdown(
        MemoryFacts.of(
            {
                "device": "cpu",
                "parameter_bytes": 10,
                "buffer_bytes": 2,
                "repacked_weight_bytes_estimate": 30,
                "repacked_layers": 2,
                "kv_bytes": 100,
                "host": {"VmRSS": 1_000, "VmHWM": 1_100},
            }
        )
    )
    assert cpu["parts"]["weights"] == 42 and cpu["parts"]["peak_activations"] is None
    assert cpu["parts"]["other"] == 1_000 - 42 - 100 and not cpu["measurable"]


def test_nvml_gateway_never_raises() -> None:
    snap = nvml.snapshot()
    assert isinstance(snap, dict) and "available" in snap
    if not snap["available"]:
        assert snap["reason"]
    assert process_memory({"available": False}, 1) is None


def test_summaries_and_anatomy_from_synthetic_facts() -> None:
    steps = [
        {
            "index": 0,
            "t": 0.0,
            "phase": "prefill",
            "total_tokens": 8,
            "num_reqs": 2,
            "kv_blocks_used": 2,
            "step_s": 0.2,
            "forward_s": 0.1,
        },
        {
            "index": 1,
            "t": 0.2,
            "phase": "decode",
            "total_tokens": 2,
            "num_reqs": 2,
            "kv_blocks_used": 2,
            "step_s": 0.1,
            "forward_s": 0.05,
        },
    ]
    profile = {
        "profiling": True,
        "clock": "wall_clock",
        "steps": steps,
        "num_blocks": 11,
        "crashes": [],
        "probe": {},
        "layers": [
            {"name": "model.layers.0", "kind": "layer", "layer": 0, "prefill_s": 0.05, "decode_s": 0.02},
            {"name": "model.layers.0.self_attn", "kind": "attention", "layer": 0, "prefill_s": 0.03, "decode_s": 0.01},
        ],
    }
    anat = {
        "rank": 0,
        "pid": 5,
        "device": "cpu",
        "model_class": "my_pkg.model.MyLM",
        "worker_class": "W",
        "model_runner_class": "R",
    }
    facts = EngineFacts(
        front_end={"pid": 5, "engine_core_in_process": True, "engine_core_pids": [5]},
        workers=[worker(profile=profile, anatomy=anat, kv=kv())],
    )
    s = summarize(facts)
    assert s.phases["prefill"].tokens == 8 and s.phases["decode"].tokens_per_s == pytest.approx(20.0)
    assert s.kv_usage[0].usage == pytest.approx(0.2)
    assert s.layers.by_kind["attention"] == pytest.approx(0.04)
    assert s.layers.by_kind["other"] == pytest.approx(0.15 - 0.04)
    assert layer_tables(ProfileReply.of(profile), StepTable.of({"steps": steps})).by_layer[0].kinds[
        "attention"
    ] == pytest.approx(0.04)
    a = anatomy(facts)
    assert a.model.origin == "plugin" and a.processes[1].in_process_with == "engine core"
    # report.json keeps its keys: the records written are the dicts of before
    data = wire.write(s)
    assert data["phases"]["prefill"]["tokens"] == 8 and data["layers"]["by_layer"][0]["kinds"][
        "attention"
    ] == pytest.approx(0.04)
    assert wire.write(a)["model"] == {"class": "my_pkg.model.MyLM", "origin": "plugin", "file": None}
    assert model_origin("vllm.model_executor.models.llama.LlamaForCausalLM") == "built-in"
    assert (
        model_origin("vllm.model_executor.models.transformers.base.TransformersForCausalLM") == "transformers-fallback"
    )


def test_plugin_is_a_no_op_unless_opted_in(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_doctor.engine import plugin

    monkeypatch.setenv("VLLM_DOCTOR_DIR", str(tmp_path))
    monkeypatch.delenv("VLLM_DOCTOR", raising=False)
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("VLLM_DOCTOR", "1")
    plugin.register()
    plugin.register()  # vLLM may call it again in the same process
    records = list(tmp_path.iterdir())
    assert len(records) == 1 and json.loads(records[0].read_text())["pid"] > 0


def test_html_and_trace_render_from_a_report_dict_offline() -> None:
    from vllm_doctor.live.attach import build_engine_report
    from vllm_doctor.report.html import render_html
    from vllm_doctor.report.trace import chrome_trace

    steps = [
        {
            "index": i,
            "t": 0.01 * i,
            "phase": "prefill" if i == 0 else "decode",
            "total_tokens": 4,
            "num_reqs": 2,
            "prefill_tokens": 4 if i == 0 else 0,
            "decode_tokens": 0 if i == 0 else 2,
            "kv_blocks_used": 2,
            "step_s": 0.01,
            "forward_s": 0.008,
        }
        for i in range(4)
    ]
    profile = {
        "profiling": True,
        "clock": "wall_clock",
        "layers_on": True,
        "steps": steps,
        "num_blocks": 11,
        "crashes": [],
        "probe": {"complete": True, "events": [], "steps": []},
        "trace": [
            {
                "index": 0,
                "t": 0.0,
                "step_s": 0.01,
                "phase": "prefill",
                "forward": [{"offset_s": 0.0, "dur_s": 0.008}],
                "layers": [{"name": "model.layers.0", "offset_s": 0.001, "dur_s": 0.004}],
            }
        ],
        "layers": [
            {"name": "model.layers.0", "kind": "layer", "layer": 0, "prefill_s": 0.004, "decode_s": 0.01},
            {"name": "model.layers.0.mlp", "kind": "mlp", "layer": 0, "prefill_s": 0.002, "decode_s": 0.005},
        ],
    }
    mem = {"device": "cpu", "parameter_bytes": 10, "buffer_bytes": 0, "kv_bytes": 100, "host": {"VmRSS": 1000}}
    anat = {
        "rank": 0,
        "pid": 5,
        "device": "cpu",
        "model_class": "p.M",
        "worker_class": "w.W",
        "model_runner_class": "r.R",
    }
    facts = EngineFacts(
        front_end={"pid": 5, "engine_core_in_process": True, "engine_core_pids": [5]},
        workers=[worker(profile=profile, anatomy=anat, kv=kv(), memory=mem, placement=placement())],
    )
    report = build_engine_report(facts, "/models/x")
    html = render_html(report)
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 5
    assert "<script" not in html and "https://" not in html and "src=" not in html
    assert "VD405" in html and "layer 0" in html and "not measurable" in html
    trace = chrome_trace(report.profiles["engine"], report.facts["engine"])
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert "step 0 prefill" in names and "model.layers.0" in names
    json.dumps(trace)


# ---- VD500: the engine did not start -------------------------------------------------------


def test_vd500_passes_with_the_mode_when_the_engine_ran() -> None:
    facts = EngineFacts(
        workers=[worker(placement=placement("cpu", []))], mode=ExecutionMode(summary="eager", enforce_eager=True)
    )
    (f,) = run("VD500", facts)
    assert f.outcome is Outcome.PASS and "eager" in f.message


def test_vd500_names_vllms_error_the_phase_and_the_cause_from_the_eager_rerun() -> None:
    from vllm_doctor.checks.startup import start_failure_causes

    error = "RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned"
    events = [
        {
            "kind": "host_sync",
            "op": "Tensor.item",
            "module": "model.layers.0",
            "module_class": "Foo",
            "vllm_builtin": False,
            "where": ["/m/model.py:10 in forward"],
        },
        {
            "kind": "cross_device_copy",
            "op": "aten._to_copy.default",
            "module": "<model>",
            "module_class": "MyLlama",
            "vllm_builtin": False,
            "where": ["/m/model.py:42 in forward"],
        },
        {
            "kind": "cross_device_copy",
            "op": "aten.copy_.default",
            "module": "model.layers.0.attn",
            "module_class": "Attention",
            "vllm_builtin": True,
            "where": [],
        },
    ]
    misplaced = [
        {
            "name": "gain",
            "kind": "buffer",
            "device": "cpu",
            "dtype": "torch.float64",
            "shape": [8],
            "bytes": 64,
            "module_class": "MyLlama",
            "vllm_builtin": False,
        }
    ]
    eager = EngineFacts(
        workers=[worker(placement=placement("cuda:0", misplaced), profile={"probe": {"events": events, "steps": [1]}})]
    )
    failed = EngineFacts(
        startup_error=error,
        startup_phase="graph capture",
        mode=ExecutionMode(requested="vllm-default"),
        diagnosis=eager,
    )
    causes = start_failure_causes(error, eager)
    # the copy the error names first, the builtin vLLM module never
    assert [c["kind"] for c in causes] == [
        "host tensor copied in forward",
        "tensor on another device",
        "host sync in forward",
    ]
    (f,) = run("VD500", failed)
    assert f.outcome is Outcome.FAIL and f.severity is Severity.ERROR
    assert f.subject == "engine start-up / graph capture"
    assert "vLLM failed in graph capture" in f.message and "Cannot copy between CPU and CUDA" in f.message
    assert "aten._to_copy.default in <model> (MyLlama) at /m/model.py:42 in forward" in f.message
    assert "buffer on the model's device" in f.hint
    # a capture invalidated by a host read puts the .item() first
    sync_error = "RuntimeError: CUDA error: operation failed due to a previous error during capture (cudaErrorStreamCaptureInvalidated)"
    assert start_failure_causes(sync_error, eager)[0]["kind"] == "host sync in forward"


def test_vd500_says_when_the_model_fails_in_eager_mode_too_and_points_at_vd501() -> None:
    err = (
        "ValueError: To serve at least one request with the model's max seq len (2048), (0.03 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.01 GiB)."
    )
    facts = EngineFacts(
        startup_error=err,
        startup_phase="KV cache allocation",
        mode=ExecutionMode(requested="vllm-default"),
        diagnosis=EngineFacts(startup_error=err),
    )
    (f,) = run("VD500", facts)
    assert f.outcome is Outcome.FAIL and "(see VD501)" in f.message and "it fails in eager mode too" in f.message
    (ok,) = run("VD500", EngineFacts(runtime_error="RuntimeError: boom", workers=[worker()]))
    assert ok.outcome is Outcome.FAIL and ok.subject == "engine start-up / first step"


def test_vd500_names_the_import_error_and_its_line_when_vllm_says_only_failed_to_be_inspected() -> None:
    """Issue 47 item 12: vLLM's registry hides the class's ImportError in its log; the engine child
    imports the class again (compat/runtime.uninspectable_classes) and VD500 says what VD106 says."""
    from vllm_doctor.facts.engine import facts_from_dict, facts_to_dict

    module = "/site/my_pkg/model.py"
    traceback_text = (
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/vllm_doctor/compat/runtime.py", line 374, in load_class\n'
        "    module = importlib.import_module(module_name)\n"
        '  File "/usr/lib/python3.11/importlib/__init__.py", line 126, in import_module\n'
        "    return _bootstrap._gcd_import(name[level:], package, level)\n"
        f'  File "{module}", line 21, in <module>\n'
        "    from vllm.model_executor.layers.layer_norm import RMSNorm\n"
        "ModuleNotFoundError: No module named 'vllm.model_executor.layers.layer_norm'\n"
    )
    record = {
        "architecture": "MyForCausalLM",
        "target": "my_pkg.model:MyForCausalLM",
        "import_error": traceback_text,
        "import_error_summary": "ModuleNotFoundError: No module named 'vllm.model_executor.layers.layer_norm'",
        "module_file": module,
    }
    error = (
        "ValidationError: 1 validation error for ModelConfig\n  Value error, Model architectures ['MyForCausalLM'] "
        "failed to be inspected. Please check the logs for more details. [type=value_error, input_value=...]"
    )
    facts = facts_from_dict(
        facts_to_dict(
            EngineFacts(startup_error=error, mode=ExecutionMode(requested="vllm-default"), class_import_errors=[record])
        )
    )
    (f,) = run("VD500", facts)
    assert (f.outcome, f.subject) == (Outcome.FAIL, "engine start-up / engine start-up")
    assert f.message == (
        "vLLM failed in engine start-up (vLLM's default execution mode): ValidationError: 1 validation error for "
        "ModelConfig: Model architectures ['MyForCausalLM'] failed to be inspected. Please check the logs for more "
        "details; cause: my_pkg.model:MyForCausalLM cannot be imported: ModuleNotFoundError: No module named "
        "'vllm.model_executor.layers.layer_norm' (at /site/my_pkg/model.py:21)"
    )
    assert f.hint == "fix the import; reproduce with: python -c 'import my_pkg.model'"
    assert f.evidence["traceback"] == traceback_text and f.evidence["classes"] == ["my_pkg.model:MyForCausalLM"]
    assert facts.failure_text().endswith(
        "\n  cause: my_pkg.model:MyForCausalLM cannot be imported: ModuleNotFoundError: No module named "
        "'vllm.model_executor.layers.layer_norm' (at /site/my_pkg/model.py:21)"
    )


def test_startup_phase_reads_vllms_own_frames() -> None:
    from vllm_doctor.compat.startup import startup_phase

    def raise_from(names: list[str]) -> BaseException:
        """An exception whose traceback runs through functions named like vLLM's, in vllm/ files."""
        src = ""
        for i, name in enumerate(names):
            nxt = f"{names[i + 1]}()" if i + 1 < len(names) else "raise RuntimeError('capture failed')"
            src += f"def {name}():\n    {nxt}\n"
        code = compile(src, "/site-packages/vllm/v1/worker/gpu_model_runner.py", "exec")
        ns: dict[str, Any] = {}
        exec(code, ns)
        try:
            ns[names[0]]()
        except RuntimeError as exc:
            return exc
        raise AssertionError("no exception")

    got = startup_phase(
        raise_from(["_initialize_kv_caches", "compile_or_warm_up_model", "capture_model", "_dummy_run"])
    )
    assert got["phase"] == "graph capture" and got["function"].startswith("capture_model (vllm/v1/worker/")
    assert (
        startup_phase(raise_from(["_initialize_kv_caches", "determine_available_memory", "profile_run", "_dummy_run"]))[
            "phase"
        ]
        == "profile run"
    )
    assert startup_phase(raise_from(["load_model", "load_weights"]))["phase"] == "load"
    assert startup_phase(RuntimeError("x"))["phase"] == "engine start-up"


def test_vd405_warns_on_a_float64_buffer_on_any_device() -> None:
    p = placement("cpu", [])
    p["float64"] = [{"name": "gain", "kind": "buffer", "device": "cpu", "shape": [8], "module_class": "MyLlama"}]
    findings = run("VD405", EngineFacts(workers=[worker(placement=p)]))
    warn = [f for f in findings if f.outcome is Outcome.WARN and f.evidence.get("actual") == "torch.float64"]
    assert [(f.subject, f.evidence["kind"]) for f in warn] == [("gain", "buffer")]
    assert "float64" in warn[0].message and warn[0].severity is Severity.WARN


def test_a_graph_capture_inside_another_phase_is_the_phase() -> None:
    """vLLM 0.26's V2 runner captures graphs from its KV cache set-up (measured on the H200)."""
    from vllm_doctor.compat.startup import startup_phase

    src = "def initialize_from_config():\n    capture_model()\ndef capture_model():\n    raise RuntimeError('x')\n"
    ns: dict[str, Any] = {}
    exec(compile(src, "/site-packages/vllm/v1/worker/gpu/model_runner.py", "exec"), ns)
    try:
        ns["initialize_from_config"]()
    except RuntimeError as exc:
        assert startup_phase(exc)["phase"] == "graph capture"
    src = "def initialize_from_config():\n    raise RuntimeError('Cannot copy ... during CUDA graph capture unless ...')\n"
    exec(compile(src, "/site-packages/vllm/v1/worker/gpu/model_runner.py", "exec"), ns)
    try:
        ns["initialize_from_config"]()
    except RuntimeError as exc:
        assert startup_phase(exc)["phase"] == "graph capture"


# ---- multi-rank: VD406, per-rank profiles, CPU thread binding ----------------------------------


def _tp_worker(rank: int, shards: dict[str, Any], tp: int = 2, pp_rank: int = 0, device: str = "cpu") -> WorkerFacts:
    p = placement(device)
    p["worker"] = {"tp_rank": rank % tp, "pp_rank": pp_rank, "tensor_parallel_size": tp, "device": device}
    p["shards"] = shards
    return worker(rank, placement=p)


def test_vd406_compares_ranks_with_each_other_and_with_tensor_parallel_size_1() -> None:
    down = "model.layers.1.mlp.down_proj.weight"
    norm = "model.norm.weight"

    def shards(fp: list[float], down_shape: list[int] | None = None) -> dict[str, Any]:
        return {
            down: {"shape": down_shape or [128, 128], "dim": 1, "fingerprint": fp},
            norm: {"shape": [128], "dim": None},
        }

    reference = {down: [128, 256], norm: [128]}
    good = EngineFacts(
        workers=[_tp_worker(0, shards([1.0, 2.0])), _tp_worker(1, shards([3.0, 4.0]))], reference_shapes=reference
    )
    (ok,) = run("VD406", good)
    assert ok.outcome is Outcome.PASS and "shapes against tensor-parallel size 1" in ok.message
    # rank 1 holds rank 0's slice: the loader did not narrow by the rank
    same = EngineFacts(workers=[_tp_worker(0, shards([1.0, 2.0])), _tp_worker(1, shards([1.0, 2.0]))])
    (f,) = run("VD406", same)
    assert (f.outcome, f.subject) == (Outcome.FAIL, f"rank 1 / cpu / {down}")
    assert "the same values as on rank 0" in f.message and f.evidence["same_as_rank"] == 0
    # the loader replaced the parameter with the whole checkpoint tensor on every rank
    whole = EngineFacts(
        workers=[_tp_worker(r, shards([r + 1.0, 0.5], [128, 256])) for r in (0, 1)], reference_shapes=reference
    )
    findings = run("VD406", whole)
    assert [f.subject for f in findings] == [f"rank 0 / cpu / {down}", f"rank 1 / cpu / {down}"]
    assert "split on dim 1 over 2 rank(s)" in findings[0].message and findings[0].evidence["expected"] == [128, 128]
    # ranks that disagree with each other
    odd = EngineFacts(workers=[_tp_worker(0, shards([1.0, 2.0])), _tp_worker(1, shards([3.0, 4.0], [128, 64]))])
    (f,) = run("VD406", odd)
    assert f.subject == f"rank 1 / cpu / {down}" and "shape [128, 64] on this rank, [128, 128] on rank 0" in f.message
    # one rank: nothing to compare; a padded vocabulary shard fits
    (na,) = run("VD406", EngineFacts(workers=[_tp_worker(0, shards([1.0, 2.0]), tp=1)]))
    assert na.outcome is Outcome.NOT_APPLICABLE
    vocab = {"lm_head.weight": {"shape": [288, 64], "dim": 0, "fingerprint": None}}
    padded = EngineFacts(workers=[_tp_worker(r, vocab) for r in (0, 1)], reference_shapes={"lm_head.weight": [500, 64]})
    assert [f.outcome for f in run("VD406", padded)] == [Outcome.PASS]


def test_vd406_compares_within_each_pipeline_stage() -> None:
    a = {"model.layers.0.w": {"shape": [4, 4], "dim": 0, "fingerprint": [1.0, 1.0]}}
    b = {"model.layers.1.w": {"shape": [4, 4], "dim": 0, "fingerprint": [1.0, 1.0]}}
    # TP=2 x PP=2: ranks 0,1 are stage 0 and 2,3 stage 1; equal values across stages are fine
    facts = EngineFacts(
        workers=[
            _tp_worker(0, a),
            _tp_worker(1, {"model.layers.0.w": {"shape": [4, 4], "dim": 0, "fingerprint": [2.0, 2.0]}}),
            _tp_worker(2, b, pp_rank=1),
            _tp_worker(3, {"model.layers.1.w": {"shape": [4, 4], "dim": 0, "fingerprint": [1.0, 1.0]}}, pp_rank=1),
        ]
    )
    (f,) = run("VD406", facts)
    assert f.subject == "rank 3 / cpu / model.layers.1.w" and f.evidence["pp_rank"] == 1


def test_rank_summaries_and_imbalance() -> None:
    from vllm_doctor.analysis.engine import rank_imbalance, summarize

    def prof(fwd: float, layer: int) -> dict[str, Any]:
        steps = [
            {
                "index": i,
                "t": float(i),
                "phase": "decode",
                "step_s": fwd * 1.1,
                "forward_s": fwd,
                "total_tokens": 1,
                "num_reqs": 1,
            }
            for i in range(3)
        ]
        layers = [
            {"name": f"model.layers.{layer}", "kind": "layer", "layer": layer, "decode_s": 3 * fwd, "decode_calls": 3}
        ]
        return {"profiling": True, "steps": steps, "layers": layers, "trace": [{"t": 0.0, "forward": [], "layers": []}]}

    workers = [
        worker(
            0,
            profile=prof(0.010, 0),
            kv={"storage_bytes": 100},
            placement={"worker": {"tp_rank": 0, "pp_rank": 0, "device": "cuda:0"}},
        ),
        worker(
            1,
            profile=prof(0.030, 1),
            kv={"storage_bytes": 100},
            placement={"worker": {"tp_rank": 0, "pp_rank": 1, "device": "cuda:1"}},
        ),
    ]
    out = summarize(EngineFacts(workers=workers))
    r0, r1 = out.per_rank
    assert (r0.pp_rank, r1.pp_rank, r1.device) == (0, 1, "cuda:1")
    assert [x.layer for x in r0.by_layer] == [0] and [x.layer for x in r1.by_layer] == [1]
    assert (
        r0.steps is None and r1.steps is not None and len(r1.steps) == 3
    )  # the primary rank's timeline is the profile's own
    imb = out.rank_imbalance["decode"]
    assert (imb.slowest_rank, imb.fastest_rank) == (1, 0) and imb.ratio is not None and abs(imb.ratio - 3.0) < 1e-9
    assert rank_imbalance([RankSummary(rank=0)]) == {}
    from vllm_doctor.report.trace import chrome_trace

    trace = chrome_trace(out)
    names = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name")
    assert names == ["rank 0 (cuda:0)", "rank 1 (cuda:1)"] and trace["otherData"]["ranks"] == [0, 1]


def test_cpu_thread_binding_splits_the_cores() -> None:
    from vllm_doctor.stages.engine import cpu_thread_binding

    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    assert cpu_thread_binding(3, [0, 1]) is None and cpu_thread_binding(1, [0, 1]) is None


def test_a_weight_the_cpu_backend_repacked_is_not_a_cross_rank_problem() -> None:
    """vLLM's CPU backend (AVX512-BF16 hosts) empties a linear weight after packing it into its GEMM
    kernel: an empty parameter on every rank is no shard mismatch, a visible one still is."""
    from vllm_doctor.checks.ranks import rank_shard_problems

    reference = {"down.weight": [128, 256], "up.weight": [256, 128]}
    packed = Shard([0], 1, repacked=True)
    shards = {
        r: {"down.weight": packed, "up.weight": Shard([128, 128], 0, fingerprint=[float(r), 1.0])} for r in (0, 1)
    }
    assert rank_shard_problems(shards, reference, 2) == []
    shards[1]["up.weight"] = Shard([256, 128], 0, fingerprint=[5.0, 1.0])  # the whole tensor on rank 1
    problems = rank_shard_problems(shards, reference, 2)  # differs from rank 0, and from TP=1's half
    assert {(p["rank"], p["name"]) for p in problems} == {(1, "up.weight")}
    assert [p["expected"] for p in problems if "expected" in p] == [[128, 128]]
    unmarked = {r: {"down.weight": Shard([0], 1)} for r in (0, 1)}  # empty but not packed: a real problem
    assert {p["rank"] for p in rank_shard_problems(unmarked, reference, 2)} == {0, 1}


def test_step_records_travel_as_packed_arrays_and_read_back_exactly() -> None:
    """doctor_collect's step_arrays: every field one base64 array, read back to the same records
    (None for times a step has not, True/False flags); top's windows send the summary fields only."""
    import base64

    from vllm_doctor.constants import STEP_SUMMARY_COLUMNS

    prof = ForwardProfiler(WallClock(), [], sample_every=4)
    for so in _two_requests(40, restart_at=20):
        prof.begin_step(so)
        prof.after_execute(0.001, output_is_final=False)
        prof.after_sample(0.0005)
    snap = prof.snapshot(reset=True)
    json.dumps(snap)  # plain JSON
    rows = StepTable.of(json.loads(json.dumps(snap))).rows()
    assert [r["index"] for r in rows] == list(range(40)) and {type(r["sampled"]) for r in rows} == {bool}
    plain = [r for r in rows if not r["sampled"]]
    assert plain and all(r["forward_s"] is None and r["logits_s"] is None for r in plain)
    assert all(r["host_execute_s"] == 0.001 and r["host_sample_s"] == 0.0005 for r in rows)
    assert [r["phase"] for r in rows].count("prefill") == 2 and all(r["kv_blocks_used"] == 2 for r in rows)
    # the same records once more, packed on a host of the other byte order
    other = {"big": "little", "little": "big"}[snap["step_arrays"]["byteorder"]]
    swapped = {"n": 40, "byteorder": other, "columns": {}}
    for name, (code, data) in snap["step_arrays"]["columns"].items():
        arr = array.array(code, base64.b64decode(data))
        arr.byteswap()
        swapped["columns"][name] = [code, base64.b64encode(arr.tobytes()).decode()]
    assert StepTable.of({**snap, "step_arrays": swapped}).rows() == rows
    # top's window: the summary fields only, and the same phase table
    for so in _two_requests(40, restart_at=20):
        prof.begin_step(so)
        prof.after_execute(0.001, output_is_final=True)
    window = prof.snapshot(reset=True, timeline=False)
    assert set(window["step_arrays"]["columns"]) == set(STEP_SUMMARY_COLUMNS) and window["trace"] == []
    table = StepTable.of(window)
    assert len(table) == 40 and table.phases.count("prefill") == 2 and table["index"] == [None] * 40
    assert StepTable.of(prof.snapshot())["step_s"] == []  # reset: the next window starts empty


@pytest.mark.parametrize(
    "columns",
    [
        {"step_s": ["d", "not base64!"]},
        {"step_s": ["x", "AAAA"]},
        {"step_s": ["d", "AAAAAAAAAAA="]},  # one float64 for two steps
        {"step_s": "d"},
    ],
    ids=["bad-base64", "bad-type", "short", "not-a-pair"],
)
def test_step_arrays_that_do_not_decode_give_an_empty_table_that_says_why(columns: dict[str, Any]) -> None:
    table = StepTable.of({"step_arrays": {"n": 2, "byteorder": "little", "columns": columns}})
    assert len(table) == 0 and table.error and "step_arrays.step_s" in table.error


def test_doctor_overhead_counts_the_calls_served_between_steps_against_the_window() -> None:
    """Per step: the doctor's time in its wrappers and timers against the steps' host time; over
    the window: that plus the doctor_* calls the worker served, against the window's wall time."""
    steps = StepTable.of({"steps": [
        {"index": i, "host_execute_s": 0.004, "host_sample_s": sample} for i, sample in enumerate([0.001, 0.001, None, 0.001])
    ]})  # fmt: skip
    profile = {
        "doctor_host_s": {"wrappers": 0.0002, "timers": 0.0002, "layer_forwards": 0.0},
        "dropped_steps": 0,
        "doctor_rpc_s": 0.003,
        "window_s": 0.5,
    }
    over = doctor_overhead(ProfileReply.of(profile), steps)
    assert over is not None
    assert over.per_step_s == pytest.approx(0.0001)
    assert over.step_host_s == pytest.approx(0.019 / 4 + 0.00005)  # the wrappers run outside the step's timer
    assert over.rpc_s == 0.003 and over.window_s == 0.5
    assert over.worker_share == pytest.approx((0.0004 + 0.003) / 0.5)
    older = {k: v for k, v in profile.items() if k not in ("doctor_rpc_s", "window_s")}  # a worker before this field
    old_over = doctor_overhead(ProfileReply.of(older), steps)
    assert old_over is not None and old_over.worker_share is None and old_over.rpc_s is None


class TickClock:
    """A host clock that advances one second per mark (deterministic wall-clock marks)."""

    kind = "wall_clock"
    domain = "host"

    def __init__(self) -> None:
        self.now = 0.0

    def mark(self, refresh: bool = False) -> float:
        self.now += 1.0
        return self.now

    @staticmethod
    def capturing() -> bool:
        return False

    def ready(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        return None

    def seconds(self, start: float, end: float) -> float:
        return float(end - start)


ATTN = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def _compiled_profiler() -> ForwardProfiler:
    prof = ForwardProfiler(TickClock(), [], sample_every=1, own_budget=0.0)  # type: ignore[arg-type]
    prof.layers_enabled = True
    prof.set_boundaries([(a, a.rsplit(".self_attn", 1)[0], i, "FlashAttentionImpl") for i, a in enumerate(ATTN)])
    return prof


def test_compiled_mode_names_the_span_that_holds_an_moe_layers_experts() -> None:
    prof = ForwardProfiler(TickClock(), [], sample_every=1, own_budget=0.0)  # type: ignore[arg-type]
    prof.set_boundaries(
        [(a, a.rsplit(".self_attn", 1)[0], i, "FlashAttentionImpl") for i, a in enumerate(ATTN)],
        frozenset({"model.layers.1"}),
    )
    assert prof.timed["model.layers.1 [after attention]"].cls == MOE_SPAN
    assert "router and experts" in MOE_SPAN and prof.timed["model.layers.1 [after attention]"].kind == "dense"
    assert prof.timed["model.layers.0 [after attention]"].cls == "projections, norms, MLP until the next mixer"


def test_compiled_mode_layers_are_cut_at_the_attention_calls() -> None:
    """Marks (one tick each): forward 1, kv write 2-3 and attention 4-5 of layer 0, the same
    7-10 for layer 1, forward's end 11. Layer 0 runs from its attention's start to layer 1's."""
    prof = _compiled_profiler()
    prof.begin_step(_two_requests(1)[0])  # start mark 1 (the step), forward from 2
    prof.module_enter("", True)
    for name in ATTN:
        for _ in ("do_kv_cache_update", "forward"):
            prof.boundary(name, True)
            prof.boundary(name, False)
        prof.clock.mark()  # the dense work after the attention takes a tick
    prof.module_exit("")
    prof.after_execute(0.001, output_is_final=True)
    snap = prof.snapshot()
    layers = {m["name"]: (m["kind"], m["layer"], m["prefill_s"]) for m in snap["layers"]}
    assert layers == {
        "[before the first attention]": ("embedding", None, 1.0),  # forward start 2 -> first kv write 3
        "model.layers.0.self_attn.attn": ("attention", 0, 3.0),  # 3 -> 6
        "model.layers.0 [after attention]": ("dense", 0, 2.0),  # 6 -> 8
        "model.layers.0": ("layer", 0, 5.0),  # 3 -> 8
        "model.layers.1.self_attn.attn": ("attention", 1, 3.0),  # 8 -> 11
        "model.layers.1 [after attention]": ("dense", 1, 2.0),  # 11 -> forward's end 13
        "model.layers.1": ("layer", 1, 5.0),
    }
    row = StepTable.of(snap).rows()[0]
    assert row["forward_s"] == 11.0 and row["layers_timed"] is True
    tables = layer_tables(ProfileReply.of(snap), StepTable.of(snap))
    assert tables.timed_fraction == pytest.approx(1.0)  # the cut adds up to the forward
    assert tables.by_kind == {"embedding": 1.0, "attention": 6.0, "dense": 4.0, "other": 0.0}


def test_without_the_forwards_marks_the_first_and_last_layer_spans_are_missing() -> None:
    """Why the V1 runner's decode showed "forward n/a" and 31 of 32 layers: its FULL CUDA graph ran
    the attention calls' events but nothing timed the forward around them, and the span before the
    first attention and the last layer's (to the forward's end) need the forward's marks. The
    doctor now times the V1 runner's ``_model_forward`` (the engine tier's default-mode test)."""
    prof = _compiled_profiler()
    prof.begin_step(_two_requests(1)[0])
    for name in ATTN:  # no module_enter(""): the forward is not timed
        prof.boundary(name, True)
        prof.boundary(name, False)
        prof.clock.mark()
    prof.after_execute(0.001, output_is_final=True)
    snap = prof.snapshot()
    names = {m["name"] for m in snap["layers"]}
    assert "model.layers.0" in names and "model.layers.1" not in names and "[before the first attention]" not in names
    assert StepTable.of(snap).rows()[0]["forward_s"] is None


def test_a_compiled_step_without_attention_calls_has_no_layer_times() -> None:
    """A step that replayed a FULL CUDA graph with no events in it ran no Python inside the forward:
    it is not a per-layer sample (its forward would dilute the layers' share)."""
    prof = _compiled_profiler()
    prof.begin_step(_two_requests(1)[0])
    prof.module_enter("", True)
    prof.module_exit("")
    prof.after_execute(0.001, output_is_final=True)
    snap = prof.snapshot()
    assert StepTable.of(snap).rows()[0]["layers_timed"] is False and snap["layers"] == []


class FakeEvent:
    """A recorded event's time (ms) and whether it has completed, as a CUDA event answers."""

    def __init__(self, ms: float, done: bool = True) -> None:
        self.ms, self.done, self.synced = ms, done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synced, self.done = True, True

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.ms - self.ms


def test_events_captured_in_a_graph_are_read_as_the_steps_attention_bounds() -> None:
    from vllm_doctor.engine import graphs

    marks = graphs.GraphMarks(
        marks=[
            (ATTN[0], True, FakeEvent(12.0)),
            (ATTN[0], False, FakeEvent(15.0)),
            (ATTN[1], True, FakeEvent(17.0)),
            (ATTN[1], False, FakeEvent(20.0)),
        ]
    )
    step = OpenStep(0, 0.0, (0, 1, 0, 1, 1, 1, 0, 0), start=FakeEvent(10.0))
    marks.unread = (step, FakeEvent(21.0, done=False))
    assert graphs.read(marks, block=False) is False and not step.bounds  # the replay has not finished
    assert graphs.read(marks, block=True) is True and marks.unread is None
    assert [(n, e, b.s) for n, e, b in step.bounds] == [
        (ATTN[0], True, 0.002),
        (ATTN[0], False, 0.005),
        (ATTN[1], True, 0.007),
        (ATTN[1], False, 0.01),
    ]


def _run_steps(prof: ForwardProfiler, sos: list[Any]) -> None:
    for so in sos:
        prof.begin_step(so)
        prof.module_enter("")
        prof.module_enter("model.layers.0")
        prof.module_exit("model.layers.0")
        prof.module_exit("")
        prof.after_execute(0.001, output_is_final=True)


def test_each_reader_has_its_own_window_and_a_reset_takes_nothing_from_another() -> None:
    """top resets its window every second while attach (or the /metrics exporter) reads its own:
    each reader sees every step since its own last reset; what no reader needs is let go."""
    prof = ForwardProfiler(WallClock(), select_modules(ToyForCausalLM()), sample_every=1)
    prof.layers_enabled = True
    sos = _two_requests(10)
    prof.open_window("top")
    _run_steps(prof, sos[:4])
    prof.open_window("attach")  # opens after four steps: sees none of them
    _run_steps(prof, sos[4:6])

    def seen(reader: str, reset: bool = False) -> tuple[list[int], int]:
        snap = prof.snapshot(reset=reset, reader=reader)
        layer0 = next((m for m in snap["layers"] if m["name"] == "model.layers.0"), None)
        return [r["index"] for r in StepTable.of(snap).rows()], layer0["decode_calls"] if layer0 else 0

    first = seen("top", reset=True)
    assert first[0] == [0, 1, 2, 3, 4, 5] and first[1] == 5  # step 0 is the prefill
    _run_steps(prof, sos[6:8])
    assert seen("top", reset=True) == ([6, 7], 2)
    assert seen("attach") == ([4, 5, 6, 7], 4)  # top's two resets took nothing from it
    assert len(prof.steps) == 4  # steps 0-3: no window holds them any more
    _run_steps(prof, sos[8:])
    assert seen("attach", reset=True) == ([4, 5, 6, 7, 8, 9], 6)
    assert seen("top") == ([8, 9], 2)
    prof.close_window("top")  # top went away: attach's window is the only one, and it is empty
    assert prof.steps == [] and prof.steps_base == 10
    assert seen("attach") == ([], 0)
    # a reader with no window of its own (vLLM's collective_rpc, before install) sees what is held
    assert prof.snapshot(reader="unknown")["dropped_steps"] == 0


def test_a_full_buffer_lets_the_oldest_records_go_not_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that falls behind (a ``top --once`` slow to read its window) holds records the
    others have read: when the buffer is full the oldest go, and only that reader is told, so the
    /metrics exporter reading every few seconds keeps counting every step (CI once saw it miss a
    quarter of them: the newest were refused while top's window was open)."""
    from vllm_doctor.engine import profiler as profiler_module

    monkeypatch.setattr(profiler_module, "MAX_STEP_RECORDS", 8)
    monkeypatch.setattr(profiler_module, "EVICT_STEPS", 2)
    prof = ForwardProfiler(WallClock(), select_modules(ToyForCausalLM()), sample_every=1)
    sos = _two_requests(30)
    prof.open_window("slow")
    prof.open_window("exporter")
    exported: list[int] = []
    for start in range(0, 30, 5):
        _run_steps(prof, sos[start : start + 5])
        snap = prof.snapshot(reset=True, reader="exporter")
        assert snap["dropped_steps"] == 0, start
        exported += [r["index"] for r in StepTable.of(snap).rows()]
        assert len(prof.steps) <= 8
    assert exported == list(range(30))  # every step, once
    slow = prof.snapshot(reader="slow")
    kept = [r["index"] for r in StepTable.of(slow).rows()]
    assert kept == list(range(30 - len(kept), 30)) and slow["dropped_steps"] == 30 - len(kept) > 0
    assert prof.dropped_steps == slow["dropped_steps"]
    # a reader whose window opened after the evictions lost nothing
    prof.open_window("late")
    _run_steps(prof, sos[:3])
    assert prof.snapshot(reader="late")["dropped_steps"] == 0


def test_the_finest_cadence_any_reader_asked_for_is_the_one_sampled() -> None:
    """top's panel asks for a sample every 64 steps, attach for every 8: while both are attached the
    profiler samples every 8th step, whichever installed last, and goes back to 64 when attach
    leaves (the last installer used to set it for everyone)."""
    prof = ForwardProfiler(WallClock(), select_modules(ToyForCausalLM()), sample_every=64)
    sos = _two_requests(1 + SAMPLE_WARMUP_STEPS + 64)  # a prefill, the decode warm-up, 64 decode steps
    first = 1 + SAMPLE_WARMUP_STEPS  # the first decode step past the warm-up

    def sampled_since(start: int) -> int:
        return sum(1 for row in StepTable.of(prof.snapshot()).rows() if row["index"] >= start and row["sampled"])

    prof.want_sample_every("attach", 8)
    prof.open_window("attach")
    prof.want_sample_every("top", 64)  # top comes second: attach keeps its cadence
    prof.open_window("top")
    assert prof.sample_every == 8
    _run_steps(prof, sos[: first + 32])
    assert sampled_since(first) == 4  # decode steps 8-39 past the warm-up: every 8th
    prof.close_window("attach")
    assert prof.sample_every == 64
    _run_steps(prof, sos[first + 32 :])
    assert sampled_since(first + 32) == 0  # 32 more decode steps at 1 in 64: none due
    prof.close_window("top")  # the last reader: the cadence stays as it was (nobody samples)
    assert prof.sample_every == 64
