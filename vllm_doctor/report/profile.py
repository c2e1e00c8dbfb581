"""Terminal rendering of the engine stage: anatomy, memory, per-step and per-layer summary.

Each function takes the record (:mod:`vllm_doctor.analysis.records`), as a Report holds it (a
report.json read back with ``read_report``: an older report's missing keys read as defaults).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_doctor.analysis.engine import MIN_MARK_READINGS
from vllm_doctor.analysis.records import (
    MIN_STEPS_TO_TELL,
    CompileState,
    DoctorOverhead,
    EncoderCacheUse,
    EngineAnatomy,
    EngineProfile,
    KvGroupSummary,
    KvSummary,
    LayerTables,
    LayerTotal,
    PhaseSummary,
    TimeAccounting,
    TwinAB,
    WorkloadRun,
)
from vllm_doctor.analysis.roofline import KV_NOTES, fmt_rate, fmt_si_bytes, phase_text
from vllm_doctor.analysis.twin_compare import fmt_ratio, kind_label, roofline_text
from vllm_doctor.model import Report
from vllm_doctor.units import clock_name, fmt_bytes, fmt_s


def _short(qualname: Any) -> str:
    return str(qualname).rsplit(".", 1)[-1] if qualname else "?"


def answered_anatomy(report: Report) -> EngineAnatomy | None:
    """The engine's anatomy where its workers answered (None: no engine ran, or none answered)."""
    anatomy = report.facts.get("engine")
    return anatomy if isinstance(anatomy, EngineAnatomy) and anatomy.workers else None


def render_anatomy(a: EngineAnatomy | None) -> str:
    """Which process holds what, the model's origin and the KV layout."""
    if a is None:
        return "engine anatomy: unavailable (the engine did not start)"
    fe, ex, model, kv, runner, comp = a.front_end, a.executor, a.model, a.kv_cache, a.model_runner, a.compile
    lines = ["engine anatomy"]
    if fe.url:
        version = f" (vLLM {fe.server_version})" if fe.server_version else ""
        lines.append(f"  front end     API server at {fe.url}{version}, serving {', '.join(fe.served_models or ['?'])}")
    else:
        lines.append(f"  front end     pid {fe.pid}: {_short(fe.llm_class)} -> {_short(fe.core_client_class)}")
    if fe.engine_core_in_process:
        lines.append(f"  engine core   pid {fe.pid} (in the front end's process)")
    else:
        lines.append(f"  engine core   pid {', '.join(str(p) for p in fe.engine_core_pids) or '?'} (own process)")
    lines.append(f"  executor      {ex.backend or '?'}" + (f" ({_short(ex.class_name)})" if ex.class_name else ""))
    for w in a.workers:
        lines.append(
            f"  worker {w.rank}      pid {w.pid} (parent {w.ppid}), local rank {w.local_rank}, "
            f"device {w.device}: {_short(w.worker_class)} / {_short(w.model_runner_class)}"
        )
    lines.append(f"  model runner  {runner.class_name} ({runner.kind})")
    lines.append(f"  model         {model.class_name} [{model.origin}]" + (f" from {model.file}" if model.file else ""))
    if comp is not None:
        if comp.eager:
            how = "eager"
        elif comp.compiled and not comp.compiled_modules:
            how = "uncompiled (no class of the model has @support_torch_compile; VD603)"
        else:
            how = "compiled"
        lines.append(
            f"  execution     {how} (torch.compile mode {comp.compilation_mode}, CUDA graphs {comp.cudagraph_mode})"
        )
    if kv.num_blocks is not None:
        lines.append(
            f"  KV cache      {kv.num_layers} layer tensor(s) in {kv.num_storages} storage(s), "
            f"{fmt_bytes(kv.storage_bytes)}; {kv.num_blocks} blocks x {kv.block_size} tokens; "
            f"layout {kv.layout or 'not exposed'}; shape {kv.tensor_shape} {kv.dtype}"
        )
        if (capacity := kv_capacity_text(kv)) is not None:
            lines.append(f"  KV capacity   {capacity}")
        for text, n in _runs(kv_group_text(g) for g in kv.groups):
            lines.append(f"                {'group' if n == 1 else f'{n} groups, each'}: {text}")
        if kv.shared_layers:
            lines.append(f"  KV sharing    {kv_sharing_text(kv.shared_layers)}")
    return "\n".join(lines)


def kv_sharing_text(shared: dict[str, str]) -> str:
    """``2 layer(s) read another layer's cache by design (model.layers.2.self_attn.attn reads
    model.layers.0.self_attn.attn, ...): counted in their target's group, no storage of their own``."""
    pairs = [f"{a} reads {b}" for a, b in shared.items()]
    shown = ", ".join(pairs[:2]) + (f", ... ({len(pairs) - 2} more)" if len(pairs) > 2 else "")
    return (
        f"{len(shared)} layer(s) read another layer's cache by design ({shown}): vLLM counts each in its target's "
        "group and gives it no storage of its own"
    )


def untimed_mixers_text(layers: LayerTables) -> str:
    """``3 of 4 token mixers (model.layers.0.linear_attn, ...) ran no call the doctor times in
    compiled mode: ...``."""
    names = layers.untimed_mixers
    shown = ", ".join(names[:3]) + (f", ... ({len(names) - 3} more)" if len(names) > 3 else "")
    return (
        f"{len(names)} of {layers.mixers} token mixer(s) ({shown}) ran no call the doctor times in compiled mode "
        "(vLLM ran them through an op that is no graph split, or a method the doctor does not wrap): their time is "
        "in the spans around them; eager mode (--eager) times each mixer module"
    )


def _runs(texts: Iterable[str]) -> list[tuple[str, int]]:
    """Consecutive equal texts as (text, how many): vLLM splits 24 Mamba layers into 6 like groups."""
    out: list[tuple[str, int]] = []
    for text in texts:
        if out and out[-1][0] == text:
            out[-1] = (text, out[-1][1] + 1)
        else:
            out.append((text, 1))
    return out


def kv_capacity_text(kv: KvSummary) -> str | None:
    """vLLM's own capacity, as its start-up log says it: ``578,524 tokens, 35.31 requests of
    max_model_len 16,384 at once (vLLM's figure)``; None where vLLM did not say."""
    if kv.capacity_tokens is None:
        return None
    text = f"{kv.capacity_tokens:,} tokens"
    if kv.max_concurrency is not None:
        at = f" of max_model_len {kv.max_model_len:,}" if kv.max_model_len else ""
        text += f", {kv.max_concurrency:.2f} requests{at} at once"
    return text + " (vLLM's own figure)"


def kv_group_text(g: KvGroupSummary) -> str:
    """One KV-cache group: ``2 layer(s), sliding (SlidingWindowSpec, window 64), 2 KV heads x 64,
    torch.bfloat16`` or a state group's shapes and page: ``1 layer(s), mamba (MambaSpec, mamba2),
    states [[4, 288], [8, 32, 16]] torch.bfloat16, page 65,536 B (47,424 B of it padding ...)``."""
    spec = g.spec
    kind = spec.kind or spec.type or "?"
    detail = [spec.type or "?"]
    if spec.sliding_window:
        detail.append(f"window {spec.sliding_window}")
    if spec.attention_chunk_size:
        detail.append(f"chunk {spec.attention_chunk_size}")
    if spec.mamba_type:
        detail.append(spec.mamba_type)
    head = f"{g.layers} layer(s), {kind} ({', '.join(detail)})"
    if spec.shapes:
        dtypes = sorted(set(spec.dtypes))
        text = f"{head}, states {spec.shapes} {'/'.join(dtypes) or '?'}"
        if spec.mamba_cache_mode:
            text += f", cache mode {spec.mamba_cache_mode}"
    elif spec.kind == "mla":
        text = f"{head}, one latent head x {spec.head_size}, {spec.dtype}"
    else:
        text = f"{head}, {spec.num_kv_heads} KV heads x {spec.head_size}, {spec.dtype}"
    if spec.page_size_bytes is not None:
        text += f", page {spec.page_size_bytes:,} B"
        if spec.padding_bytes:
            share = spec.padding_bytes / spec.page_size_bytes
            text += f" ({spec.padding_bytes:,} B of it padding vLLM added to match the other groups' pages: "
            text += f"{share:.1%})" if share < 0.01 else f"{share:.0%})"
    return text


def forward_text(p: PhaseSummary | None) -> str:
    """A phase's mean forward beside the mean step time of the same steps: ``156.85 ms of
    195.55 ms steps (80%)``; the forward alone where an older report has no such step time."""
    if p is None or p.forward_s_mean is None:
        return "n/a"
    if p.forward_steps_step_s_mean is None:
        share = f" ({100 * p.forward_share:.0f}% of its steps)" if p.forward_share is not None else ""
        return fmt_s(p.forward_s_mean) + share
    share = f" ({100 * p.forward_share:.0f}%)" if p.forward_share is not None else ""
    return f"{fmt_s(p.forward_s_mean)} of {fmt_s(p.forward_steps_step_s_mean)} steps{share}"


def forward_step(p: PhaseSummary | None) -> str:
    """``12.30 ms / 15.10 ms``: the mean forward and the mean step time of the same steps (the
    forward alone where an older report has no such step time)."""
    if p is None or p.forward_s_mean is None:
        return "n/a"
    if p.forward_steps_step_s_mean is None:
        return fmt_s(p.forward_s_mean)
    return f"{fmt_s(p.forward_s_mean)} / {fmt_s(p.forward_steps_step_s_mean)}"


def step_clock_text(phase: str, p: PhaseSummary, clock: str | None) -> str:
    """Which of a phase's steps are on the step clock, where not all are (the sampled step clock on
    a GPU), e.g. ``decode: device clock (CUDA events) on 92 of 700 steps (46 sampled, 46 unsampled
    (the step after a sample, every 32nd step, a window's first): the mean counts the other 608 at
    those 46's); host spans on 608 (1.21 ms mean: enqueue time under async scheduling, not the
    device's)``; '' where every step is on it."""
    if p.clock_steps is None or not p.host_steps:
        return ""
    sampled = p.clock_steps - p.clock_untimed_steps
    unsampled = p.steps - sampled
    if p.clock_untimed_steps:  # (every 32nd: constants.STEP_CLOCK_STRIDE)
        how = (
            f"{sampled} sampled, {p.clock_untimed_steps} unsampled "
            "(the step after a sample, every 32nd step, a window's first): "
            f"the mean counts the other {unsampled - p.clock_untimed_steps} at those {p.clock_untimed_steps}'s"
        )
    else:
        how = f"{sampled} sampled: the mean counts every step at theirs"
    return (
        f"{phase}: {clock_name(clock)} on {p.clock_steps} of {p.steps} steps ({how}); host spans on {p.host_steps} "
        f"({fmt_s(p.host_step_s_mean)} mean: enqueue time under async scheduling, not the device's)"
    )


def timing_cost_text(phase: str, p: PhaseSummary) -> str:
    """The steps timed per layer against the others of one phase, on the step clock, e.g.
    ``decode: steps timed per layer 17.60 ms median vs 13.90 ms untimed (+27 %, the doctor's
    per-layer timing)``; '' where the phase lacks either kind of step."""
    if p.too_few_to_tell:
        return (
            f"{phase}: {p.timed_steps} step(s) timed per layer, {p.untimed_steps} not: too few steps to tell what "
            f"the per-layer timing costs (a percentage needs {MIN_STEPS_TO_TELL} of each)"
        )
    cost = p.timing_cost
    if cost is None or p.timed_step_s_median is None or p.untimed_step_s_median is None:
        return ""
    text = (
        f"{phase}: steps timed per layer {fmt_s(p.timed_step_s_median)} median vs "
        f"{fmt_s(p.untimed_step_s_median)} untimed ({100 * cost:+.0f} %)"
    )
    if p.timed_vs_neighbours is None:
        if p.neighbour_pairs:
            return text + (
                f", the doctor's per-layer timing and the run's drift ({p.neighbour_pairs} timed step(s) next to an "
                "untimed one: too few to tell them apart)"
            )
        return text + ", the doctor's per-layer timing and the run's drift"
    text += f"; against their untimed neighbours {100 * p.timed_vs_neighbours:+.1f} % ({p.neighbour_pairs} step(s)"
    if p.detail_vs_neighbours is not None:
        text += f"; those also timed inside their layers {100 * p.detail_vs_neighbours:+.1f} %"
    return text + "): the doctor's per-layer timing"


def images_text(w: WorkloadRun) -> str:
    """`` + 1 image (336x336)`` for a multimodal workload; '' for text prompts."""
    if not w.images_per_prompt:
        return ""
    size = f" ({w.image_size[0]}x{w.image_size[1]})" if w.image_size and len(w.image_size) == 2 else ""
    return f" + {w.images_per_prompt} image{'s' if w.images_per_prompt > 1 else ''}{size}"


def encoder_cache_text(use: EncoderCacheUse, workload: WorkloadRun | None) -> str:
    """The encoder's items and the runner's encoder cache at its fullest, e.g. ``64 image(s)
    encoded in 5 call(s) (36,864 embedding rows, each fed image once); cache at most 24 item(s),
    13,824 of 16,384 rows (84%), 108.00 MiB``."""
    fed = (workload.prompts or 0) * (workload.images_per_prompt or 0) if workload is not None else 0
    reuse = ""
    if fed and use.items == fed:
        reuse = ", each fed image once"
    elif fed and use.items < fed:
        reuse = f", {fed - use.items} of {fed} fed images from the cache (the same image again)"
    elif fed:
        reuse = f" for {fed} fed images (some encoded again: a preempted request's)"
    budget = ""
    if use.budget_rows:
        budget = f" of {use.budget_rows:,} rows ({100 * use.peak_rows / use.budget_rows:.0f}%, {use.budget_source})"
    else:
        budget = " rows"
    return (
        f"{use.items} item(s) encoded in {use.calls} call(s) ({use.rows:,} embedding rows{reuse}); "
        f"cache at most {use.peak_entries} item(s), {use.peak_rows:,}{budget}, {fmt_bytes(use.peak_bytes)}"
    )


def encoder_text(phase: str, p: PhaseSummary) -> str:
    """A multimodal model's encoder in one phase, e.g. ``prefill: 29.07 ms in 1 step(s) = 27 %
    of those steps (embed_multimodal: vision tower and projector); the decoder's forward and the
    rest 77.26 ms``; '' where the phase ran no encoder."""
    if not p.encoder_steps or p.encoder_s is None or not p.encoder_step_s:
        return ""
    return (
        f"{phase}: {fmt_s(p.encoder_s)} in {p.encoder_steps} step(s) = {100 * p.encoder_s / p.encoder_step_s:.0f} % "
        f"of those steps (embed_multimodal: the vision tower and projector); the decoder and the rest "
        f"{fmt_s(p.encoder_step_s - p.encoder_s)}"
    )


def marks_cost_text(layers: LayerTables) -> str:
    """Eager mode's per-layer figures less the doctor's timing marks, in words, e.g. ``per-layer
    figures less the doctor's timing marks: decode 11.2 us per mark at the layers' boundaries (38
    marks; 22 step(s)), 6.1 us per mark on a detailed step (328 marks; 9 step(s)) against their
    untimed neighbours, 41.2 ms taken out; prefill as measured (...)``; '' outside eager mode."""
    parts = []
    for c in layers.doctor_cost:
        if not c.measured:
            near = c.pairs + c.detail_pairs
            why = (
                "no timed step next to an untimed one"
                if not near
                else f"{near} timed step(s) next to an untimed one: too few to estimate a mark's cost, "
                f"{MIN_MARK_READINGS} of one grain needed"
            )
            parts.append(f"{c.bucket} as measured ({why})")
            continue
        grains = []
        for label, per, pairs, marks in (
            ("at the layers' boundaries", c.per_mark_s, c.pairs, c.boundary_marks),
            ("on a detailed step", c.detail_per_mark_s, c.detail_pairs, c.detail_marks),
        ):
            if per is not None:
                grains.append(f"{fmt_s(per)} per mark {label} ({marks} marks; {pairs} step(s))")
        parts.append(
            f"{c.bucket} {', '.join(grains)} against their untimed neighbours, {fmt_s(c.corrected_s)} taken out"
        )
    return "per-layer figures less the doctor's timing marks: " + "; ".join(parts) if parts else ""


def render_profile(profile: EngineProfile | None, workload: WorkloadRun | None = None) -> str:
    """The engine profile in words: the workload, the time accounting, each phase's steps and
    forward, the doctor's cost, the roofline and the ranks."""
    prof = profile or EngineProfile()
    if not prof.steps:
        return "forward profile: no steps recorded"
    lines = [f"forward profile: times on the {clock_name(prof.clock)}, per-layer {'on' if prof.layers_on else 'off'}"]
    if prof.layers_reason:
        lines.append(f"  {prof.layers_reason}")
    if workload is not None:
        w = workload
        lines.append(
            f"  workload      {w.prompts} prompt(s) x {w.input_len} in{images_text(w)} / {w.output_len} out: "
            f"{w.generated_tokens} tokens in {fmt_s(w.wall_s)} ({w.output_tokens_per_s} tok/s)"
        )
    if prof.time_accounting is not None:
        lines.append(f"  time          {accounting_text(prof.time_accounting)}")
    for phase, p in prof.phases.items():
        lines.append(
            f"  {phase:<8}      {p.steps} step(s), {p.tokens} tokens, batch {p.mean_batch}, step "
            f"{fmt_s(p.step_s_mean)} mean (p90 {fmt_s(p.step_s_p90)}), forward {forward_text(p)}"
        )
    for phase, p in prof.phases.items():
        on_clock = step_clock_text(phase, p, prof.clock)
        if on_clock:
            lines.append(f"  step clock    {on_clock}")
    for phase, p in prof.phases.items():
        encoder = encoder_text(phase, p)
        if encoder:
            lines.append(f"  encoder       {encoder}")
    if prof.encoder_cache is not None:
        lines.append(f"  encoder cache {encoder_cache_text(prof.encoder_cache, workload)}")
    for phase, p in prof.phases.items():
        cost = timing_cost_text(phase, p)
        if cost:
            lines.append(f"  timing cost   {cost}")
    layers = prof.layers
    kinds = layers.by_kind
    total = sum(kinds.values())
    if total:
        sampled = f" (per-layer timings of {layers.timed_steps} of {len(prof.steps)} steps)"
        lines.append("  by kind       " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in kinds.items()) + sampled)
        if layers.untimed_mixers:
            lines.append(f"  not timed     {untimed_mixers_text(layers)}")
    marks = marks_cost_text(layers)
    if marks:
        lines.append(f"  per layer     {marks}")
    cost = doctor_cost_text(prof.doctor_overhead)
    if cost:
        lines.append(f"  doctor cost   {cost}")
    if prof.kv_usage:
        peak = max(prof.kv_usage, key=lambda u: u.usage)
        lines.append(f"  KV usage      peak {peak.blocks} of {prof.kv_num_blocks} blocks ({100 * peak.usage:.2g}%)")
    for m in prof.memory:
        parts = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in m.parts.items())
        lines.append(f"  memory (rank {m.rank}) {parts} of {fmt_bytes(m.total)} ({m.total_source})")
    if prof.quantization is not None and prof.quantization.text:
        lines.append(f"  quantization  {prof.quantization.text}")
    roofline = render_roofline(prof)
    if roofline:
        lines.append(roofline)
    lines.extend(render_ranks(prof))
    return "\n".join(lines)


def accounting_text(a: TimeAccounting) -> str:
    """:func:`vllm_doctor.analysis.engine.time_accounting` in words."""
    clock = clock_name(a.clock).split(" (")[0]
    head = (
        f"steps add up to {fmt_s(a.steps_s)} on the {clock} = "
        f"{100 * a.share:.0f}% of the workload's {fmt_s(a.wall_s)} wall time"
    )
    if a.above_wall:
        return head + ": DOCTOR BUG, one engine's steps cannot take longer than the workload (the step clock is wrong)"
    between = a.between_steps_s
    if between is None:
        return head + (
            f"; {fmt_s(a.outside_steps_s)} ran outside any step (scheduling, output processing: the engine's host)"
        )
    idle = "the device stood idle " if a.clock == "cuda_events" else ""  # on CPU the host is the device
    text = (
        f"; between steps {idle}{fmt_s(between)} ({100 * between / a.wall_s:.0f}%, "
        f"{fmt_s(a.between_steps_mean_s)} a step on the {clock}: the engine's scheduling and output "
        f"processing on the host), "
    )
    if a.measured_share is None or a.before_first_s is None or a.after_last_s is None:
        return head + text + f"{fmt_s(a.edges_s)} before the first step and after the last (requests in, outputs out)"
    rest = a.wall_s * (1 - a.measured_share)
    left = ""
    if abs(rest) > 0.005 * a.wall_s:  # the device clock and the host's disagree, or time in none of them
        why = "counted twice: the step clock runs ahead of the host" if rest < 0 else "in none of them"
        left = f" ({fmt_s(abs(rest))} {why})"
    return (
        head
        + text
        + (
            f"{fmt_s(a.before_first_s)} before the first step (requests in: tokenizing, a multimodal processor) and "
            f"{fmt_s(a.after_last_s)} after the last (outputs out), each measured on the host's clock: "
            f"{100 * a.measured_share:.1f}% of the wall time accounted for{left}"
        )
    )


def slowest_layer(by_layer: list[LayerTotal]) -> LayerTotal | None:
    return max(by_layer, key=lambda x: x.total_s, default=None)


def render_ranks(prof: EngineProfile) -> list[str]:
    """Per-rank lines of a multi-rank profile, side by side, and the imbalance between ranks:
    each rank's forward beside the step time of the same steps."""
    if len(prof.per_rank) < 2:
        return []
    lines = [
        "  per rank      rank  tp  pp  device    prefill fwd / step     decode fwd / step      slowest layer"
        "      KV storage"
    ]
    for r in prof.per_rank:
        slowest = slowest_layer(r.by_layer)
        slow_text = f"layer {slowest.layer} {fmt_s(slowest.total_s)}" if slowest else "n/a"
        lines.append(
            f"                {r.rank!s:>4}  {r.tp_rank!s:>2}  {r.pp_rank!s:>2}  "
            f"{r.device!s:<8}  {forward_step(r.phases.get('prefill')):>21}  "
            f"{forward_step(r.phases.get('decode')):>21}  {slow_text:<17}  "
            f"{fmt_bytes(r.kv_storage_bytes)}"
        )
    for phase, imb in prof.rank_imbalance.items():
        ratio = f"{imb.ratio:.2f}x" if imb.ratio else "n/a"
        lines.append(
            f"  imbalance     {phase}: rank {imb.slowest_rank} is the slowest ({fmt_s(imb.slowest_s)}), "
            f"rank {imb.fastest_rank} the fastest ({fmt_s(imb.fastest_s)}): {ratio}; the slowest rank sets "
            "the step"
        )
    return lines


def doctor_cost_text(over: DoctorOverhead | None) -> str:
    """``analysis.engine.doctor_overhead`` in words: per step, and of the worker's wall time."""
    o = over or DoctorOverhead()
    if o.share is None or not o.steps:
        return ""
    parts = ", ".join(f"{k.replace('_', ' ')} {fmt_s(v / o.steps)}" for k, v in o.host_s.items())
    text = f"{fmt_s(o.per_step_s)} host time per step = {100 * o.share:.2g}% of the worker's step ({parts})"
    if o.worker_share is not None:
        # a reader's thread's calls are on its CPU clock; where they took longer by the wall (waits
        # for the GIL while the engine ran, or for the device), that is said beside them
        waited = (
            f", {fmt_s(o.rpc_wall_s)} by the wall with the waits"
            if o.rpc_wall_s is not None and o.rpc_s is not None and o.rpc_wall_s > 1.25 * o.rpc_s + 1e-4
            else ""
        )
        text += (
            f"; with the calls it served between steps ({fmt_s(o.rpc_s)}{waited}), "
            f"{100 * o.worker_share:.2g}% of the worker's {fmt_s(o.window_s)}"
        )
    return text + budget_text(o)


def budget_text(o: DoctorOverhead) -> str:
    """What the doctor's own budget did to the sampling, where it left due samples out."""
    if not o.own_budget or not o.samples_skipped:
        return ""
    return (
        f"; {o.samples_skipped:,} steps due for a sample left unsampled to keep the doctor within its budget of "
        f"{100 * o.own_budget:.2g}% of the worker's time (VLLM_DOCTOR_OWN_BUDGET)"  # constants.OWN_BUDGET_ENV
    )


def render_roofline(profile: EngineProfile) -> str:
    """``profile.roofline`` (analysis.roofline) in words: one line per phase, the timed
    layers' range, and every rate above the device's peak as the doctor bug it is."""
    roof = profile.roofline
    if roof is None:
        return ""
    if not roof.available:
        return f"  roofline      n/a: {roof.reason}"
    lines: list[str] = []
    for phase, entry in roof.phases.items():
        lines.append(f"  {'roofline' if not lines else '':<14}{phase_text(phase, entry, roof.device)}")
    experts = roof.model.experts
    if experts is not None:
        read = ", ".join(
            f"{phase} {e.routed_experts:.3g}" for phase, e in roof.phases.items() if e.routed_experts is not None
        )
        lines.append(
            f"                routed experts: the weights count per MoE layer its router, shared experts and the "
            f"experts a step's tokens route to, of {experts.experts} (top-{experts.top_k}; {read}): "
            f"{experts.moe_layers} layer(s), {fmt_si_bytes(experts.expert_bytes)} an expert ({experts.source}); "
            "assumes uniform routing"
        )
    if roof.model is not None and roof.model.weights_quantized:
        lines.append(f"                weights: {roof.model.weights_quantized}")
    # what the KV term counts for a model whose caches are not all full attention (kv_notes)
    lines += [f"                {n}" for n in roof.notes if n.startswith(KV_NOTES)]
    for bucket in ("prefill", "decode"):
        timed = [x for x in roof.layers if x.phase == bucket and x.bytes_per_s is not None]
        if not timed:
            continue
        rates = sorted(float(x.bytes_per_s or 0.0) for x in timed)
        shares = sorted(float(x.bandwidth_share) for x in timed if x.bandwidth_share is not None)
        span = fmt_rate(rates[0]) if len(rates) == 1 else f"{fmt_rate(rates[0])} to {fmt_rate(rates[-1])}"
        share = ""
        if len(shares) == len(timed):
            share = f" = {100 * shares[0]:.0f}" + (f"-{100 * shares[-1]:.0f}" if len(shares) > 1 else "") + " % of peak"
        lines.append(f"                {len(timed)} timed layer(s), {bucket}: {span}{share}")
    problems = [p for e in roof.phases.values() for p in e.problems]
    problems += [f"layer {x.layer} ({x.phase}): {p}" for x in roof.layers for p in x.problems]
    for p in problems[:4]:
        lines.append(f"  DOCTOR BUG    {p}")
    if len(problems) > 4:
        lines.append(f"                ... and {len(problems) - 4} more rate(s) above the peak")
    return "\n".join(lines)


def execution_text(state: CompileState | None) -> str:
    """How vLLM ran a side: ``compiled (torch.compile, CUDA graphs)``, ``uncompiled (in CUDA graphs)``
    (vLLM captures FULL graphs of a model it does not compile), ``uncompiled``."""
    if state is None:
        return "?"
    graphs = bool(state.cudagraphs)
    if state.compiled_modules:
        return "compiled (torch.compile" + (", CUDA graphs)" if graphs else ")")
    return "uncompiled (in CUDA graphs)" if graphs else "uncompiled"


def render_twin(ab: TwinAB | None) -> str:
    """``profiles["twin"]`` (analysis.twin_compare) in words: the port against vLLM's in-tree twin
    per phase, per layer kind and the largest gap; one line when there is no twin."""
    if ab is None:
        return ""
    arch = ab.architecture
    if ab.none:
        head = f"twin A/B: vLLM's {arch}: " if arch else "twin A/B: "
        return head + ab.none
    how = "found from the checkpoint's layout" if ab.match.how == "auto" else "forced with --twin"
    weights = "the same weights" if ab.match.weights == "same" else "random weights on both (load_format=dummy)"
    clock = clock_name(ab.clock.port)
    lines = [
        f"twin A/B: the port against vLLM's {arch} ({how}; {weights}), same workload, same mode; times on the {clock}"
    ]
    lines += [f"  note          {n}" for n in ab.match.notes]
    lines.append(f"  execution     port {execution_text(ab.execution.port)}, twin {execution_text(ab.execution.twin)}")
    q = ab.quantization
    if q is not None:
        same = "the same on both sides" if q.same else "NOT the same on both sides: the A/B compares different weights"
        lines.append(f"  quantization  {same}")
        lines.append(f"    port        {q.port or 'not quantized'}")
        lines.append(f"    twin        {q.twin or 'not quantized'}")
    lines.append(
        f"  throughput    port {_tok(ab.port_tok_s)} tok/s, twin {_tok(ab.twin_tok_s)} tok/s "
        f"(output tokens over the whole workload): twin/port = {fmt_ratio(ab.throughput_ratio)}"
    )
    for phase, p in ab.phases.items():
        same = ""
        if p.port_forward_steps_step_s is not None or p.twin_forward_steps_step_s is not None:
            same = f" (of {fmt_s(p.port_forward_steps_step_s)} vs {fmt_s(p.twin_forward_steps_step_s)} steps)"
        lines.append(
            f"  {phase:<12}  step {fmt_s(p.port_step_s)} vs {fmt_s(p.twin_step_s)} = "
            f"{fmt_ratio(p.step_ratio)}, forward {fmt_s(p.port_forward_s)} vs "
            f"{fmt_s(p.twin_forward_s)}{same} = {fmt_ratio(p.forward_ratio)}; "
            f"{_tok(p.port_tok_s)} vs {_tok(p.twin_tok_s)} tok/s"
        )
    roof = [roofline_text(phase, p) for phase, p in ab.phases.items()]
    for i, text in enumerate(t for t in roof if t):
        lines.append(f"  {'roofline' if i == 0 else '':<14}{text}")
    if ab.kinds:
        lines.append(f"  by kind       port vs twin per step timed per layer; {ab.kinds_basis}")
        width = max(14, *(len(kind_label(kind)) + 1 for kind in ab.kinds))
        for kind, k in ab.kinds.items():
            per = "; ".join(
                f"{b} {fmt_s(e.port_s)} vs {fmt_s(e.twin_s)} = {fmt_ratio(e.ratio)}" for b, e in k.phases.items()
            )
            lines.append(f"    {kind_label(kind):<{width}}{per}")
    for text in ab.not_separable:
        lines.append(f"  not separable {text}")
    for text in ab.kinds_scaled:
        lines.append(f"  scaled        {text}")
    if ab.largest_gap.text:
        lines.append(f"  largest gap   {ab.largest_gap.text}")
    return "\n".join(lines)


def _tok(value: float | None) -> str:
    return f"{float(value):.0f}" if value is not None else "n/a"
