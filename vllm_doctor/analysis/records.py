"""The engine profile's records: ``report.profiles["engine"]``, ``profiles["twin"]``,
``profiles["workload"]`` and the engine anatomy (``facts["engine"]``), as frozen dataclasses.

:mod:`vllm_doctor.analysis.engine`, ``analysis.roofline`` and ``analysis.twin_compare`` build
them; every reader (the text, the HTML report, the trace, ``view``, ``top``'s model panel, the
A/B) takes them by attribute. Each record's field names are report.json's keys (a ``key`` in the
field's metadata where the key is no Python name): :meth:`Record.to_json` writes the JSON,
:meth:`Record.of` reads it back leniently (a key an older doctor did not write reads as its
default, a record is taken as it is), :meth:`Record.json_schema` declares it in
docs/report-schema.json (``python -m vllm_doctor.report.schema --write docs/report-schema.json``).
The machinery is :mod:`vllm_doctor.facts.wire`'s; the records live here, beside what builds
them, where every front end may import them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vllm_doctor.facts import wire
from vllm_doctor.facts.anatomy import CompileState
from vllm_doctor.facts.engine import ExecutionMode
from vllm_doctor.facts.import_pass import ClassRecord, PluginLoad
from vllm_doctor.facts.kv import KvSpec
from vllm_doctor.facts.perf import PerfAnatomy
from vllm_doctor.facts.wire import Record
from vllm_doctor.model import Report

__all__ = ["ClassRecord", "CompileState", "ExecutionMode", "PluginLoad", "Record"]  # and every record below

PHASES = ("prefill", "decode", "mixed")
R = TypeVar("R", bound=Record)


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


# ---- steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRow(Record):
    """One engine step as the reports show it (``facts.steps.StepTable.rows``)."""

    index: int = 0
    t: float | None = field(default=None, metadata=_doc("host start, seconds from the profile's origin"))
    phase: str = "decode"
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefill_reqs: int = 0
    decode_reqs: int = 0
    total_tokens: int = 0
    kv_blocks_used: int = 0
    preempted_reqs: int = 0
    resumed_reqs: int = 0
    num_reqs: int = 0
    step_s: float = 0.0
    step_clock: str | None = field(default=None, metadata=_doc("the clock of step_s: the profile's, or host"))
    forward_s: float | None = field(default=None, metadata=_doc("None: the forward was not timed on this step"))
    logits_s: float | None = None
    host_execute_s: float | None = None
    host_sample_s: float | None = None
    sampled: bool = True
    layers_timed: bool = field(default=True, metadata=_doc("the step was timed per layer (a sample)"))
    layers_detail: bool = field(
        default=True, metadata=_doc("also timed inside its decoder layers (eager mode's finer grain; compiled: always)")
    )
    idle_before_s: float | None = field(
        default=None, metadata=_doc("the device's idle time since the previous step ended, on the step clock")
    )
    encoder_s: float | None = field(
        default=None,
        metadata=_doc("a multimodal model's encoder (embed_multimodal) in this step, on the step clock (None: none)"),
    )


# the fewest steps (or step pairs) a percentage of the doctor's timing cost is computed from: below
# it the text says "too few steps to tell" (a median of one or two steps is one step's noise)
MIN_STEPS_TO_TELL = 5


@dataclass(frozen=True)
class PhaseSummary(Record):
    """One phase's steps (prefill, decode or mixed): counts, step and forward times on the step
    clock, and the steps timed per layer against the others (the doctor's own per-layer cost)."""

    steps: int = 0
    tokens: int = 0
    mean_batch: float = 0.0
    step_s_mean: float = field(
        default=0.0,
        metadata=_doc(
            "mean step time on the step clock: where only some steps are on it (clock_steps < steps, the "
            "sampled step clock on a GPU), the sampled steps as measured and the others at the mean of the "
            "clock_untimed_steps (the step after a sample, every 32nd and a window's first: on the device clock, "
            "not timed inside)"
        ),
    )
    step_s_p50: float | None = field(default=None, metadata=_doc("median step time of the clock_steps"))
    step_s_p90: float | None = field(default=None, metadata=_doc("90th percentile step time of the clock_steps"))
    clock_steps: int | None = field(
        default=None,
        metadata=_doc("steps whose step time is on the step clock (None: a report from before, all of them)"),
    )
    clock_untimed_steps: int = field(
        default=0, metadata=_doc("of those, steps not sampled: their mean stands for every unsampled step")
    )
    host_step_s_mean: float | None = field(
        default=None,
        metadata=_doc(
            "mean host span (execute_model's entry to sample_tokens' return) of the steps not on the step "
            "clock (None: every step is on it)"
        ),
    )
    forward_s_mean: float | None = field(
        default=None, metadata=_doc("mean forward time of the steps whose forward was timed (forward_steps)")
    )
    forward_steps: int = field(default=0, metadata=_doc("steps whose forward was timed"))
    forward_steps_step_s_mean: float | None = field(
        default=None,
        metadata=_doc("mean step time of the same steps as forward_s_mean: the step time to set the forward beside"),
    )
    forward_share: float | None = field(
        default=None, metadata=_doc("the forward's share of the step time of the steps it was timed on")
    )
    tokens_per_s: float | None = None
    idle_before_s_mean: float | None = field(
        default=None, metadata=_doc("mean idle time of the device before each step (since the previous step ended)")
    )
    encoder_steps: int = field(default=0, metadata=_doc("steps that ran a multimodal model's encoder"))
    encoder_s: float | None = field(
        default=None,
        metadata=_doc("the encoder's time (embed_multimodal: vision tower, projector) over those steps, step clock"),
    )
    encoder_step_s: float | None = field(
        default=None, metadata=_doc("the step time of those steps, in all: the encoder's share is encoder_s over it")
    )
    timed_steps: int = field(default=0, metadata=_doc("steps timed per layer"))
    timed_step_s_median: float | None = field(
        default=None, metadata=_doc("median step time of the steps timed per layer (None: no such step)")
    )
    untimed_step_s_median: float | None = field(
        default=None, metadata=_doc("median step time of the steps not timed per layer (None: no such step)")
    )
    neighbour_pairs: int = field(default=0, metadata=_doc("steps timed per layer next to an untimed step"))
    timed_vs_neighbours: float | None = field(
        default=None,
        metadata=_doc(
            "median over the steps timed per layer of their time over their untimed neighbours', less 1: "
            "the doctor's per-layer cost without the run's drift and warm-up (None: no such pair)"
        ),
    )
    detail_vs_neighbours: float | None = field(
        default=None,
        metadata=_doc("the same for the steps also timed inside their layers (eager mode's finer grain only)"),
    )

    @property
    def untimed_steps(self) -> int:
        """Steps of the phase on the step clock not timed per layer."""
        return max(0, (self.steps if self.clock_steps is None else self.clock_steps) - self.timed_steps)

    @property
    def host_steps(self) -> int:
        """Steps of the phase whose step time is the host's (not on the step clock)."""
        return 0 if self.clock_steps is None else max(0, self.steps - self.clock_steps)

    @property
    def too_few_to_tell(self) -> bool:
        """Both kinds of step are there, but fewer than :data:`MIN_STEPS_TO_TELL` of one of them:
        a percentage from so few would be noise (one slow step reads as +5000 %)."""
        both = self.timed_step_s_median is not None and self.untimed_step_s_median is not None
        return both and min(self.timed_steps, self.untimed_steps) < MIN_STEPS_TO_TELL

    @property
    def timing_cost(self) -> float | None:
        """How much longer a step timed per layer takes than one that is not (a fraction), where
        the phase has at least :data:`MIN_STEPS_TO_TELL` of both."""
        timed, untimed = self.timed_step_s_median, self.untimed_step_s_median
        if timed is None or untimed is None or untimed <= 0 or self.too_few_to_tell:
            return None
        return timed / untimed - 1.0


# ---- layers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerModule(Record):
    """One timed module's time summed over the steps timed per layer, per profiler bucket
    (decode; prefill = prefill and mixed steps)."""

    name: str = ""
    kind: str | None = field(default=None, metadata=_doc("embedding, attention, dense, mlp, norm, logits, layer"))
    layer: int | None = None
    class_name: str | None = field(default=None, metadata={"key": "class"})
    prefill_calls: int = 0
    prefill_s: float = 0.0
    decode_calls: int = 0
    decode_s: float = 0.0
    # the steps it was timed on (None: a doctor from before eager mode's two grains, every step
    # timed per layer): an inner module's are the detailed ones only
    prefill_steps: int | None = None
    decode_steps: int | None = None
    # its time on the detailed steps (None: a doctor from before); a decoder layer's scales the
    # modules inside it to all the steps timed per layer
    prefill_detail_s: float | None = None
    decode_detail_s: float | None = None
    # the doctor's own cost estimated inside prefill_s / decode_s (LayerTables.doctor_cost): what
    # bucket_s and total_s leave out
    prefill_cost_s: float = field(
        default=0.0, metadata=wire.rules(omit_default=True, doc="the doctor's estimated cost inside prefill_s")
    )
    decode_cost_s: float = field(
        default=0.0, metadata=wire.rules(omit_default=True, doc="the doctor's estimated cost inside decode_s")
    )
    prefill_detail_cost_s: float = field(
        default=0.0, metadata=wire.rules(omit_default=True, doc="the doctor's estimated cost inside prefill_detail_s")
    )
    decode_detail_cost_s: float = field(
        default=0.0, metadata=wire.rules(omit_default=True, doc="the doctor's estimated cost inside decode_detail_s")
    )
    total_s: float = field(
        default=0.0,
        metadata=_doc(
            "over every step timed per layer, less the doctor's estimated cost "
            "(an inner module's scaled from its own steps)"
        ),
    )
    calls: int = 0

    def bucket_s(self, bucket: str) -> float:
        """Seconds over this module's own steps of ``bucket``, less the doctor's estimated cost."""
        if bucket == "decode":
            return max(0.0, self.decode_s - self.decode_cost_s)
        return max(0.0, self.prefill_s - self.prefill_cost_s)

    def measured_s(self, bucket: str) -> float:
        """Seconds over this module's own steps of ``bucket`` as the clock read them."""
        return self.decode_s if bucket == "decode" else self.prefill_s

    def bucket_steps(self, bucket: str) -> int | None:
        return self.decode_steps if bucket == "decode" else self.prefill_steps

    def detail_s(self, bucket: str) -> float | None:
        """Seconds on the detailed steps of ``bucket``, less the doctor's estimated cost there
        (:attr:`detail_cost_s` of the bucket); None from a doctor that did not record them."""
        seconds = self.decode_detail_s if bucket == "decode" else self.prefill_detail_s
        if seconds is None:
            return None
        cost = self.decode_detail_cost_s if bucket == "decode" else self.prefill_detail_cost_s
        return max(0.0, seconds - cost)

    def bucket_calls(self, bucket: str) -> int:
        return self.decode_calls if bucket == "decode" else self.prefill_calls


@dataclass(frozen=True)
class LayerTotal(Record):
    """One decoder layer's time, and its kinds' (attention, MLP, ...) within it."""

    layer: int = 0
    total_s: float = 0.0
    kinds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TimingMarkCost(Record):
    """What one of the doctor's timing marks costs the steps it times, in one profiler bucket
    (decode; prefill = prefill and mixed steps), measured on the step clock: each step timed per
    layer against its untimed neighbours, over the marks that step made. Eager mode only: there
    the host launches every kernel, and the doctor's Python and events between two launches are
    time the device waits."""

    bucket: str = ""
    per_mark_s: float | None = field(
        default=None,
        metadata=_doc(
            "steps timed at the layers' boundaries: the median over those with an untimed neighbour of "
            "(step - neighbours' mean) / marks (0 where they came out no slower; None: fewer than three such steps)"
        ),
    )
    pairs: int = field(default=0, metadata=_doc("steps timed at the boundaries next to an untimed step"))
    detail_per_mark_s: float | None = field(
        default=None,
        metadata=_doc(
            "the same over the detailed steps (timed inside the layers too), whose marks partly overlap the "
            "device's work inside a layer (None: fewer than three such steps)"
        ),
    )
    detail_pairs: int = field(default=0, metadata=_doc("detailed steps next to an untimed step"))
    boundary_steps: int = field(default=0, metadata=_doc("steps timed at the layers' boundaries only"))
    boundary_marks: int = field(
        default=0, metadata=_doc("marks on such a step (one per boundary module, and the root's and logits')")
    )
    detail_steps: int = field(default=0, metadata=_doc("steps timed inside the layers too"))
    detail_marks: int = field(
        default=0, metadata=_doc("marks on such a step (two per timed module, and the root's and logits')")
    )
    corrected_s: float = field(default=0.0, metadata=_doc("the estimated cost taken out of the timed modules, in all"))
    in_forwards_s: float = field(
        default=0.0,
        metadata=_doc(
            "the estimated cost taken out of the timed steps' forwards: the modules' at the top (not the logits "
            "processor's, after the forward) and one mark's per step before the first module (the root's entry)"
        ),
    )

    def mark_s(self, detail: bool) -> float:
        """One mark's cost on a step of that grain: the other grain's where this one has no
        reading; 0 where neither has."""
        mine, other = (self.detail_per_mark_s, self.per_mark_s) if detail else (self.per_mark_s, self.detail_per_mark_s)
        return mine if mine is not None else other if other is not None else 0.0

    @property
    def measured(self) -> bool:
        return self.per_mark_s is not None or self.detail_per_mark_s is not None


@dataclass(frozen=True)
class LayerTables(Record):
    """Per module, per decoder layer and per kind (``other``: the forward in no kind), over the
    steps timed per layer."""

    timed_fraction: float | None = field(
        default=None, metadata=_doc("the share of those steps' forward the timed modules cover")
    )
    modules: list[LayerModule] = field(default_factory=list)
    by_layer: list[LayerTotal] = field(default_factory=list)
    by_kind: dict[str, float] = field(default_factory=dict)
    forward_total_s: float = field(
        default=0.0, metadata=_doc("the forward of the steps timed per layer, less the doctor's estimated cost")
    )
    timed_steps: int = 0
    sample_every: int | None = None
    doctor_cost: list[TimingMarkCost] = field(
        default_factory=list,
        metadata=_doc("eager mode: the timing marks' measured cost per bucket, taken out of the modules' times"),
    )
    untimed_mixers: list[str] = field(
        default_factory=list,
        metadata=_doc(
            "compiled modes: token mixers of vLLM's forward context whose calls never ran where the doctor times "
            "them (vLLM ran them through an op that is no graph split): their time is in the spans around them"
        ),
    )
    mixers: int = field(default=0, metadata=_doc("compiled modes: the token mixers the doctor set out to time"))


# ---- time ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdleBetweenSteps(Record):
    """The device's idle time between consecutive steps, on the step clock."""

    clock: str | None = None
    gaps: int = 0
    total_s: float = 0.0
    mean_s: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    max_s: float | None = None


@dataclass(frozen=True)
class TimeAccounting(Record):
    """Do the step times add up to the workload's wall time (steps + between steps + edges)?"""

    clock: str | None = None
    steps_s: float = 0.0
    wall_s: float = 0.0
    share: float = 0.0
    outside_steps_s: float = 0.0
    between_steps_s: float | None = None
    between_steps_mean_s: float | None = None
    edges_s: float | None = field(
        default=None,
        metadata=_doc("before the first step and after the last: measured where the clocks allow, else the rest"),
    )
    before_first_s: float | None = field(
        default=None,
        metadata=_doc("from the workload's start to the first step's (the host's monotonic clock; requests in: "
                      "tokenizing, a multimodal processor)"),
    )  # fmt: skip
    after_last_s: float | None = field(
        default=None, metadata=_doc("from the last step's end to the workload's (outputs out)")
    )
    measured_share: float | None = field(
        default=None,
        metadata=_doc("steps + between steps + before the first + after the last, each measured, over the wall time"),
    )
    accounted_share: float | None = None
    above_wall: bool = field(default=False, metadata=_doc("the steps add up to more than the wall time: a doctor bug"))


@dataclass(frozen=True)
class DoctorOverhead(Record):
    """The doctor's own host time per step, against the worker's host time of the step."""

    host_s: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    per_step_s: float = 0.0
    step_host_s: float = 0.0
    share: float | None = None
    rpc_s: float | None = field(
        default=None,
        metadata=_doc(
            "the doctor's time in the calls it served its readers between steps, with the rest of their requests: "
            "on a reader's thread (the private channel) that thread's CPU time, on the engine's (collective_rpc) "
            "the wall time"
        ),
    )
    rpc_wall_s: float | None = field(
        default=None,
        metadata=_doc(
            "the same calls' wall time: what the readers waited, their threads' waits for the GIL and the device "
            "included (the engine's thread ran meanwhile); None: an older doctor"
        ),
    )
    window_s: float | None = None
    worker_share: float | None = None
    own_budget: float | None = field(
        default=None,
        metadata=_doc(
            "the doctor's own budget on the device clock, a share of the worker's time (0: none, the sampling "
            "cadence alone: turned off, or a CPU's wall clock; None: an older doctor)"
        ),
    )
    samples_skipped: int = field(
        default=0, metadata=_doc("steps due for a sample (the warm-up's or the cadence's) left unsampled by the budget")
    )


# ---- memory and KV -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBreakdown(Record):
    """One worker's memory: weights / peak activations / KV / CUDA graphs / other."""

    device: str | None = None
    total: int | None = None
    total_source: str | None = None
    peak_total: int | None = None
    parts: dict[str, int | None] = field(default_factory=dict)
    torch: dict[str, int | None] | None = None
    device_used: int | None = None
    notes: list[str] = field(default_factory=list)
    measurable: bool = False
    rank: int | None = None


@dataclass(frozen=True)
class KvUsagePoint(Record):
    t: float | None = None
    index: int = 0
    blocks: int = 0
    usage: float = 0.0


@dataclass(frozen=True)
class TraceSpan(Record):
    """A forward's or a module's span in a traced step: offset from the step's start, duration."""

    name: str | None = None
    offset_s: float = 0.0
    dur_s: float = 0.0


@dataclass(frozen=True)
class TraceStep(Record):
    """A step timed per layer, for the Perfetto trace."""

    index: int = 0
    t: float = 0.0
    step_s: float | None = None
    phase: str | None = None
    forward: list[TraceSpan] = field(default_factory=list)
    layers: list[TraceSpan] = field(default_factory=list)


# ---- roofline ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RooflineModel(Record):
    """The model's sizes per rank and the weights a step reads."""

    hidden: int = 0
    layers: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    vocab: int = 0
    tied_embeddings: bool = False
    weight_bytes_per_element: float = 0.0
    kv_bytes_per_element: float = 0.0
    params: int = 0
    resident_weight_bytes: float = 0.0
    measured_weight_bytes: float | None = None
    weights_read_bytes: float = 0.0
    weights_source: str | None = None
    experts: RooflineExperts | None = None  # a mixture of experts: what a step reads of them
    weights_quantized: str | None = field(
        default=None, metadata=_doc("the quantized weights in words (dtype, method, layers, bytes); None: none")
    )


@dataclass(frozen=True)
class RooflineExperts(Record):
    """A mixture of experts' routed experts per rank: a step reads only those its tokens are
    routed to (analysis.roofline.expected_experts), plus each layer's router and shared experts."""

    moe_layers: int = 0
    experts: int = 0  # routed experts per layer on this rank
    top_k: int = 0
    expert_bytes: float = 0.0  # one routed expert's weights in one layer
    router_and_shared_bytes: float = 0.0  # one layer's router and shared experts, read every step
    source: str | None = None  # "measured" (the worker's fused-MoE parameters) or "config"
    assumption: str | None = None


@dataclass(frozen=True)
class DevicePeaks(Record):
    """What the device can do at most (None: unknown), and whence."""

    name: str | None = None
    bandwidth_bytes_s: float | None = None
    bandwidth_source: str | None = None
    flops_s: float | None = None
    flops_dtype: str | None = None
    flops_source: str | None = None


@dataclass(frozen=True)
class StepBytes(Record):
    weights: float = 0.0
    kv_read: float = 0.0
    kv_write: float = 0.0
    activations: float = 0.0
    total: float = 0.0


@dataclass(frozen=True)
class StepFlops(Record):
    gemm: float = 0.0
    lm_head: float = 0.0
    attention: float = 0.0
    total: float = 0.0


@dataclass(frozen=True)
class RooflineWorkload(Record):
    tokens: float = 0.0
    seqs: float = 0.0
    context_tokens: float = 0.0


@dataclass(frozen=True)
class Rates(Record):
    """Achieved bytes/s and FLOP/s, their shares of the device's peaks; a rate above a peak is
    a doctor bug (``above_peak``, ``problems``), its share withheld."""

    bytes_per_s: float | None = None
    bytes_per_s_with_activations: float | None = None
    flops_per_s: float | None = None
    bandwidth_share: float | None = None
    compute_share: float | None = None
    intensity: float | None = None
    above_peak: bool = False
    problems: list[str] = field(default_factory=list)
    bound: str | None = field(default=None, metadata=_doc("compute or memory, where both peaks are known"))


@dataclass(frozen=True)
class RooflinePhase(Rates):
    """One phase's mean step against the device's peaks."""

    step_s: float | None = None
    workload: RooflineWorkload = field(default_factory=RooflineWorkload)
    bytes: StepBytes = field(default_factory=StepBytes)
    flops: StepFlops = field(default_factory=StepFlops)
    routed_experts: float | None = None  # MoE: distinct experts a layer reads per step (expected)


@dataclass(frozen=True)
class RooflineLayer(Rates):
    """One timed decoder layer's call against the device's peaks."""

    layer: int = 0
    name: str | None = None
    phase: str | None = None
    time_s: float | None = None
    bytes: StepBytes = field(default_factory=StepBytes)


@dataclass(frozen=True)
class Roofline(Record):
    """The step against the device's physical limit (analysis.roofline), or why not."""

    available: bool = False
    reason: str | None = None
    model: RooflineModel = field(default_factory=RooflineModel)
    device: DevicePeaks = field(default_factory=DevicePeaks)
    context: str | None = None
    phases: dict[str, RooflinePhase] = field(default_factory=dict)
    layers: list[RooflineLayer] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    above_peak: bool = False


# ---- ranks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankSummary(Record):
    """One rank's own numbers; its steps and trace only where they are not the profile's own."""

    rank: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    device: str | None = None
    pid: int | None = None
    phases: dict[str, PhaseSummary] = field(default_factory=dict)
    by_layer: list[LayerTotal] = field(default_factory=list)
    forward_total_s: float = 0.0
    kv_storage_bytes: int | None = None
    kv_num_blocks: int | None = None
    steps: list[StepRow] | None = field(
        default=None,
        metadata={"doc": "absent for the primary rank: its steps are the profile's own", "omit_none": True},
    )
    trace: list[TraceStep] = field(default_factory=list)

    def forward_s_mean(self, phase: str) -> float | None:
        p = self.phases.get(phase)
        return p.forward_s_mean if p is not None else None


@dataclass(frozen=True)
class RankImbalance(Record):
    """Per phase, the slowest and the fastest rank (mean forward time, else mean step time)."""

    slowest_rank: int | None = None
    slowest_s: float = 0.0
    fastest_rank: int | None = None
    fastest_s: float = 0.0
    ratio: float | None = None


# ---- the whole profile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantGroup(Record):
    """The linear layers that run one quantization method with one weight storage."""

    method: str = ""  # the scheme ("W8A8Int8") or the method ("Fp8Linear")
    weight_dtype: str | None = field(
        default=None, metadata=_doc("what a weight element is: int8, float8_e4m3fn, int4 packed in int32")
    )
    layers: int = 0
    weight_bytes: int = 0
    other_bytes: int = field(default=0, metadata=_doc("scales, zero points and biases of those layers"))
    in_kernel: bool = field(
        default=False, metadata=_doc("vLLM's CPU kernel holds the weights: bytes from shape x bits")
    )


@dataclass(frozen=True)
class QuantUnquantized(Record):
    """A layer that runs without the checkpoint's quantization."""

    name: str = ""
    kind: str | None = None  # "linear", "lm_head", "embedding", "experts"
    method: str | None = None  # "UnquantizedLinearMethod"
    weight_dtype: str | None = None
    weight_bytes: int | None = None
    ignored: bool = field(default=False, metadata=_doc("the quantization config's ignore list names it"))


@dataclass(frozen=True)
class QuantSummary(Record):
    """``profiles["engine"]["quantization"]``: which layers run quantized (the worker's doctor_quant)."""

    method: str | None = field(
        default=None, metadata=_doc("the quantization config's name: compressed-tensors, fp8, ...")
    )
    linear_layers: int = 0
    quantized_linear_layers: int = 0
    groups: list[QuantGroup] = field(default_factory=list)
    unquantized: list[QuantUnquantized] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list, metadata=_doc("the config's list of modules left unquantized"))
    text: str = ""


@dataclass(frozen=True)
class EngineProfile(Record):
    """``report.profiles["engine"]``: the primary rank's steps, phases, layers, KV usage, memory
    of every rank, the roofline, the time accounting and the doctor's own cost."""

    available: bool = False
    reason: str | None = field(default=None, metadata=_doc("why there is no profile (no worker replied)"))
    rank: int | None = None
    device: str | None = None
    clock: str | None = field(default=None, metadata=_doc("the step and forward times' clock (units.clock_name)"))
    step_clock: str | None = field(
        default=None,
        metadata=_doc(
            "which steps carry that clock's step time: every (each step), sampled (a GPU's default: the sampled "
            "steps, the step after each, every 32nd and a window's first; the others their host span, step_clock "
            "host); None: a report from before"
        ),
    )
    layers_on: bool | None = None
    layers_reason: str | None = None
    steps: list[StepRow] = field(default_factory=list)
    step_count: int = 0
    steps_error: str | None = None
    dropped_steps: int = 0
    phases: dict[str, PhaseSummary] = field(default_factory=dict)
    layers: LayerTables = field(default_factory=LayerTables)
    kv_usage: list[KvUsagePoint] = field(default_factory=list)
    kv_num_blocks: int | None = None
    kv_block_size: int | None = None
    trace: list[TraceStep] = field(default_factory=list)
    memory: list[MemoryBreakdown] = field(default_factory=list)
    nvml: dict[str, Any] | None = None
    crashes: list[dict[str, Any]] = field(default_factory=list)
    idle_between_steps: IdleBetweenSteps | None = None
    doctor_overhead: DoctorOverhead | None = None
    roofline: Roofline | None = None
    per_rank: list[RankSummary] = field(default_factory=list)
    rank_imbalance: dict[str, RankImbalance] = field(default_factory=dict)
    time_accounting: TimeAccounting | None = None
    encoder_cache: EncoderCacheUse | None = None
    quantization: QuantSummary | None = None
    host_span_s: list[float] | None = field(
        default=None,
        metadata=_doc("[first step's start, last step's end] on the host's monotonic clock (perf_counter; "
                      "the last end is its host start plus its step time)"),
    )  # fmt: skip

    @property
    def steps_recorded(self) -> int:
        """Steps in the profile: ``step_count`` (an older report: the steps listed)."""
        return self.step_count or len(self.steps)


# ---- the engine's anatomy ------------------------------------------------------------------------


@dataclass(frozen=True)
class FrontEnd(Record):
    """The process the doctor drives the engine from (``LLM``), or a served engine's API server."""

    pid: int | None = None
    url: str | None = None
    llm_class: str | None = None
    engine_class: str | None = None
    core_client_class: str | None = None
    engine_core_in_process: bool = False
    executor_backend: str | None = None
    executor_class: str | None = None
    engine_core_pids: list[int] = field(default_factory=list)
    worker_extension_cls: str | None = None
    served_models: list[str] = field(default_factory=list)
    server_version: str | None = None


@dataclass(frozen=True)
class ExecutorInfo(Record):
    backend: str | None = None
    class_name: str | None = field(default=None, metadata={"key": "class"})
    pid: int | None = None


@dataclass(frozen=True)
class WorkerAnatomy(Record):
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    ppid: int | None = None
    device: str | None = None
    worker_class: str | None = None
    model_runner_class: str | None = None
    model_runner_kind: str | None = None
    model_class: str | None = None
    model_module_file: str | None = None
    compile: CompileState | None = None
    process_title: str | None = None


@dataclass(frozen=True)
class ProcessBox(Record):
    """One process of the engine and what it holds."""

    role: str = ""
    pid: int | None = None
    rank: int | None = None
    device: str | None = None
    in_process_with: str | None = None
    holds: list[str | None] = field(default_factory=list)


@dataclass(frozen=True)
class ModelInfo(Record):
    class_name: str | None = field(default=None, metadata={"key": "class"})
    origin: str | None = field(default=None, metadata=_doc("built-in, plugin, transformers-fallback or unknown"))
    file: str | None = None


@dataclass(frozen=True)
class ModelRunnerInfo(Record):
    class_name: str | None = field(default=None, metadata={"key": "class"})
    kind: str | None = None


@dataclass(frozen=True)
class KvGroupSummary(Record):
    """One KV-cache group: its layers and vLLM's spec, as far as vLLM exposes it (None: not), the
    spec's fields beside ``layers`` in the JSON."""

    layers: int = 0
    spec: KvSpec = field(default_factory=KvSpec, metadata=wire.rules(inline=True))


@dataclass(frozen=True)
class KvSummary(Record):
    layout: str | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    num_layers: int | None = None
    num_storages: int | None = None
    storage_bytes: int | None = None
    tensor_shape: list[int] | None = None
    dtype: str | None = None
    groups: list[KvGroupSummary] = field(default_factory=list)
    capacity_tokens: int | None = field(
        default=None, metadata=_doc("vLLM's own KV cache size in tokens (its 'KV cache size: N tokens' line)")
    )
    max_concurrency: float | None = field(
        default=None, metadata=_doc("vLLM's own maximum concurrency: requests of max_model_len at once")
    )
    max_model_len: int | None = None
    planned_bytes: int | None = field(default=None, metadata=_doc("the bytes vLLM planned for the KV cache"))
    shared_layers: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "cross-layer KV sharing: a layer that reads another layer's cache by design (Gemma 3n's last layers) "
            "-> that layer; vLLM counts it in its target's group and gives it no storage of its own"
        ),
    )


@dataclass(frozen=True)
class EngineAnatomy(Record):
    """``report.facts["engine"]``: which process holds the front end, engine core, executor and
    each worker; the model, its runner, the KV cache's layout and how vLLM runs the model."""

    front_end: FrontEnd = field(default_factory=FrontEnd)
    executor: ExecutorInfo = field(default_factory=ExecutorInfo)
    workers: list[WorkerAnatomy] = field(default_factory=list)
    processes: list[ProcessBox] = field(default_factory=list)
    model: ModelInfo = field(default_factory=ModelInfo)
    model_runner: ModelRunnerInfo = field(default_factory=ModelRunnerInfo)
    kv_cache: KvSummary = field(default_factory=KvSummary)
    compile: CompileState | None = None


# ---- the twin A/B --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TwinMatchInfo(Record):
    """How the twin was found (``auto`` / ``forced``) and whose weights both runs load."""

    how: str | None = None
    weights: str | None = field(default=None, metadata=_doc("same: the port's files; dummy: random weights on both"))
    notes: list[str] = field(default_factory=list)
    model_dir: str | None = None
    decoder_prefix: str | None = field(
        default=None,
        metadata=_doc("a multimodal port: the prefix of its language model, the part the twin stands for"),
    )


@dataclass(frozen=True)
class TwinRoofline(Record):
    """A side's roofline of one phase, as the A/B carries it."""

    bytes_per_s: float | None = None
    bandwidth_share: float | None = None
    peak_bytes_s: float | None = None
    flops_per_s: float | None = None
    compute_share: float | None = None
    above_peak: bool = False


@dataclass(frozen=True)
class TwinPhase(Record):
    """One phase, port against twin (ratios port / twin for times, twin / port for throughput)."""

    port_steps: int | None = None
    twin_steps: int | None = None
    port_step_s: float | None = None
    twin_step_s: float | None = None
    step_ratio: float | None = None
    port_forward_s: float | None = None
    twin_forward_s: float | None = None
    forward_ratio: float | None = None
    port_forward_steps_step_s: float | None = field(
        default=None, metadata=_doc("the port's mean step time of the steps its forward was timed on")
    )
    twin_forward_steps_step_s: float | None = None
    port_tok_s: float | None = None
    twin_tok_s: float | None = None
    throughput_ratio: float | None = None
    port_roofline: TwinRoofline | None = None
    twin_roofline: TwinRoofline | None = None


@dataclass(frozen=True)
class TwinKindPhase(Record):
    port_s: float = 0.0
    twin_s: float = 0.0
    ratio: float | None = None


@dataclass(frozen=True)
class TwinKind(Record):
    """One layer kind both sides can be compared on, per profiler bucket and over both."""

    covers: str | None = None
    phases: dict[str, TwinKindPhase] = field(default_factory=dict)
    port_s: float = 0.0
    twin_s: float = 0.0
    ratio: float | None = None


@dataclass(frozen=True)
class TwinGap(Record):
    """Where the port loses the most time against the twin over the workload."""

    phase: str | None = None
    kind: str | None = None
    ratio: float | None = None
    port_s: float | None = None
    twin_s: float | None = None
    excess_s: float | None = None
    text: str | None = None


@dataclass(frozen=True)
class TwinFlags(Record):
    port: bool | None = None
    twin: bool | None = None


@dataclass(frozen=True)
class TwinExecution(Record):
    port: CompileState | None = None
    twin: CompileState | None = None


@dataclass(frozen=True)
class TwinClocks(Record):
    port: str | None = None
    twin: str | None = None


@dataclass(frozen=True)
class TwinWorkload(Record):
    prompts: int | None = None
    input_len: int | None = None
    output_len: int | None = None


@dataclass(frozen=True)
class TwinQuant(Record):
    """Which layers run quantized on each side of the A/B, in words (None: that side is not quantized)."""

    port: str | None = None
    twin: str | None = None
    same: bool = field(default=False, metadata=_doc("both sides run the same methods with the same weight storage"))


@dataclass(frozen=True)
class TwinAB(Record):
    """``report.profiles["twin"]``: the port against vLLM's in-tree twin, or why there is none
    (``none``, one line)."""

    architecture: str | None = None
    none: str | None = field(
        default=None, metadata={"doc": "why no A/B ran (one line); absent: it ran", "omit_none": True}
    )
    match: TwinMatchInfo = field(default_factory=TwinMatchInfo)
    compiled: TwinFlags = field(default_factory=TwinFlags)
    cuda_graphs: TwinFlags = field(default_factory=TwinFlags)
    execution: TwinExecution = field(default_factory=TwinExecution)
    clock: TwinClocks = field(default_factory=TwinClocks)
    workload: TwinWorkload = field(default_factory=TwinWorkload)
    port_tok_s: float | None = None
    twin_tok_s: float | None = None
    throughput_ratio: float | None = None
    phases: dict[str, TwinPhase] = field(default_factory=dict)
    kinds: dict[str, TwinKind] = field(default_factory=dict)
    kinds_basis: str | None = None
    kinds_per: str | None = None
    not_separable: list[str] = field(default_factory=list)
    kinds_scaled: list[str] = field(
        default_factory=list,
        metadata=_doc(
            "a side and phase whose kinds summed past its forward on the same steps (eager mode's per-module "
            "marks), and by how much: its kinds are scaled to that forward"
        ),
    )
    largest_gap: TwinGap = field(default_factory=TwinGap)
    quantization: TwinQuant | None = field(
        default=None, metadata=_doc("each side's quantization (profiles.engine.quantization); None: neither side's")
    )


# ---- what a worker's profile reply holds ---------------------------------------------------------


@dataclass(frozen=True)
class EncoderCacheUse(Record):
    """A multimodal model's encoder calls and the runner's encoder cache (its outputs kept for the
    steps that place them), counted by the doctor's wrapper on ``embed_multimodal``."""

    calls: int = 0
    items: int = field(default=0, metadata=_doc("items (images) the encoder ran on"))
    rows: int = field(default=0, metadata=_doc("embedding rows those calls returned"))
    peak_entries: int = field(default=0, metadata=_doc("the most items the cache held at once"))
    peak_rows: int = field(default=0, metadata=_doc("the most embedding rows it held at once"))
    peak_bytes: int = 0
    budget_rows: int | None = field(default=None, metadata=_doc("the cache's size in embedding rows"))
    budget_source: str | None = field(default=None, metadata=_doc("where vLLM's budget was read"))


@dataclass(frozen=True)
class ProfileReply(Record):
    """The parts of a worker's ``doctor_collect`` profile reply the summaries read (its step
    records are :class:`vllm_doctor.facts.steps.StepTable`'s)."""

    profiling: bool = False
    clock: str | None = None
    step_clock: str | None = None  # "every" or "sampled" (which steps carry the clock's step time)
    layers_on: bool | None = None
    layers_reason: str | None = None
    sample_every: int | None = None
    own_budget: float | None = None  # the doctor's own budget (0: none, or the wall clock); None: an older doctor
    samples_skipped: int = 0  # steps due for a sample that the budget left unsampled, in the window
    detail_every: int | None = None
    boundary_marks: str | None = None  # eager's boundary grain: "entry" (one mark per module)
    dropped_steps: int = 0
    num_blocks: int | None = None
    layers: list[LayerModule] = field(default_factory=list)
    trace: list[TraceStep] = field(default_factory=list)
    doctor_host_s: dict[str, float] = field(default_factory=dict)
    doctor_rpc_s: float | None = None
    doctor_rpc_wall_s: float | None = None  # the calls' wall time (None: an older doctor)
    window_s: float | None = None
    crashes: list[dict[str, Any]] = field(default_factory=list)
    encoder_cache: EncoderCacheUse | None = None
    mixers: list[str] = field(default_factory=list)  # compiled modes: the mixers whose calls are timed


@dataclass(frozen=True)
class WorkloadRun(Record):
    """``report.profiles["workload"]``: the engine stage's workload and what it produced (the
    doctor attached)."""

    prompts: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    generated_tokens: int | None = None
    wall_s: float | None = None
    output_tokens_per_s: float | None = None
    host_start_s: float | None = field(
        default=None, metadata=_doc("the workload's start on the host's monotonic clock (perf_counter)")
    )
    # a multimodal model's workload only (absent from a text model's report)
    images_per_prompt: int | None = field(
        default=None, metadata=wire.rules(omit_none=True, doc="a multimodal model's images in each prompt")
    )
    image_size: list[int] | None = field(
        default=None, metadata=wire.rules(omit_none=True, doc="the images' [width, height]")
    )
    images_error: str | None = field(
        default=None, metadata=wire.rules(omit_none=True, doc="why the workload ran without images")
    )


# ---- the static stage's facts ---------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedClass(Record):
    """``report.facts["resolved"]``: the architecture vLLM picks from config.json and the class it
    resolves to (``module:Class``)."""

    architecture: str = ""
    target: str = ""


@dataclass(frozen=True)
class PluginRegistration(Record):
    """One ``ModelRegistry.register_model`` call a plugin makes, as the static scan read it."""

    arch: str = ""
    target: str = ""  # "module:Class" (lazy) or "module.Class" / "<name>" (an eager class)
    lazy: bool = False
    where: str = ""  # "path:line"


@dataclass(frozen=True)
class PluginFound(Record):
    """One entry of ``report.facts["plugins"]``: a ``vllm.general_plugins`` entry point as the
    static scan found it (:class:`vllm_doctor.facts.plugins.PluginInfo`, written)."""

    name: str = ""
    value: str = ""  # "module:function"
    distribution: str | None = None
    allowed: bool = False  # not excluded by VLLM_PLUGINS
    module_file: str | None = None
    function_found: bool = False
    registrations: tuple[PluginRegistration, ...] = ()
    config_registrations: tuple[tuple[str, str], ...] = ()  # (model_type, config class) for transformers
    vllm_config_registrations: tuple[tuple[str, str], ...] = ()  # (model_type, config class) for vLLM
    dynamic: bool = False  # a registration call whose arguments are not literals
    problem: str | None = None  # why the static scan could not follow it


@dataclass(frozen=True)
class ImportSummary(Record):
    """``report.facts["import_pass"]``: what the import pass (vLLM and the plugins loaded in a fresh
    process) found: vLLM's version, its timings, each plugin's load and each architecture's
    class; or why it did not complete (``error``)."""

    vllm_version: str | None = field(default=None, metadata=wire.rules(omit_none=True))
    timings: dict[str, float] = field(default_factory=dict)
    plugins: tuple[PluginLoad, ...] = ()
    classes: dict[str, ClassRecord] = field(default_factory=dict)
    error: str | None = field(default=None, metadata=wire.rules(omit_none=True, doc="why the pass did not complete"))


@dataclass(frozen=True)
class TensorMapping(Record):
    """``facts["weights"]["mapping"][tensor]``: where one checkpoint tensor went."""

    status: str = ""
    params: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    error: str | None = field(default=None, metadata=wire.rules(omit_none=True, doc="its first error"))
    looked_up: str | None = field(
        default=None, metadata=wire.rules(omit_none=True, doc="the name load_weights looked up for it")
    )


@dataclass(frozen=True)
class ParamMapping(Record):
    """``facts["weights"]["params"][name]``: one parameter of the model built on the meta device."""

    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    written: bool = False
    covered: int = field(default=0, metadata=_doc("elements the checkpoint wrote"))
    numel: int = 0
    sources: list[str] = field(default_factory=list)
    shards_expected: list[Any] | None = None
    shards_missing: list[Any] | None = None
    loader: Any = None
    in_returned: bool | None = None
    vllm_exempt: bool = False


@dataclass(frozen=True)
class WeightsBuilt(Record):
    """The model the weights pass built (its dtype, its HF config's sizes) and the pass's times."""

    model: Any = None
    timings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightsLoaded(Record):
    """What load_weights did with the checkpoint: per tensor and per parameter."""

    load_weights: Any = None
    mapping: dict[str, TensorMapping] = field(default_factory=dict)
    params: dict[str, ParamMapping] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightsReport(Record):
    """``report.facts["weights"]``: the checkpoint as read, the tensor-parallel size checked, and
    where the weights pass got: why it did not load (``load_error``), the model it built, the
    full tensor -> parameter mapping."""

    checkpoint: dict[str, Any] = field(default_factory=dict)
    tensor_parallel_size: int = 1
    load_error: str | None = field(default=None, metadata=wire.rules(omit_none=True))
    built: WeightsBuilt | None = field(default=None, metadata=wire.rules(inline=True, omit_none=True))
    loaded: WeightsLoaded | None = field(default=None, metadata=wire.rules(inline=True, omit_none=True))
    tracer_errors: list[Any] | None = field(default=None, metadata=wire.rules(omit_none=True))


# ---- the report's sections -----------------------------------------------------------------------

# the records the report's sections hold: (section, key) -> record. A Report keeps them as records
# from where they are built to report.json (Report.to_dict writes them; read_report reads them back)
SECTIONS: dict[tuple[str, str], type[Record]] = {
    ("facts", "engine"): EngineAnatomy,
    ("facts", "engine_diagnosis"): EngineAnatomy,
    ("facts", "import_pass"): ImportSummary,
    ("facts", "engine_mode"): ExecutionMode,
    ("facts", "perf"): PerfAnatomy,
    ("facts", "resolved"): ResolvedClass,
    ("facts", "weights"): WeightsReport,
    ("profiles", "engine"): EngineProfile,
    ("profiles", "workload"): WorkloadRun,
    ("profiles", "twin"): TwinAB,
}


# the sections that hold a list of records: (section, key) -> the record of each entry
LISTS: dict[tuple[str, str], type[Record]] = {
    ("facts", "plugins"): PluginFound,
}


def read_report(data: dict[str, Any]) -> Report:
    """A report from its JSON (report.json, ``check --json``), each section that has a record
    read into it (leniently: an older report's missing keys read as their defaults); an empty
    section (``{}``, null) stays as it is: the report has none."""
    readers = {where: _reader(record) for where, record in SECTIONS.items()}
    readers.update({where: _list_reader(record) for where, record in LISTS.items()})
    return Report.from_dict(data, readers)


def _reader(record: type[Record]) -> Callable[[Any], Any]:
    return lambda value: record.of(value) if value else value


def _list_reader(record: type[Record]) -> Callable[[Any], Any]:
    return lambda value: [record.of(v) for v in value] if isinstance(value, list) else value


def held(report: Report, section: str, key: str, record: type[R]) -> R | None:
    """The record of ``record``'s type that ``report``'s ``section`` ("facts" or "profiles")
    holds under ``key``; None where it holds none (no engine ran, an older report)."""
    value = (report.facts if section == "facts" else report.profiles).get(key)
    return value if isinstance(value, record) else None
