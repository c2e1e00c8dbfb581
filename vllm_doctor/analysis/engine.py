"""Turn the workers' profile, KV and memory facts into the report's engine profile
(:class:`~vllm_doctor.analysis.records.EngineProfile`, ``profiles["engine"]``) and the engine
anatomy (:class:`~vllm_doctor.analysis.records.EngineAnatomy`, ``facts["engine"]``). Pure functions
over :class:`EngineFacts` (its workers' records: :mod:`vllm_doctor.facts.anatomy`, ``placement``,
``kv``, ``memory``); they build new records and leave the workers' replies as they came.
"""

from __future__ import annotations

from dataclasses import fields, replace
from itertools import compress
from typing import Any

from vllm_doctor.analysis.quant import quant_summary
from vllm_doctor.analysis.records import (
    MIN_STEPS_TO_TELL,
    PHASES,
    DoctorOverhead,
    EngineAnatomy,
    EngineProfile,
    ExecutorInfo,
    FrontEnd,
    IdleBetweenSteps,
    KvGroupSummary,
    KvSummary,
    KvUsagePoint,
    LayerModule,
    LayerTables,
    LayerTotal,
    MemoryBreakdown,
    ModelInfo,
    ModelRunnerInfo,
    PhaseSummary,
    ProcessBox,
    ProfileReply,
    RankImbalance,
    RankSummary,
    StepRow,
    TimeAccounting,
    TimingMarkCost,
    WorkerAnatomy,
    WorkloadRun,
)
from vllm_doctor.analysis.roofline import engine_roofline
from vllm_doctor.facts.anatomy import Anatomy, WorkerIdentity
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.kv import KvCache
from vllm_doctor.facts.memory import CudaMemory, MemoryFacts
from vllm_doctor.facts.static import is_transformers_backend
from vllm_doctor.facts.steps import StepTable

WRAPPERS = "wrappers"  # the doctor's timer of its step wrappers (engine/session.py own_s)
# "dense": compiled modes' per-layer work after the attention (projections, norms, MLP), engine/profiler.py
# "router" and "experts": an MoE block's parts in eager mode (engine/layers.py)
KIND_ORDER = (
    "embedding",
    "attention",
    "mla",
    "state",
    "dense",
    "router",
    "experts",
    "mlp",
    "norm",
    "logits",
    "other",
)


def model_origin(model_class: str | None) -> str:
    if not model_class:
        return "unknown"
    if is_transformers_backend(model_class):
        return "transformers-fallback"
    if model_class.startswith("vllm."):
        return "built-in"
    return "plugin"


def anatomy(facts: EngineFacts) -> EngineAnatomy:
    """Which process holds the front end, engine core, executor and each worker."""
    fe = FrontEnd.of(facts.front_end)
    workers: list[WorkerAnatomy] = []
    for wf in facts.workers:
        a = wf.anatomy or Anatomy()
        who = a.identity
        workers.append(
            WorkerAnatomy(
                rank=who.rank,
                local_rank=who.local_rank,
                pid=who.pid,
                ppid=who.ppid,
                device=who.device,
                worker_class=who.worker_class,
                model_runner_class=who.model_runner_class,
                model_runner_kind=who.model_runner_kind,
                model_class=who.model_class,
                model_module_file=who.model_module_file,
                compile=a.compile,
                process_title=who.process_title,
            )
        )
    first = workers[0] if workers else WorkerAnatomy()
    kv = (facts.workers[0].kv if facts.workers else None) or KvCache()
    core_pids = fe.engine_core_pids
    if not core_pids and fe.url:  # a served engine: seen only from its workers
        core_pids = sorted(
            pid
            for pid in {w.pid if "EngineCore" in str(w.process_title or "") else w.ppid for w in workers if w.pid}
            if pid is not None
        )
        fe = replace(fe, engine_core_pids=core_pids)
    executor_pid = core_pids[0] if core_pids else None
    front_holds = [fe.llm_class, fe.core_client_class]
    if fe.engine_core_in_process:
        front_holds.append("engine core (in process)")
    processes = [ProcessBox(role="front end", pid=fe.pid, holds=front_holds)]
    if not fe.engine_core_in_process:
        for pid in core_pids:
            processes.append(
                ProcessBox(role="engine core", pid=pid, holds=["EngineCore", "scheduler", "KV cache manager"])
            )
    executor = ExecutorInfo(backend=fe.executor_backend, class_name=fe.executor_class, pid=executor_pid)
    for w in workers:
        in_core = w.pid in [fe.pid, *core_pids]
        processes.append(
            ProcessBox(
                role="worker",
                pid=w.pid,
                rank=w.rank,
                device=w.device,
                in_process_with="engine core" if in_core else None,
                holds=[w.worker_class, w.model_runner_class, w.model_class],
            )
        )
    first_tensor = kv.layers[0] if kv.layers else None
    kv_summary = KvSummary(
        layout=kv.layout,
        num_blocks=kv.num_blocks,
        block_size=kv.block_size,
        num_layers=kv.num_tensors,
        num_storages=kv.num_storages,
        storage_bytes=kv.storage_bytes,
        tensor_shape=list(first_tensor.shape) if first_tensor is not None else None,
        dtype=first_tensor.dtype if first_tensor is not None else None,
        groups=[KvGroupSummary(layers=len(g.layer_names), spec=g.spec) for g in kv.groups],
        capacity_tokens=kv.capacity_tokens,
        max_concurrency=kv.max_concurrency,
        max_model_len=kv.max_model_len,
        planned_bytes=kv.planned_bytes,
        shared_layers={a.prefix: a.kv_sharing_target for a in kv.attention_layers if a.kv_sharing_target},
    )
    return EngineAnatomy(
        front_end=fe,
        executor=executor,
        workers=workers,
        processes=processes,
        model=ModelInfo(
            class_name=first.model_class, origin=model_origin(first.model_class), file=first.model_module_file
        ),
        model_runner=ModelRunnerInfo(class_name=first.model_runner_class, kind=first.model_runner_kind),
        kv_cache=kv_summary,
        compile=first.compile,
    )


def _pct(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of sorted values."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered, mid = sorted(values), len(values) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def clock_mean(step_s: list[float], on_clock: list[bool], sampled: list[bool]) -> tuple[float, int, int, float | None]:
    """One phase's mean step time on the step clock, where only some of its steps are on it (the
    sampled step clock on a GPU: the sampled steps, the step after each, every 32nd and a window's
    first): the sampled steps as measured, every other step at the mean of the unsampled steps on
    the clock (the steps after a sample: the device clock's time of a step the doctor does not time
    inside). Returns (mean, steps on the clock, of those unsampled, the mean host span of the steps not on it)."""
    n = len(step_s)
    on = [s for s, c in zip(step_s, on_clock, strict=True) if c]
    host = [s for s, c in zip(step_s, on_clock, strict=True) if not c]
    host_mean = sum(host) / len(host) if host else None
    if not on:  # no step on the clock: the host's spans are all there is
        return (host_mean or 0.0), 0, 0, host_mean
    if len(on) == n:
        return sum(on) / n, n, sum(1 for m in sampled if not m), None
    timed = [s for s, c, m in zip(step_s, on_clock, sampled, strict=True) if c and m]
    untimed = [s for s, c, m in zip(step_s, on_clock, sampled, strict=True) if c and not m]
    if not untimed:  # only samples on the clock: their mean for every step
        return sum(on) / len(on), len(on), 0, host_mean
    unsampled = n - sum(1 for m in sampled if m)
    return (sum(timed) + unsampled * sum(untimed) / len(untimed)) / n, len(on), len(untimed), host_mean


def phase_summary(steps: StepTable) -> dict[str, PhaseSummary]:
    """Per phase: counts, step times, the forward beside the step time of the same steps, and
    the steps timed per layer against the others (what the doctor's per-layer timing costs).
    Step times are the step clock's (:func:`clock_mean` where only some steps are on it)."""
    out: dict[str, PhaseSummary] = {}
    step_s, forward_s, tokens_col = steps["step_s"], steps["forward_s"], steps["total_tokens"]
    prefill_reqs, decode_reqs, layers_timed = steps["prefill_reqs"], steps["decode_reqs"], steps["layers_timed"]
    layers_detail, on_clock_col, sampled_col = steps["layers_detail"], steps["device_timed"], steps["sampled"]
    encoder_col = steps["encoder_s"]
    idle_col = _idle_column(steps)
    phases = steps.phases
    for phase in PHASES:
        chosen = [p == phase for p in phases]  # one pass per phase; the columns are picked in C
        n = sum(chosen)
        if not n:
            continue
        phase_s, on_clock = list(compress(step_s, chosen)), list(compress(on_clock_col, chosen))
        mean, clock_steps, clock_untimed, host_mean = clock_mean(phase_s, on_clock, list(compress(sampled_col, chosen)))
        times = sorted(s for s, c in zip(phase_s, on_clock, strict=True) if c) or sorted(phase_s)
        # the forward beside the steps it was timed on (samples only: set beside all steps' mean, a
        # sample's heavier instrumentation could make the forward look longer than the step)
        paired = [
            (f, s) for f, s in zip(compress(forward_s, chosen), compress(step_s, chosen), strict=True) if f is not None
        ]
        paired_step = sum(s for _, s in paired)
        phase_timed = list(compress(layers_timed, chosen))
        timed = [s for s, on in zip(phase_s, phase_timed, strict=True) if on]
        untimed = [s for s, on, c in zip(phase_s, phase_timed, on_clock, strict=True) if not on and c]
        against, against_detail, pairs = _against_neighbours(
            phase_s, phase_timed, list(compress(layers_detail, chosen)), on_clock
        )
        idle = [v for v in compress(idle_col, chosen) if v is not None]
        encoded = [(e, s) for e, s in zip(compress(encoder_col, chosen), compress(step_s, chosen), strict=True) if e]
        tokens = sum(compress(tokens_col, chosen))
        total = mean * n
        out[phase] = PhaseSummary(
            steps=n,
            tokens=tokens,
            mean_batch=round((sum(compress(prefill_reqs, chosen)) + sum(compress(decode_reqs, chosen))) / n, 2),
            step_s_mean=mean,
            step_s_p50=_pct(times, 0.5),
            step_s_p90=_pct(times, 0.9),
            clock_steps=clock_steps,
            clock_untimed_steps=clock_untimed,
            host_step_s_mean=host_mean,
            forward_s_mean=sum(f for f, _ in paired) / len(paired) if paired else None,
            forward_steps=len(paired),
            forward_steps_step_s_mean=paired_step / len(paired) if paired else None,
            forward_share=sum(f for f, _ in paired) / paired_step if paired_step > 0 else None,
            tokens_per_s=tokens / total if total > 0 else None,
            idle_before_s_mean=sum(idle) / len(idle) if idle else None,
            encoder_steps=len(encoded),
            encoder_s=sum(e for e, _ in encoded) if encoded else None,
            encoder_step_s=sum(s for _, s in encoded) if encoded else None,
            timed_steps=len(timed),
            timed_step_s_median=_median(timed),
            untimed_step_s_median=_median(untimed),
            neighbour_pairs=pairs,
            timed_vs_neighbours=against,
            detail_vs_neighbours=against_detail,
        )
    return out


def _untimed_neighbours(
    step_s: list[float], timed: list[bool], on_clock: list[bool] | None = None
) -> list[tuple[int, float, float]]:
    """One phase's steps in order: (index, step time, the mean of its untimed neighbours) of each
    step timed per layer next to an untimed one on the step clock (every time positive)."""
    out = []
    for i, (s, on) in enumerate(zip(step_s, timed, strict=True)):
        if not on:
            continue
        near = [
            step_s[j]
            for j in (i - 1, i + 1)
            if 0 <= j < len(step_s) and not timed[j] and (on_clock is None or on_clock[j])
        ]
        if near and s > 0 and min(near) > 0:
            out.append((i, s, sum(near) / len(near)))
    return out


def _against_neighbours(
    step_s: list[float], timed: list[bool], detail: list[bool], on_clock: list[bool] | None = None
) -> tuple[float | None, float | None, int]:
    """The steps timed per layer against the untimed steps next to them (one phase's steps in
    order): per timed step with an untimed neighbour, its time over the mean of those neighbours;
    the median of those ratios less 1, for all timed steps and for the ones also timed inside
    their layers where some were not (eager mode's two grains; else None), and the count. Unlike
    the two medians, this leaves out what changes along a run (the first steps' warm-up, contexts
    that grow, batches that shrink), which the timed steps do not share evenly: the warm-up steps
    are all timed."""
    ratios: list[float] = []
    detail_ratios: list[float] = []
    for i, s, near in _untimed_neighbours(step_s, timed, on_clock):
        ratios.append(s / near)
        if detail[i]:
            detail_ratios.append(s / near)
    both = 0 < len(detail_ratios) < len(ratios)

    def cost(values: list[float]) -> float | None:
        # fewer pairs than MIN_STEPS_TO_TELL: no percentage (the text says too few to tell)
        med = _median(values) if len(values) >= MIN_STEPS_TO_TELL else None
        return None if med is None else med - 1.0

    return cost(ratios), cost(detail_ratios) if both else None, len(ratios)


def _idle_column(steps: StepTable) -> list[float | None]:
    """Each step's ``idle_before_s``, None for the table's first step: its idle time began before
    the window the table covers (the engine's start, or the previous collection)."""
    col = list(steps["idle_before_s"])
    if col:
        col[0] = None
    return col


def idle_between_steps(steps: StepTable) -> IdleBetweenSteps | None:
    """The device's idle time between consecutive steps, on the step clock: from one step's end
    mark to the next one's start mark (CUDA events on the stream the steps run on; on CPU the
    wall clock). Under async scheduling and CUDA graphs the host schedules the next step while the
    device runs this one, and this is near 0; where the device waits for the host (eager mode, a
    launch-bound model, slow scheduling or output processing) it is the time the device stood
    still. None without two timed steps."""
    values = sorted(v for v in _idle_column(steps) if v is not None)
    if not values:
        return None
    return IdleBetweenSteps(
        clock=steps.clock,
        gaps=len(values),
        total_s=sum(values),
        mean_s=sum(values) / len(values),
        p50_s=_pct(values, 0.5),
        p90_s=_pct(values, 0.9),
        max_s=values[-1],
    )


def layer_tables(profile: ProfileReply, steps: StepTable) -> LayerTables:
    """Per module, per decoder layer and per kind (with "other" = forward not in any kind). New
    records: the worker's reply is left as it came.

    Eager mode times the modules inside the decoder layers on every ``detail_every``-th step timed
    per layer only: their totals are scaled to all the steps timed per layer, so they add up with
    the layers': by their decoder layer's time on all those steps over its time on the detailed
    ones (steps of one bucket differ in size: the first prefill, always detailed, is the largest),
    or, from a doctor that did not record the latter, by the steps' counts. In eager mode the
    doctor's own cost is taken out of each module's time (:func:`timing_mark_costs`)."""
    timed_per_bucket = {"prefill": 0, "decode": 0}
    for phase, on in zip(steps.phases, steps["layers_timed"], strict=True):
        if on:
            timed_per_bucket["decode" if phase == "decode" else "prefill"] += 1
    costs = timing_mark_costs(profile, steps)
    corrected = _less_mark_costs(profile.layers, costs)
    # per decoder layer and bucket: its time on all timed steps over its time on the detailed ones
    ratio: dict[tuple[int, str], float] = {}
    for m in corrected:
        if m.kind != "layer" or m.layer is None:
            continue
        for bucket in ("prefill", "decode"):
            on_detail = m.detail_s(bucket)
            if on_detail is not None and on_detail > 0:
                ratio[(m.layer, bucket)] = m.bucket_s(bucket) / on_detail

    def scaled(m: LayerModule, bucket: str) -> float:
        seconds, own_steps = m.bucket_s(bucket), m.bucket_steps(bucket)
        every = timed_per_bucket[bucket]
        if not own_steps or every <= own_steps:  # timed on every step timed per layer
            return seconds
        by_layer = ratio.get((m.layer, bucket)) if m.layer is not None else None
        return seconds * by_layer if by_layer is not None else seconds * every / own_steps

    modules = [
        replace(m, total_s=scaled(m, "prefill") + scaled(m, "decode"), calls=m.prefill_calls + m.decode_calls)
        for m in corrected
    ]
    by_layer: dict[int, tuple[float, dict[str, float]]] = {}
    by_kind: dict[str, float] = {}
    for m in modules:
        kind, layer = m.kind, m.layer
        if kind == "layer" and layer is not None:
            total, kinds = by_layer.get(layer, (0.0, {}))
            by_layer[layer] = (total + m.total_s, kinds)
        elif kind in KIND_ORDER:
            by_kind[kind] = by_kind.get(kind, 0.0) + m.total_s
            if layer is not None:
                total, kinds = by_layer.get(layer, (0.0, {}))
                kinds[kind] = kinds.get(kind, 0.0) + m.total_s
                by_layer[layer] = (total, kinds)
    # layer times exist only for the per-layer samples: compare them with those steps' forwards
    timed = [f for f, on in zip(steps["forward_s"], steps["layers_timed"], strict=True) if on]
    forward_total = sum(float(f) for f in timed if f is not None)
    # how much of the forward the per-layer timings account for: the decoder layers plus the
    # top-level embedding and final norm (the model's whole forward, minus glue between them)
    covered = sum(
        m.total_s for m in modules if m.kind == "layer" or (m.layer is None and m.kind in ("embedding", "norm"))
    )
    if forward_total and costs:
        # never below what the modules inside it keep (an estimate above the marks' real cost
        # between the modules would make the spans outgrow their forward)
        forward_total = max(forward_total - sum(c.in_forwards_s for c in costs), min(forward_total, covered))
    if modules and forward_total:
        inside = sum(v for k, v in by_kind.items() if k != "logits")
        by_kind["other"] = max(0.0, forward_total - inside)
    called = {m.name for m in modules}
    return LayerTables(
        untimed_mixers=[n for n in profile.mixers if n not in called] if modules else [],
        mixers=len(profile.mixers),
        timed_fraction=covered / forward_total if modules and forward_total else None,
        modules=modules,
        by_layer=[LayerTotal(layer=k, total_s=by_layer[k][0], kinds=by_layer[k][1]) for k in sorted(by_layer)],
        by_kind={k: by_kind[k] for k in KIND_ORDER if k in by_kind},
        forward_total_s=forward_total,
        timed_steps=len(timed) if modules else 0,
        sample_every=profile.sample_every,
        doctor_cost=costs,
    )


# the timing marks of eager mode's per-layer timing outside the timed modules: the root model's
# timing forward (entry and return) and the logits processor's (entry and return, after the forward)
ROOT_MARKS = 2
LOGITS_MARKS = 2
# the readings a grain's cost per mark needs: the median of three is the first that one noisy
# step cannot make (one reading of a step the host slowed can take all of a module's time out,
# the logits processor's say: tests/unit/test_engine_units.py)
MIN_MARK_READINGS = 3


def _boundary_modules(layers: list[LayerModule]) -> tuple[list[LayerModule], dict[int, int]]:
    """Eager mode's timed modules at the layers' boundaries (decoder layers, and the modules
    outside the layers: embedding, final norm), and per layer index how many modules inside it
    are timed on a detailed step."""
    boundary = [m for m in layers if m.kind not in ("model", "logits") and (m.kind == "layer" or m.layer is None)]
    inner: dict[int, int] = {}
    for m in layers:
        if m.kind not in ("model", "logits", "layer") and m.layer is not None:
            inner[m.layer] = inner.get(m.layer, 0) + 1
    return boundary, inner


def timing_mark_costs(profile: ProfileReply, steps: StepTable) -> list[TimingMarkCost]:
    """Eager mode: what one timing mark costs a step timed per layer, per bucket.

    Each timed step next to an untimed one (same phase, on the step clock) is set against the
    mean of those neighbours; the difference over the marks that step made is one reading, and
    the median of the readings of each grain is its cost per mark (a detailed step's marks inside
    a layer partly overlap the device's work there: on the H200 they cost about half as much);
    a grain with fewer than ``MIN_MARK_READINGS`` readings has none (``per_mark_s`` None).
    A step timed at the layers' boundaries makes one mark per boundary module; a detailed one an
    entry and a return mark per timed module; both the root model's and the logits processor's two.
    The host launches an eager step's kernels, and every mark (a CUDA event and the doctor's
    Python around it) is launch time the device waits for, so each module's span holds the marks
    made inside it: a boundary module's span one (its entry's after-half, the next entry's
    before-half), a detailed module's one (its own entry's after-half and return's before-half)
    plus two per timed module inside it.

    Empty unless the worker says how it marked (``boundary_marks``, this doctor's eager mode):
    compiled modes time the attention calls, whose cost stays within 2 % (bench/README.md).
    """
    if profile.boundary_marks != "entry" or not profile.layers:
        return []
    boundary, inner = _boundary_modules(profile.layers)
    n_inner = sum(inner.values())
    marks_b = len(boundary) + ROOT_MARKS + LOGITS_MARKS
    marks_d = 2 * (len(boundary) + n_inner) + ROOT_MARKS + LOGITS_MARKS
    # per bucket, per grain (0: at the boundaries only, 1: detailed): readings, steps
    readings: dict[str, tuple[list[float], list[float]]] = {"prefill": ([], []), "decode": ([], [])}
    counts = {"prefill": [0, 0], "decode": [0, 0]}
    step_s, timed, detail, phases = steps["step_s"], steps["layers_timed"], steps["layers_detail"], steps.phases
    clocked = steps["device_timed"]
    for phase in PHASES:
        bucket = "decode" if phase == "decode" else "prefill"
        idx = [i for i, p in enumerate(phases) if p == phase]
        for i in idx:
            if timed[i]:
                counts[bucket][1 if detail[i] else 0] += 1
        on_clock = [clocked[i] for i in idx]
        for n, s, near in _untimed_neighbours([step_s[i] for i in idx], [timed[i] for i in idx], on_clock):
            grain = 1 if detail[idx[n]] else 0
            readings[bucket][grain].append((s - near) / (marks_d if grain else marks_b))

    def per_mark(values: list[float]) -> float | None:
        med = _median(values) if len(values) >= MIN_MARK_READINGS else None
        return None if med is None else max(0.0, med)

    out = []
    for bucket in ("prefill", "decode"):
        n_b, n_d = counts[bucket]
        if not n_b + n_d:
            continue
        at_bounds, inside = readings[bucket]
        out.append(
            TimingMarkCost(
                bucket=bucket,
                per_mark_s=per_mark(at_bounds),
                pairs=len(at_bounds),
                detail_per_mark_s=per_mark(inside),
                detail_pairs=len(inside),
                boundary_steps=n_b,
                boundary_marks=marks_b,
                detail_steps=n_d,
                detail_marks=marks_d,
            )
        )
    return out


def _less_mark_costs(layers: list[LayerModule], costs: list[TimingMarkCost]) -> list[LayerModule]:
    """Each module with the doctor's estimated cost inside its measured time (``*_cost_s``), and
    each bucket's :class:`TimingMarkCost` with the total taken out (``corrected_s``); unchanged
    without costs. A boundary module (and the logits processor) holds one mark's cost on each
    step of either grain and a decoder layer, on a detailed step, two more per timed module inside
    it; a module inside a layer one, on detailed steps."""
    if not costs:
        return layers
    boundary, inner = _boundary_modules(layers)
    boundary_names = {m.name for m in boundary}
    by_bucket = {c.bucket: c for c in costs}
    taken = {"prefill": 0.0, "decode": 0.0}
    logits_taken = {"prefill": 0.0, "decode": 0.0}
    # per (layer, bucket): what the modules inside it keep of their time, which is all on detailed
    # steps: a layer keeps at least that much of its own time there (an estimate too large for
    # small modules is cut at their measured time, and must not make the layer outgrow them)
    kept_inside: dict[tuple[int | None, str], float] = {}
    for m in layers:
        if m.name in boundary_names or m.kind in ("model", "logits", "layer") or m.layer is None:
            continue
        for bucket in ("prefill", "decode"):
            c = by_bucket.get(bucket)
            on = c.mark_s(True) * c.detail_steps if c is not None and c.measured else 0.0
            kept = max(0.0, m.measured_s(bucket) - on)
            kept_inside[(m.layer, bucket)] = kept_inside.get((m.layer, bucket), 0.0) + kept
    out = []
    for m in layers:
        cost: dict[str, float] = {}
        detail_cost: dict[str, float] = {}
        for bucket in ("prefill", "decode"):
            c = by_bucket.get(bucket)
            measured = m.measured_s(bucket)
            if c is None or not c.measured or measured <= 0:
                cost[bucket] = detail_cost[bucket] = 0.0
                continue
            at_bounds, inside = c.mark_s(False) * c.boundary_steps, c.mark_s(True) * c.detail_steps
            top = m.name in boundary_names or m.kind == "logits"  # not inside another timed module
            if m.kind == "layer" and m.layer is not None:
                on_detail = inside * (1 + 2 * inner.get(m.layer, 0))
                room = (m.detail_s(bucket) or 0.0) - kept_inside.get((m.layer, bucket), 0.0)
                if m.detail_s(bucket) is not None:
                    on_detail = max(0.0, min(on_detail, room))
            elif m.kind == "logits":  # from the forward's end: the root's return and its own entry and return
                at_bounds, on_detail = LOGITS_MARKS * at_bounds, LOGITS_MARKS * inside
            elif top:  # embedding, final norm: one mark's cost on every timed step
                on_detail = inside
            else:  # inside a decoder layer: timed on the detailed steps
                at_bounds, on_detail = 0.0, inside
            cost[bucket] = min(measured, at_bounds + on_detail)
            detail_cost[bucket] = min(m.detail_s(bucket) or 0.0, on_detail)
            taken[bucket] += cost[bucket] if top else 0.0
            logits_taken[bucket] += cost[bucket] if m.kind == "logits" else 0.0
        out.append(
            replace(
                m,
                prefill_cost_s=cost["prefill"],
                decode_cost_s=cost["decode"],
                prefill_detail_cost_s=detail_cost["prefill"],
                decode_detail_cost_s=detail_cost["decode"],
            )
        )
    # the forward loses what its top modules lost, and the marks' cost between them: one mark's
    # before the first module on every step (the root's entry mark's after half, the first
    # entry's before half), and on a detailed step one after each boundary module (its return
    # mark's after half, the next entry's before half)
    costs[:] = [
        replace(
            c,
            corrected_s=taken[c.bucket],
            in_forwards_s=taken[c.bucket]
            - logits_taken[c.bucket]
            + c.mark_s(False) * c.boundary_steps
            + c.mark_s(True) * c.detail_steps * (1 + len(boundary)),
        )
        for c in costs
    ]
    return out


def host_span(steps: StepTable) -> list[float] | None:
    """[the first step's host start, the last step's end] on the host's monotonic clock (the
    worker's perf_counter: CLOCK_MONOTONIC, one clock for every process of a host). The last end
    is its host start plus its step time (on GPU the device's: the step ends when its last kernel
    does, which its sampling waits for)."""
    starts, durations = steps["host_start"], steps["step_s"]
    if not starts or starts[0] is None or starts[-1] is None:
        return None
    return [float(starts[0]), float(starts[-1]) + float(durations[-1])]


def time_accounting(profile: EngineProfile, workload: WorkloadRun | None) -> TimeAccounting | None:
    """Do the step times add up to the workload's wall time? Steps of one engine do not overlap, so
    their sum (on the step clock) cannot exceed the wall time around ``llm.generate``; what is left
    ran outside any step (scheduling, output processing, request handling: the engine's host, or
    a device waiting for it). A sum above the wall time is a wrong clock: a doctor bug."""
    run = workload or WorkloadRun()
    wall = run.wall_s
    if not wall or not profile.phases:
        return None
    total = sum(float(p.steps) * float(p.step_s_mean) for p in profile.phases.values())
    outside = max(0.0, wall - total)
    idle = profile.idle_between_steps
    between = min(outside, idle.total_s) if idle is not None else None
    before, after = _edges(profile, run, wall)
    measured = None
    if before is not None and after is not None and between is not None:
        measured = (total + between + before + after) / wall
    return TimeAccounting(
        clock=profile.clock,
        steps_s=total,
        wall_s=wall,
        share=total / wall,
        outside_steps_s=outside,
        # of that, measured on the step clock between consecutive steps (the device idle), and the
        # rest: before the first step and after the last (requests in, outputs out)
        between_steps_s=between,
        between_steps_mean_s=idle.mean_s if idle is not None else None,
        edges_s=(before + after) if measured is not None else (None if between is None else outside - between),  # type: ignore[operator]
        before_first_s=before,
        after_last_s=after,
        measured_share=measured,
        accounted_share=None if between is None else (total + between) / wall,
        above_wall=total > wall * 1.01,
    )


def _edges(profile: EngineProfile, workload: WorkloadRun, wall: float) -> tuple[float | None, float | None]:
    """The workload's start to the first step, and the last step's end to the workload's end, both
    on the host's monotonic clock; (None, None) where either side lacks its times, or where they
    do not fit inside the wall time (a worker on another host: its clock is not this one's)."""
    span, start = profile.host_span_s, workload.host_start_s
    if span is None or start is None:
        return None, None
    before, after = span[0] - start, start + wall - span[1]
    slack = 0.01 * wall  # the last step's end is estimated from its step time
    if before < 0 or after < -slack or before + max(after, 0.0) > wall:
        return None, None
    return before, max(after, 0.0)


def kv_usage_series(steps: StepTable, num_blocks: int | None) -> list[KvUsagePoint]:
    if not num_blocks:
        return []
    usable = max(1, num_blocks - 1)  # block 0 is vLLM's null block
    return [
        KvUsagePoint(t=s["t"], index=s["index"], blocks=s["kv_blocks_used"], usage=s["kv_blocks_used"] / usable)
        for s in steps.rows()
    ]


def memory_breakdown(memory: MemoryFacts, nvml: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`memory_record` as JSON: the memory check's evidence (checks/memory.py)."""
    out: dict[str, Any] = memory_record(memory, nvml).to_json()
    return out


def memory_record(memory: MemoryFacts, nvml: dict[str, Any] | None = None, rank: int | None = None) -> MemoryBreakdown:
    """Weights / peak activations / KV / CUDA graphs / other, and what could not be measured."""
    notes: list[str] = []
    parts: dict[str, int | None] = {}
    weights_params = memory.parameter_bytes + memory.buffer_bytes
    kv = memory.kv_bytes
    cuda = memory.cuda
    if cuda is not None:
        weights = memory.measured("model_memory_usage") or weights_params
        parts["weights"] = weights
        parts["kv_cache"] = kv
        peak = memory.measured("peak_activation_memory")
        observed = max(0, cuda.max_allocated - weights - kv)
        if peak is None:
            notes.append(
                "vLLM skipped its start-up memory profiling (kv_cache_memory_bytes was given): "
                "peak activations are the peak torch allocation seen minus weights and KV"
            )
        parts["peak_activations"] = peak if peak is not None else observed
        graphs = cuda.graph_pool_bytes  # measured: the allocator's private pools
        if graphs is None:
            graphs = memory.measured("cudagraph_memory_estimate") or None  # vLLM's estimate, when it made one
        if memory.compile is not None and memory.compile.cudagraphs:
            parts["cuda_graphs"] = graphs
            if graphs is None:
                notes.append("CUDA-graph pool size not readable here: included in 'other'")
        else:
            parts["cuda_graphs"] = 0
        pid = memory.pid
        nvml_bytes = process_memory(nvml or {}, pid) if pid is not None else None
        if nvml_bytes is not None:
            total, total_source = nvml_bytes, "NVML: memory used by the worker process"
        else:
            total, total_source = cuda.reserved, "torch.cuda.memory_reserved (NVML unavailable)"
            notes.append("NVML unavailable: total is torch's reserved memory (misses the CUDA context and NCCL)")
        known = sum(v for v in parts.values() if v)
        parts["other"] = total - known
        return MemoryBreakdown(
            device=memory.device,
            total=total,
            total_source=total_source,
            parts=parts,
            torch=_torch_stats(cuda),
            device_used=cuda.device_total - cuda.device_free,
            notes=notes,
            measurable=True,
            rank=rank,
        )
    repacked = memory.repacked_weight_bytes_estimate
    weights_cpu = weights_params + repacked
    parts["weights"] = weights_cpu
    if repacked:
        notes.append(
            f"{memory.repacked_layers} linear layers hold their weights in CPU-repacked "
            "kernels (oneDNN); their bytes are estimated from the layer shapes"
        )
    parts["kv_cache"] = kv
    parts["peak_activations"] = None
    parts["cuda_graphs"] = None
    notes.append(
        "CPU worker: torch keeps no allocator statistics on CPU, so peak activations are not "
        "measurable; they are inside 'other' (with Python, torch and vLLM themselves)"
    )
    notes.append("CUDA graphs do not exist on CPU")
    host = memory.host
    rss = host.get("VmRSS", 0)
    return MemoryBreakdown(
        device=memory.device,
        total=rss,
        total_source="worker process resident memory (VmRSS)",
        peak_total=host.get("VmHWM"),
        parts={**parts, "other": rss - weights_cpu - kv if rss else None},
        notes=notes,
        measurable=False,
        rank=rank,
    )


def _torch_stats(cuda: CudaMemory) -> dict[str, int | None]:
    """torch's allocator statistics, by name."""
    return {f.name: getattr(cuda, f.name) for f in fields(cuda)}


def doctor_overhead(profile: ProfileReply, steps: StepTable) -> DoctorOverhead | None:
    """The doctor's own host time per step, against the worker's host time of the step.

    Measured inside the doctor's wrappers and hooks (``perf_counter`` around its own code), so
    it is precise where end-to-end throughput comparisons drown in run-to-run noise. Not
    included: PyTorch's cost of calling a hook (about a microsecond per hooked module call).
    """
    own = profile.doctor_host_s
    if not own or not len(steps):
        return None
    n = len(steps) + profile.dropped_steps
    own_total = sum(float(v) for v in own.values())
    own_step = own_total / n
    host_total = float(sum(filter(None, steps["host_execute_s"])) + sum(filter(None, steps["host_sample_s"])))
    host_step = host_total / len(steps)
    host_step += float(own.get(WRAPPERS, 0.0)) / n  # the wrappers run outside the measured host time
    rpc, window = profile.doctor_rpc_s, profile.window_s
    worker_share = None
    if rpc is not None and window:
        # everything the doctor did in the worker over the window (per step, plus the watcher's
        # calls served between steps: a reader's thread's CPU, the engine's thread's wall) against
        # the window's wall time: what it can take from a worker whose loop is the bottleneck (with
        # the GPU the bottleneck, less)
        worker_share = (own_total + rpc) / window
    else:
        rpc = window = None
    return DoctorOverhead(
        host_s={k: float(v) for k, v in own.items()},
        steps=n,
        per_step_s=own_step,
        step_host_s=host_step,
        share=own_step / host_step if host_step else None,
        rpc_s=rpc,
        rpc_wall_s=profile.doctor_rpc_wall_s if rpc is not None else None,
        window_s=window,
        worker_share=worker_share,
        own_budget=profile.own_budget,
        samples_skipped=profile.samples_skipped,
    )


def summarize(facts: EngineFacts, timeline: bool = True) -> EngineProfile:
    """``report.profiles["engine"]``: steps, phases, layers, KV usage, memory (rank 0 first).

    ``timeline=False`` (top's model panel, every few seconds): the summaries only, without the
    per-step records and the KV usage series built from them (``step_count`` says how many).
    """
    if not facts.workers:
        return EngineProfile(available=False, reason=facts.startup_error or "no worker replied")
    primary: WorkerFacts = facts.workers[0]
    profile = ProfileReply.of(primary.get("profile"))
    steps = primary.steps()
    kv = primary.kv or KvCache()
    num_blocks = profile.num_blocks or kv.num_blocks
    placement = primary.placement
    phases = phase_summary(steps)
    layers = layer_tables(profile, steps)
    per_rank = (
        [rank_summary(w, with_timeline=timeline and w is not primary) for w in facts.workers]
        if len(facts.workers) > 1
        else []
    )
    return EngineProfile(
        available=profile.profiling,
        rank=primary.rank,
        device=placement.worker.device if placement is not None and placement.worker is not None else None,
        clock=profile.clock,
        step_clock=profile.step_clock,
        layers_on=profile.layers_on,
        layers_reason=profile.layers_reason,
        steps=[StepRow.of(row) for row in steps.rows()] if timeline else [],
        step_count=len(steps),
        steps_error=steps.error,
        dropped_steps=profile.dropped_steps,
        phases=phases,
        layers=layers,
        kv_usage=kv_usage_series(steps, num_blocks) if timeline else [],
        kv_num_blocks=num_blocks,
        kv_block_size=kv.block_size,
        trace=profile.trace,
        memory=[
            memory_record(mem, facts.nvml, rank=w.rank)
            for w in facts.workers
            if w.get("memory") and (mem := w.memory) is not None  # an empty reply has nothing to break down
        ],
        nvml=facts.nvml,
        crashes=[{**c, "rank": w.rank} for w in facts.workers for c in ProfileReply.of(w.get("profile")).crashes],
        idle_between_steps=idle_between_steps(steps),
        host_span_s=host_span(steps) if not profile.dropped_steps else None,
        encoder_cache=profile.encoder_cache,
        doctor_overhead=doctor_overhead(profile, steps),
        roofline=engine_roofline(primary, steps, phases, layers, kv.block_size),
        quantization=quant_summary(primary.quant),
        per_rank=per_rank,
        rank_imbalance=rank_imbalance(per_rank) if per_rank else {},
    )


def rank_summary(w: WorkerFacts, with_timeline: bool = True) -> RankSummary:
    """One rank's own numbers: who it is, its phases, its decoder layers, its KV cache (and its
    steps and per-layer trace for the Perfetto track, except for the primary rank, whose are
    the profile's own)."""
    profile = ProfileReply.of(w.get("profile"))
    steps = w.steps()
    placement, anat = w.placement, w.anatomy
    # who the rank is: its placement says (with its parallel ranks), else its anatomy
    ident = (placement.worker if placement is not None else None) or (
        anat.identity if anat is not None else WorkerIdentity()
    )
    kv = w.kv or KvCache()
    layers = layer_tables(profile, steps)
    return RankSummary(
        rank=w.rank,
        tp_rank=ident.tp_rank,
        pp_rank=ident.pp_rank,
        device=ident.device,
        pid=ident.pid,
        phases=phase_summary(steps),
        by_layer=layers.by_layer,
        forward_total_s=layers.forward_total_s,
        kv_storage_bytes=kv.storage_bytes,
        kv_num_blocks=profile.num_blocks or kv.num_blocks,
        steps=[StepRow.of(row) for row in steps.rows()] if with_timeline else None,
        trace=profile.trace if with_timeline else [],
    )


def rank_imbalance(per_rank: list[RankSummary]) -> dict[str, RankImbalance]:
    """Per phase, the slowest and the fastest rank by mean forward time (host step time where
    the forward was not timed): the slowest rank sets the step of every rank."""
    out: dict[str, RankImbalance] = {}
    for phase in PHASES:
        values = []
        for r in per_rank:
            ph = r.phases.get(phase)
            if ph is not None:
                v = ph.forward_s_mean if ph.forward_s_mean is not None else ph.step_s_mean
                values.append((float(v), r.rank))
        if len(values) < 2:
            continue

        def order(x: tuple[float, int | None]) -> tuple[float, int]:
            return x[0], -1 if x[1] is None else x[1]

        (slow_s, slow), (fast_s, fast) = max(values, key=order), min(values, key=order)
        out[phase] = RankImbalance(
            slowest_rank=slow,
            slowest_s=slow_s,
            fastest_rank=fast,
            fastest_s=fast_s,
            ratio=slow_s / fast_s if fast_s > 0 else None,
        )
    return out


def process_memory(snap: dict[str, Any], pid: int) -> int | None:
    """GPU memory NVML attributes to ``pid`` across devices, or None if unknown."""
    if not snap.get("available"):
        return None
    total, seen = 0, False
    for dev in snap.get("devices", []):
        for proc in dev.get("processes", []) or []:
            if proc.get("pid") == pid and proc.get("used_memory") is not None:
                total += int(proc["used_memory"])
                seen = True
    return total if seen else None
