"""The A/B of a port against its in-tree twin: ``report.profiles["twin"]``, pure over two reports.

Both sides ran the same workload in the same mode through the same engine stage; this module
sets their ``profiles["engine"]`` side by side (:func:`compare_runs`):

* per phase: mean step time, forward time and tokens/s, and each side's roofline entry
  (achieved bandwidth and its share of the device's peak);
* per layer kind, per timed step, from the per-layer timings. What a kind holds depends on how
  each side was timed: a model vLLM runs uncompiled is timed per module (attention block, MLP,
  norms, embedding), a compiled one at its attention calls (the attention op; everything between
  two attention calls as one "dense" span). Only kinds that mean the same on both sides are
  compared; the others are listed in ``not_separable`` with the reason;
* the largest gap: the (phase, kind) where the port loses the most time over the workload
  (per-step excess x steps of that phase), with its ratio.

Ratios are port / twin for times (``step_ratio``, a kind's ``ratio``: above 1 the port is slower)
and twin / port for throughput (``throughput_ratio``: above 1 the twin is faster).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.analysis.records import (
    EngineProfile,
    QuantSummary,
    Record,
    TwinAB,
    TwinClocks,
    TwinExecution,
    TwinFlags,
    TwinGap,
    TwinKind,
    TwinKindPhase,
    TwinMatchInfo,
    TwinPhase,
    TwinQuant,
    TwinRoofline,
    TwinWorkload,
    WorkloadRun,
)
from vllm_doctor.analysis.roofline import fmt_rate
from vllm_doctor.facts.anatomy import CompileState
from vllm_doctor.units import fmt_s

BUCKETS = ("prefill", "decode")  # the per-layer profiler's buckets: prefill = prefill and mixed steps
TIMING_MODULES, TIMING_CALLS = "modules", "attention calls"

# the kinds compared, by how each side was timed: (kind, the profiler's kinds summed, what it holds)
KindTable = tuple[tuple[str, tuple[str, ...], str], ...]
KINDS_BOTH_MODULES: KindTable = (
    ("embedding", ("embedding",), "the token embedding"),
    ("attention", ("attention",), "the self-attention module: q/k/v and output projections, rotary, the attention op"),
    ("mlp", ("mlp",), "the MLP module"),
    ("router", ("router",), "an MoE block's router (its gate)"),
    ("experts", ("experts",), "an MoE block's experts: vLLM's fused-MoE op (top-k routing and the experts' GEMMs)"),
    ("norms", ("norm",), "every RMSNorm (per layer and the final one)"),
    ("other", ("other",), "forward time outside the timed modules (residual adds, glue)"),
    ("logits", ("logits",), "the logits processor (LM head)"),
)
KINDS_BOTH_CALLS: KindTable = (
    ("embedding", ("embedding",), "the embedding and layer 0's input norm, QKV projection and rotary"),
    ("attention", ("attention",), "the attention op and the KV-cache write"),
    ("dense", ("dense",), "between two attention ops: output projection, norms, MLP, next QKV and rotary"),
    ("other", ("other",), "forward time outside the timed spans"),
    ("logits", ("logits",), "the logits processor (LM head)"),
)
DECODER = ("embedding", "attention", "router", "experts", "mlp", "norm", "dense", "other")
KINDS_MIXED: KindTable = (
    ("decoder", DECODER, "the forward before the logits: embedding, every decoder layer, the final norm"),
    ("logits", ("logits",), "the logits processor (LM head)"),
)
LABELS = {
    "mlp": "MLP",
    "router": "MoE router",
    "experts": "MoE experts",
    "decoder": "decoder stack",
    "dense": "dense span (projections, norms, MLP or MoE experts)",
}


def fmt_ratio(ratio: float | None) -> str:
    """``2.40x``, ``76x``; ``n/a`` for None."""
    if ratio is None:
        return "n/a"
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2f}x"


def kind_label(kind: str | None) -> str:
    return LABELS.get(kind or "", kind or "step")


@dataclass(frozen=True)
class TwinSide(Record):
    """One side of the A/B: its engine profile, its workload and how vLLM ran it."""

    engine: EngineProfile = field(default_factory=EngineProfile)
    workload: WorkloadRun = field(default_factory=WorkloadRun)
    compile: CompileState | None = None


def timing_of(engine: EngineProfile) -> str | None:
    """How a side's layers were timed: per module (eager), at the attention calls (torch.compile or
    CUDA graphs: no Python runs between them), or
    None (no per-layer timing)."""
    modules = engine.layers.modules
    if not modules:
        return None
    return TIMING_CALLS if any(m.kind == "dense" for m in modules) else TIMING_MODULES


def _bucket_of(phase: str) -> str:
    return "decode" if phase == "decode" else "prefill"


def per_step_kinds(engine: EngineProfile) -> dict[str, dict[str, float]]:
    """Per bucket: the profiler's kinds in seconds per step timed per layer (``other``: the
    forward of those steps outside every kind). Empty where nothing was timed per layer."""
    return kinds_and_scales(engine)[0]


def kinds_and_scales(engine: EngineProfile) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """:func:`per_step_kinds`, and per bucket the factor by which the kinds inside the forward
    summed past the forward of the same steps (only where they did). Eager mode times the
    modules inside a layer on detailed steps only, each behind two of the doctor's marks: their
    spans can add up to more than the forward they ran in (the marks' cost, which the per-mark
    estimate does not take out in full). The forward is the clock's reading of the whole, so the
    kinds are scaled down to it: no part is compared at more than the whole it is part of."""
    modules = engine.layers.modules
    out: dict[str, dict[str, float]] = {}
    scales: dict[str, float] = {}
    for bucket in BUCKETS:
        timed = [s for s in engine.steps if s.layers_timed and _bucket_of(s.phase) == bucket]
        n = len(timed) or max((m.bucket_calls(bucket) for m in modules if m.kind == "layer"), default=0)
        if not n:
            continue
        per_step: dict[str, float] = {}
        for m in modules:
            kind = m.kind
            if kind in ("layer", "model", None):
                continue
            # a module's mean over its own steps (eager's inner modules: the detailed ones only)
            own = m.bucket_steps(bucket) or n
            per_step[kind] = per_step.get(kind, 0.0) + m.bucket_s(bucket) / own
        forward = [float(s.forward_s) for s in timed if s.forward_s is not None]
        if forward:
            inside = sum(v for k, v in per_step.items() if k != "logits")
            cost = next((c for c in engine.layers.doctor_cost if c.bucket == bucket), None)
            # the forward less the doctor's estimated cost in it (eager mode), like the kinds
            mean = (sum(forward) - (cost.in_forwards_s if cost else 0.0)) / len(forward)
            if mean > 0 and inside > mean * (1 + 1e-6):
                scales[bucket] = inside / mean
                per_step = {k: (v if k == "logits" else v * mean / inside) for k, v in per_step.items()}
                per_step["other"] = 0.0
            else:
                rest = mean - inside
                # a residue of float rounding (the spans tile the forward in compiled modes) is no time
                per_step["other"] = rest if rest > 1e-6 * mean else 0.0
        out[bucket] = per_step
    return out, scales


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (a > 0 and b > 0) or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return a / b


def kind_table(port: EngineProfile, twin: EngineProfile) -> tuple[dict[str, TwinKind], list[str], str, list[str]]:
    """The kinds both sides can be compared on, the kinds they cannot (with why), the basis, and
    the sides whose kinds were scaled to their forward (:func:`kinds_and_scales`)."""
    tp, tt = timing_of(port), timing_of(twin)
    rotary = "rotary: timed inside the attention on both sides (the profiler has no rotary span)"
    if tp is None or tt is None:
        side = " and ".join(n for n, t in (("the port", tp), ("the twin", tt)) if t is None)
        return {}, [f"every kind: no per-layer timing on {side} (per-layer timing off)"], "none", []
    if tp == tt == TIMING_MODULES:
        table, not_sep = KINDS_BOTH_MODULES, [rotary]
        basis = "both timed per module (run eagerly)"
    elif tp == tt == TIMING_CALLS:
        table = KINDS_BOTH_CALLS
        not_sep = [
            "mlp, norms: inside the span between two attention ops on both sides (kind dense; an MoE's router "
            "and experts too: vLLM's fused-MoE op splits no graph)",
            "rotary: inside the span before each attention op on both sides",
        ]
        basis = "both timed at their attention calls (torch.compile or CUDA graphs)"
    else:
        table = KINDS_MIXED
        how = {
            TIMING_MODULES: "per module (run eagerly)",
            TIMING_CALLS: "at its attention calls (torch.compile or CUDA graphs)",
        }
        not_sep = [
            f"attention, mlp, norms, rotary, embedding: the port is timed {how[tp]}, the twin {how[tt]}; "
            "only the whole decoder and the logits mean the same on both sides"
        ]
        basis = f"port timed {how[tp]}, twin {how[tt]}"
    (pk, port_scales), (tk, twin_scales) = kinds_and_scales(port), kinds_and_scales(twin)
    scaled = [
        f"{side} {bucket}: its modules' spans summed to {factor:.2f}x its forward on the same steps (the doctor's "
        "marks around each module, run eagerly); its kinds are scaled to that forward, the whole they are part of"
        for side, scales in (("port", port_scales), ("twin", twin_scales))
        for bucket, factor in scales.items()
    ]
    port_steps = _timed_steps(port)
    twin_steps = _timed_steps(twin)
    kinds: dict[str, TwinKind] = {}
    for kind, parts, covers in table:
        phases: dict[str, TwinKindPhase] = {}
        totals = {"port": 0.0, "twin": 0.0}
        for bucket in BUCKETS:
            if bucket not in pk or bucket not in tk:
                continue
            ps = sum(pk[bucket].get(p, 0.0) for p in parts)
            ts = sum(tk[bucket].get(p, 0.0) for p in parts)
            if ps <= 0 and ts <= 0:
                continue
            phases[bucket] = TwinKindPhase(port_s=ps, twin_s=ts, ratio=_ratio(ps, ts))
            totals["port"] += ps * port_steps.get(bucket, 0)
            totals["twin"] += ts * twin_steps.get(bucket, 0)
        if not phases:
            continue
        n_port = sum(port_steps.get(b, 0) for b in phases) or 1
        n_twin = sum(twin_steps.get(b, 0) for b in phases) or 1
        port_s, twin_s = totals["port"] / n_port, totals["twin"] / n_twin
        kinds[kind] = TwinKind(covers=covers, phases=phases, port_s=port_s, twin_s=twin_s, ratio=_ratio(port_s, twin_s))
    return kinds, not_sep, basis, scaled


def _timed_steps(engine: EngineProfile) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in engine.steps:
        if s.layers_timed:
            b = _bucket_of(s.phase)
            out[b] = out.get(b, 0) + 1
    return out


def roofline_entry(engine: EngineProfile, phase: str) -> TwinRoofline | None:
    """A side's roofline of one phase, as the A/B carries it (rate, share of peak, the peak)."""
    roof = engine.roofline
    entry = roof.phases.get(phase) if roof is not None else None
    if roof is None or not roof.available or entry is None:
        return None
    return TwinRoofline(
        bytes_per_s=entry.bytes_per_s,
        bandwidth_share=entry.bandwidth_share,
        peak_bytes_s=roof.device.bandwidth_bytes_s,
        flops_per_s=entry.flops_per_s,
        compute_share=entry.compute_share,
        above_peak=entry.above_peak,
    )


def _compiled(compile_state: CompileState | None) -> bool | None:
    """Did vLLM torch.compile the model (a module with ``@support_torch_compile``)?"""
    if compile_state is None:
        return None
    return bool(compile_state.compiled_modules)


def _cuda_graphs(compile_state: CompileState | None) -> bool | None:
    """Did vLLM capture CUDA graphs (it does for an uncompiled model too: FULL graphs)?"""
    if compile_state is None:
        return None
    return bool(compile_state.cudagraphs)


def phase_table(port: EngineProfile, twin: EngineProfile) -> dict[str, TwinPhase]:
    out: dict[str, TwinPhase] = {}
    for phase in ("prefill", "decode", "mixed"):
        a, b = port.phases.get(phase), twin.phases.get(phase)
        if a is None or b is None or not a.steps or not b.steps:
            continue
        out[phase] = TwinPhase(
            port_steps=a.steps,
            twin_steps=b.steps,
            port_step_s=a.step_s_mean,
            twin_step_s=b.step_s_mean,
            step_ratio=_ratio(a.step_s_mean, b.step_s_mean),
            port_forward_s=a.forward_s_mean,
            twin_forward_s=b.forward_s_mean,
            forward_ratio=_ratio(a.forward_s_mean, b.forward_s_mean),
            port_forward_steps_step_s=a.forward_steps_step_s_mean,
            twin_forward_steps_step_s=b.forward_steps_step_s_mean,
            port_tok_s=a.tokens_per_s,
            twin_tok_s=b.tokens_per_s,
            throughput_ratio=_ratio(b.tokens_per_s, a.tokens_per_s),
            port_roofline=roofline_entry(port, phase),
            twin_roofline=roofline_entry(twin, phase),
        )
    return out


def largest_gap(phases: Mapping[str, TwinPhase], kinds: Mapping[str, TwinKind], architecture: str) -> TwinGap:
    """Where the port loses the most time against the twin over the workload: per (phase, kind)
    the per-step excess times the port's steps of that phase; the phases' step times where no
    kind compares."""
    steps = {b: 0 for b in BUCKETS}
    for phase, p in phases.items():
        steps[_bucket_of(phase)] += int(p.port_steps or 0)
    # (excess over the workload, phase, kind, port s, twin s, steps)
    candidates: list[tuple[float, str, str | None, float, float, int]] = []
    for kind, entry in kinds.items():
        for bucket, e in entry.phases.items():
            if e.ratio is not None:
                n = steps.get(bucket, 0)
                candidates.append(((e.port_s - e.twin_s) * n, bucket, kind, e.port_s, e.twin_s, n))
    if not candidates:
        for phase, p in phases.items():
            if p.step_ratio is not None and p.port_step_s is not None and p.twin_step_s is not None:
                n = int(p.port_steps or 0)
                candidates.append(((p.port_step_s - p.twin_step_s) * n, phase, None, p.port_step_s, p.twin_step_s, n))
    who = f"vLLM's {architecture}"
    if not candidates:
        return TwinGap(text=f"nothing to compare with {who} (no phase ran on both)")
    excess, where, gap_kind, port_s, twin_s, n = max(candidates, key=lambda c: c[0])
    ratio = port_s / twin_s
    if excess <= 0:
        text = f"no gap: the port is as fast as {who} or faster in every phase and kind compared"
    else:
        text = (
            f"{where} {kind_label(gap_kind)} {fmt_ratio(ratio)} slower than {who} ({fmt_s(port_s)} vs "
            f"{fmt_s(twin_s)} per step; about {fmt_s(excess)} over the workload's {n} {where} step(s))"
        )
    return TwinGap(phase=where, kind=gap_kind, ratio=ratio, port_s=port_s, twin_s=twin_s, excess_s=excess, text=text)


def compare_runs(
    port: TwinSide | Mapping[str, Any],
    twin: TwinSide | Mapping[str, Any],
    architecture: str,
    match: TwinMatchInfo | Mapping[str, Any],
) -> TwinAB:
    """``profiles["twin"]`` from the two runs (each side a :class:`TwinSide`, or its JSON:
    ``{"engine": profiles["engine"], "workload": profiles["workload"], "compile":
    facts["engine"]["compile"]}``); ``match``: how the twin was found (``how``, ``weights``,
    ``notes``)."""
    ps, ts = TwinSide.of(port), TwinSide.of(twin)
    pe, te = ps.engine, ts.engine
    phases = phase_table(pe, te)
    kinds, not_separable, basis, scaled = kind_table(pe, te)
    port_tok, twin_tok = ps.workload.output_tokens_per_s, ts.workload.output_tokens_per_s
    return TwinAB(
        architecture=architecture,
        match=TwinMatchInfo.of(match),
        compiled=TwinFlags(port=_compiled(ps.compile), twin=_compiled(ts.compile)),
        cuda_graphs=TwinFlags(port=_cuda_graphs(ps.compile), twin=_cuda_graphs(ts.compile)),
        execution=TwinExecution(port=ps.compile, twin=ts.compile),
        clock=TwinClocks(port=pe.clock, twin=te.clock),
        workload=TwinWorkload(
            prompts=ps.workload.prompts, input_len=ps.workload.input_len, output_len=ps.workload.output_len
        ),
        port_tok_s=port_tok,
        twin_tok_s=twin_tok,
        throughput_ratio=_ratio(twin_tok, port_tok),
        phases=phases,
        kinds=kinds,
        kinds_basis=basis,
        kinds_per="second per step timed per layer (the first steps of each phase, then every n-th); "
        "prefill holds prefill and mixed steps",
        not_separable=not_separable,
        kinds_scaled=scaled,
        largest_gap=largest_gap(phases, kinds, architecture),
        quantization=quantization_sides(pe, te),
    )


def quantization_sides(port: EngineProfile, twin: EngineProfile) -> TwinQuant | None:
    """Each side's quantization line: the twin gets the port's ``quantization_config``, so both should
    run the same methods with the same weight storage (None when neither side is quantized)."""
    p, t = port.quantization, twin.quantization
    if p is None and t is None:
        return None

    def kinds(s: QuantSummary | None) -> list[tuple[str, str | None, int]]:
        return sorted((g.method, g.weight_dtype, g.layers) for g in s.groups) if s is not None else []

    return TwinQuant(
        port=p.text if p is not None else None,
        twin=t.text if t is not None else None,
        same=p is not None and t is not None and p.method == t.method and kinds(p) == kinds(t),
    )


def roofline_text(phase: str, entry: TwinPhase) -> str:
    """``port: decode 23 % of 4.81 TB/s; twin: 41 %`` (on a device with a known peak), else the rates."""
    port, twin = entry.port_roofline, entry.twin_roofline
    if port is None and twin is None:
        return ""

    def side(e: TwinRoofline | None) -> str:
        if e is None:
            return "n/a"
        if e.above_peak:
            return f"{fmt_rate(e.bytes_per_s)} (ABOVE the peak: a doctor bug)"
        share = e.bandwidth_share
        return f"{100 * share:.0f} %" if share is not None else fmt_rate(e.bytes_per_s)

    peak = (port.peak_bytes_s if port is not None else None) or (twin.peak_bytes_s if twin is not None else None)
    if peak and port is not None and port.bandwidth_share is not None:
        return f"port: {phase} {side(port)} of {fmt_rate(peak)}; twin: {side(twin)}"
    return f"port: {phase} {side(port)}; twin: {side(twin)} (peak unknown)"
