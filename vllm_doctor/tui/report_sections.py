"""What each pane of ``vllm-doctor view`` shows, as plain text and table rows (no widgets: testable alone).

The view reads a report file once into :func:`viewed`: a :class:`Report` whose sections are their
records (:mod:`vllm_doctor.analysis.records`, leniently: a key an older doctor did not write reads
as its default), which the panes read by attribute, and its findings into :class:`ShownFinding`
records (:func:`viewed_findings`: a finding of any doctor version, even of an outcome this one
retired). A section an older doctor (or a static check) did not write is "not in this report"
with the reason, never an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.analysis.records import (
    EngineAnatomy,
    EngineProfile,
    ExecutionMode,
    LayerModule,
    PluginFound,
    ResolvedClass,
    WorkloadRun,
    held,
    read_report,
)
from vllm_doctor.checks import codes_for
from vllm_doctor.model import Finding, Report
from vllm_doctor.report.profile import (
    kv_capacity_text,
    kv_group_text,
    marks_cost_text,
    render_anatomy,
    timing_cost_text,
)
from vllm_doctor.units import fmt_bytes, fmt_s

NOT_IN_REPORT = "not in this report"
NVML_AVAILABLE, NVML_REASON = "available", "reason"  # the NVML snapshot's keys (compat.nvml)
BAR_WIDTH = 32


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def viewed(data: dict[str, Any]) -> Report:
    """The report file's JSON (``load_report``) as the panes read it: its sections' records, read
    once. Its findings are read by :func:`viewed_findings` (any doctor version's)."""
    return read_report({**data, "findings": []})


def viewed_findings(data: dict[str, Any]) -> list[ShownFinding]:
    """The report file's findings as records (``load_report`` checked each is an object with a code)."""
    return shown(_list(data.get("findings")))


def engine_profile(report: Report) -> EngineProfile:
    return held(report, "profiles", "engine", EngineProfile) or EngineProfile()


def engine_anatomy(report: Report) -> EngineAnatomy | None:
    """``facts["engine"]``, None where the report has none."""
    return held(report, "facts", "engine", EngineAnatomy)


def missing(report: Report, what: str) -> str:
    """ "<what>: not in this report" and why: an engine that failed, or a report without an engine stage."""
    failure = report.facts.get("engine_failure")
    if failure:
        return f"{what}: {NOT_IN_REPORT} (the engine failed: {str(failure).splitlines()[0]})"
    if held(report, "profiles", "engine", EngineProfile) is None and engine_anatomy(report) is None:
        return (
            f"{what}: {NOT_IN_REPORT} (no engine ran for it; `vllm-doctor check DIR --engine`, "
            "`vllm-doctor profile DIR --out OUT` and `vllm-doctor attach URL` write one)"
        )
    return f"{what}: {NOT_IN_REPORT} (an older vllm-doctor, or this run did not record it)"


def header_line(report: Report, findings: Sequence[ShownFinding]) -> str:
    """The findings by outcome (counted from the findings: an older report may have no summary),
    the target, and the versions the report was made with."""
    summary: dict[str, int] = {}
    for f in findings:
        summary[f.outcome] = summary.get(f.outcome, 0) + 1
    counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(summary.items())) or "no findings"
    env = report.environment
    versions = (
        f"vLLM {env.get('vllm') or '?'} | torch {env.get('torch') or '?'} | doctor {env.get('vllm_doctor') or '?'}"
    )
    return f"{counts}  |  {report.target}  |  {versions}"


def anatomy_text(report: Report) -> str:
    """The engine's anatomy as ``profile`` prints it, or what a static check found of the model."""
    facts = report.facts
    lines: list[str] = []
    engine = engine_anatomy(report)
    if engine is not None:
        lines.append(render_anatomy(engine))
        mode = held(report, "facts", "engine_mode", ExecutionMode)
        if mode is not None and mode.summary:
            lines.append(f"  mode          {mode.summary}")
    else:
        lines.append(missing(report, "engine anatomy"))
    static = static_facts_lines(facts)
    if static:
        lines += ["", "model (static checks)", *static]
    env = report.environment
    if env:
        lines += ["", "environment"] + [f"  {k:<13} {v}" for k, v in env.items()]
    timings = report.timings
    if timings:
        seconds = {k: fmt_s(v) if k.endswith("_s") and isinstance(v, int | float) else v for k, v in timings.items()}
        lines += ["", "timings", *(f"  {k:<18} {v}" for k, v in seconds.items())]
    return "\n".join(lines)


@dataclass(frozen=True)
class ShownFinding:
    """One finding as the pane shows it. ``finding`` is the doctor's :class:`Finding` when this
    doctor can read it; a report of another version may carry an outcome or severity this one
    does not know, and then the fields stand as written (``outcome``, ``severity`` as text)."""

    code: str
    outcome: str
    severity: str
    message: str = ""
    subject: str = ""
    hint: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    finding: Finding | None = None

    @classmethod
    def of(cls, f: Finding) -> ShownFinding:
        return cls(f.code, f.outcome.value, f.severity.value, f.message, f.subject, f.hint, f.evidence, f)

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> ShownFinding:
        """A report.json finding (``load_report`` made sure it is an object with a code)."""
        try:
            return cls.of(Finding.from_dict(dict(data)))
        except (KeyError, ValueError, TypeError):  # another doctor version's finding: as written
            evidence = data.get("evidence")
            return cls(
                code=str(data["code"]),
                outcome=str(data.get("outcome", "?")),
                severity=str(data.get("severity", "?")),
                message=str(data.get("message") or ""),
                subject=str(data.get("subject") or ""),
                hint=str(data.get("hint") or ""),
                evidence=evidence if isinstance(evidence, Mapping) else {},
            )


def shown(findings: Iterable[Finding | Mapping[str, Any]]) -> list[ShownFinding]:
    """The doctor's findings, or a report.json's, as the pane shows them."""
    return [ShownFinding.of(f) if isinstance(f, Finding) else ShownFinding.read(f) for f in findings]


def static_facts_lines(facts: dict[str, Any]) -> list[str]:
    lines = []
    for key, label in (("model_dir", "directory"), ("architectures", "architectures"), ("model_type", "model_type")):
        if facts.get(key) is not None:
            lines.append(f"  {label:<13} {facts[key]}")
    resolved = facts.get("resolved")
    if isinstance(resolved, ResolvedClass):
        lines.append(f"  resolves to   {resolved.architecture} -> {resolved.target}")
    if facts.get("registry_source"):
        lines.append(f"  registry from {facts['registry_source']}")
    for p in _list(facts.get("plugins")):
        if not isinstance(p, PluginFound):
            continue
        regs = ", ".join(f"{r.arch} -> {r.target}" for r in p.registrations)
        lines.append(f"  plugin        {p.name} ({p.distribution}): {regs or 'registers no model'}")
    return lines


def workload_line(report: Report) -> str:
    w = held(report, "profiles", "workload", WorkloadRun)
    if w is None:
        return ""
    return (
        f"workload: {w.prompts} prompt(s) x {w.input_len} tokens in, {w.output_len} out; "
        f"{w.generated_tokens} tokens in {fmt_s(w.wall_s)} ({w.output_tokens_per_s} tok/s)"
    )


PHASE_COLUMNS = (
    "phase", "steps", "tokens", "mean batch", "step mean", "step p50", "step p90", "forward mean",
    "its steps' mean", "tok/s",
)  # fmt: skip


def phase_rows(profile: EngineProfile) -> list[tuple[str, ...]]:
    """Per phase; the forward beside the mean step time of the same steps (``its steps' mean``)."""
    rows: list[tuple[str, ...]] = []
    for phase, p in profile.phases.items():
        tps = p.tokens_per_s
        rows.append((
            phase, str(p.steps), str(p.tokens), str(p.mean_batch),
            fmt_s(p.step_s_mean), fmt_s(p.step_s_p50), fmt_s(p.step_s_p90),
            fmt_s(p.forward_s_mean), fmt_s(p.forward_steps_step_s_mean), f"{tps:.1f}" if tps is not None else "n/a",
        ))  # fmt: skip
    return rows


STEP_COLUMNS = (
    "step",
    "phase",
    "reqs",
    "prefill tok",
    "decode tok",
    "KV blocks",
    "step",
    "forward",
    "logits",
    "preempted",
)
MAX_STEP_ROWS = 5000


def step_rows(profile: EngineProfile) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for s in profile.steps[:MAX_STEP_ROWS]:
        rows.append((
            str(s.index), s.phase, str(s.num_reqs),
            str(s.prefill_tokens), str(s.decode_tokens), str(s.kv_blocks_used),
            fmt_s(s.step_s), fmt_s(s.forward_s), fmt_s(s.logits_s),
            str(s.preempted_reqs or ""),
        ))  # fmt: skip
    return rows


def steps_summary(report: Report, profile: EngineProfile) -> str:
    steps = profile.steps
    lines = [f"{len(steps)} step(s) recorded; timer: {profile.clock or '?'}"]
    if profile.dropped_steps:
        lines[0] += f"; {profile.dropped_steps} older step(s) dropped from the buffer"
    if len(steps) > MAX_STEP_ROWS:
        lines.append(f"the table shows the first {MAX_STEP_ROWS}; every step is in the report's JSON")
    lines += [cost for phase, p in profile.phases.items() if (cost := timing_cost_text(phase, p))]
    work = workload_line(report)
    return "\n".join(([work] if work else []) + lines)


# Layers: sortable by any time column; "forward order" is the order the profiler saw the modules
LAYER_COLUMNS = ("module", "kind", "layer", "class", "calls", "prefill", "decode", "total", "share")
LAYER_SORTS = ("total", "prefill", "decode", "name", "forward order")


def layer_modules(profile: EngineProfile, sort: str = "total") -> list[LayerModule]:
    modules = list(profile.layers.modules)
    if sort == "name":
        return sorted(modules, key=lambda m: m.name)
    if sort == "total":
        return sorted(modules, key=lambda m: -m.total_s)
    if sort in ("prefill", "decode"):
        return sorted(modules, key=lambda m: -m.bucket_s(sort))
    return modules


def layer_rows(profile: EngineProfile, sort: str = "total") -> list[tuple[str, ...]]:
    total = profile.layers.forward_total_s
    rows: list[tuple[str, ...]] = []
    for m in layer_modules(profile, sort):
        t = m.total_s
        share = f"{100 * t / total:.1f}%" if total else ""
        rows.append((
            m.name, str(m.kind or ""), "" if m.layer is None else str(m.layer), str(m.class_name or ""),
            str(m.calls), fmt_s(m.bucket_s("prefill")), fmt_s(m.bucket_s("decode")), fmt_s(t), share,
        ))  # fmt: skip
    return rows


def layers_summary(profile: EngineProfile, sort: str) -> str:
    layers = profile.layers
    lines = []
    if not profile.layers_on and profile.layers_reason:
        lines.append(f"per-layer timing off: {profile.layers_reason}")
    kinds = layers.by_kind
    total = sum(kinds.values())
    if total:
        lines.append("by kind: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in kinds.items()))
    if layers.timed_fraction is not None:
        lines.append(
            f"timed modules cover {100 * layers.timed_fraction:.1f}% of the forward "
            f"({fmt_s(layers.forward_total_s)} over {layers.timed_steps} timed step(s))"
        )
    marks = marks_cost_text(layers)
    if marks:
        lines.append(marks)
    lines.append(f"sorted by {sort} (o: next order; or click a column)")
    return "\n".join(lines)


def memory_text(report: Report) -> str:
    profile = engine_profile(report)
    if not profile.memory:
        return missing(report, "memory breakdown")
    lines = []
    for m in profile.memory:
        total = m.total
        lines.append(
            f"rank {m.rank} ({m.device}): {fmt_bytes(total)} in all, from {m.total_source}"
            + (f"; peak {fmt_bytes(m.peak_total)}" if m.peak_total not in (None, total) else "")
        )
        for part, size in m.parts.items():
            name = part.replace("_", " ")
            if size is None or total is None or total <= 0:
                lines.append(f"  {name:<17} {fmt_bytes(size):>11}")
                continue
            share = size / total
            bar = "█" * round(BAR_WIDTH * share)
            lines.append(f"  {name:<17} {fmt_bytes(size):>11} {100 * share:5.1f}% {bar}")
        lines += [f"  note: {n}" for n in m.notes]
        lines.append("")
    nvml = profile.nvml or {}
    if nvml:
        available, reason = nvml.get(NVML_AVAILABLE), nvml.get(NVML_REASON)
        lines.append("NVML: available" if available else f"NVML: unavailable ({reason or 'no reason'})")
    return "\n".join(lines).rstrip()


KV_CODES = codes_for("kv-cache")


def kv_text(report: Report) -> str:
    anatomy = engine_anatomy(report)
    kv = anatomy.kv_cache if anatomy is not None else None
    profile = engine_profile(report)
    lines = []
    if kv is not None:
        # blocks x block size is a token count only for one group of full attention: say vLLM's own
        blocks = f"blocks        {kv.num_blocks} x {kv.block_size} tokens"
        if len(kv.groups) == 1 and kv.groups[0].spec.kind in (None, "attention", "mla"):
            blocks += f" = {_tokens(kv.num_blocks, kv.block_size)} tokens"
        lines.append(blocks)
        if (capacity := kv_capacity_text(kv)) is not None:
            lines.append(f"capacity      {capacity}")
        lines += [
            f"tensors       {kv.num_layers} layer tensor(s) in {kv.num_storages} storage(s), "
            f"{fmt_bytes(kv.storage_bytes)}",
            f"layout        {kv.layout or 'not exposed'}; shape {kv.tensor_shape} {kv.dtype}",
        ]
        for g in kv.groups:
            lines.append(f"group         {kv_group_text(g)}")
    else:
        lines.append(missing(report, "KV cache layout"))
    usage = profile.kv_usage
    if usage:
        peak = max(usage, key=lambda u: u.usage)
        lines.append(
            f"usage         peak {peak.blocks} of {profile.kv_num_blocks} blocks "
            f"({100 * peak.usage:.2f}%) at step {peak.index}; {len(usage)} step(s) below"
        )
    elif kv is not None:
        lines.append(f"usage         {NOT_IN_REPORT}")
    return "\n".join(lines)


def _tokens(blocks: int | None, size: int | None) -> str:
    return str(blocks * size) if blocks is not None and size is not None else "?"


def kv_usage_series(report: Report) -> list[float]:
    return [u.usage for u in engine_profile(report).kv_usage]


def kv_findings_text(findings: Sequence[ShownFinding]) -> str:
    """The KV-cache checks' findings (any doctor's)."""
    found = [f for f in findings if f.code in KV_CODES]
    if not found:
        return f"KV findings ({', '.join(KV_CODES)}): {NOT_IN_REPORT}"
    return "KV findings\n" + "\n".join(
        f"  {f.outcome:<5} {f.code} {(f.message.splitlines() or [''])[0]}" for f in found
    )
