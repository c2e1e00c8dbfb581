"""What each pane of ``vllm-doctor view`` shows, as plain text and table rows (no widgets: testable alone).

Every function takes the report's JSON (``Report.to_dict()`` of any doctor version) and reads
with ``.get``: a section an older doctor (or a static check) did not write is ``None`` /
"not in this report" with the reason, never an error.
"""

from __future__ import annotations

from typing import Any

from vllm_doctor.checks import codes_for
from vllm_doctor.report.profile import render_anatomy
from vllm_doctor.units import fmt_bytes, fmt_s

NOT_IN_REPORT = "not in this report"
BAR_WIDTH = 32


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def engine_profile(report: dict[str, Any]) -> dict[str, Any]:
    return _dict(_dict(report.get("profiles")).get("engine"))


def missing(report: dict[str, Any], what: str) -> str:
    """ "<what>: not in this report" and why: an engine that failed, or a report without an engine stage."""
    failure = _dict(report.get("facts")).get("engine_failure")
    if failure:
        return f"{what}: {NOT_IN_REPORT} (the engine failed: {str(failure).splitlines()[0]})"
    if not engine_profile(report) and not _dict(report.get("facts")).get("engine"):
        return (
            f"{what}: {NOT_IN_REPORT} (no engine ran for it; `vllm-doctor check DIR --engine`, "
            "`vllm-doctor profile DIR --out OUT` and `vllm-doctor attach URL` write one)"
        )
    return f"{what}: {NOT_IN_REPORT} (an older vllm-doctor, or this run did not record it)"


def header_line(report: dict[str, Any]) -> str:
    env = _dict(report.get("environment"))
    summary = _dict(report.get("summary"))
    counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(summary.items())) or "no findings"
    versions = (
        f"vLLM {env.get('vllm') or '?'} | torch {env.get('torch') or '?'} | doctor {env.get('vllm_doctor') or '?'}"
    )
    return f"{counts}  |  {report.get('target')}  |  {versions}"


def anatomy_text(report: dict[str, Any]) -> str:
    """The engine's anatomy as ``profile`` prints it, or what a static check found of the model."""
    facts = _dict(report.get("facts"))
    lines: list[str] = []
    engine = _dict(facts.get("engine"))
    if engine:
        lines.append(render_anatomy(engine))
        mode = _dict(facts.get("engine_mode")).get("summary")
        if mode:
            lines.append(f"  mode          {mode}")
    else:
        lines.append(missing(report, "engine anatomy"))
    static = static_facts_lines(facts)
    if static:
        lines += ["", "model (static checks)", *static]
    env = _dict(report.get("environment"))
    if env:
        lines += ["", "environment"] + [f"  {k:<13} {v}" for k, v in env.items()]
    timings = _dict(report.get("timings"))
    if timings:
        seconds = {k: fmt_s(v) if k.endswith("_s") and isinstance(v, int | float) else v for k, v in timings.items()}
        lines += ["", "timings", *(f"  {k:<18} {v}" for k, v in seconds.items())]
    return "\n".join(lines)


def static_facts_lines(facts: dict[str, Any]) -> list[str]:
    lines = []
    for key, label in (("model_dir", "directory"), ("architectures", "architectures"), ("model_type", "model_type")):
        if facts.get(key) is not None:
            lines.append(f"  {label:<13} {facts[key]}")
    resolved = _dict(facts.get("resolved"))
    if resolved:
        lines.append(f"  resolves to   {resolved.get('architecture')} -> {resolved.get('target')}")
    if facts.get("registry_source"):
        lines.append(f"  registry from {facts['registry_source']}")
    for p in _list(facts.get("plugins")):
        p = _dict(p)
        regs = ", ".join(f"{_dict(r).get('arch')} -> {_dict(r).get('target')}" for r in _list(p.get("registrations")))
        lines.append(f"  plugin        {p.get('name')} ({p.get('distribution')}): {regs or 'registers no model'}")
    return lines


def workload_line(report: dict[str, Any]) -> str:
    w = _dict(_dict(report.get("profiles")).get("workload"))
    if not w:
        return ""
    return (
        f"workload: {w.get('prompts')} prompt(s) x {w.get('input_len')} tokens in, {w.get('output_len')} out; "
        f"{w.get('generated_tokens')} tokens in {fmt_s(w.get('wall_s'))} ({w.get('output_tokens_per_s')} tok/s)"
    )


PHASE_COLUMNS = ("phase", "steps", "tokens", "mean batch", "step mean", "step p50", "step p90", "forward mean", "tok/s")


def phase_rows(profile: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for phase, p in _dict(profile.get("phases")).items():
        p = _dict(p)
        tps = p.get("tokens_per_s")
        rows.append((
            phase, str(p.get("steps", "")), str(p.get("tokens", "")), str(p.get("mean_batch", "")),
            fmt_s(p.get("step_s_mean")), fmt_s(p.get("step_s_p50")), fmt_s(p.get("step_s_p90")),
            fmt_s(p.get("forward_s_mean")), f"{tps:.1f}" if isinstance(tps, int | float) else "n/a",
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


def step_rows(profile: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for s in _list(profile.get("steps"))[:MAX_STEP_ROWS]:
        s = _dict(s)
        rows.append((
            str(s.get("index", "")), str(s.get("phase", "")), str(s.get("num_reqs", "")),
            str(s.get("prefill_tokens", "")), str(s.get("decode_tokens", "")), str(s.get("kv_blocks_used", "")),
            fmt_s(s.get("step_s")), fmt_s(s.get("forward_s")), fmt_s(s.get("logits_s")),
            str(s.get("preempted_reqs") or ""),
        ))  # fmt: skip
    return rows


def steps_summary(report: dict[str, Any], profile: dict[str, Any]) -> str:
    steps = _list(profile.get("steps"))
    lines = [f"{len(steps)} step(s) recorded; timer: {profile.get('clock') or '?'}"]
    if profile.get("dropped_steps"):
        lines[0] += f"; {profile['dropped_steps']} older step(s) dropped from the buffer"
    if len(steps) > MAX_STEP_ROWS:
        lines.append(f"the table shows the first {MAX_STEP_ROWS}; every step is in the report's JSON")
    work = workload_line(report)
    return "\n".join(([work] if work else []) + lines)


# Layers: sortable by any time column; "forward order" is the order the profiler saw the modules
LAYER_COLUMNS = ("module", "kind", "layer", "class", "calls", "prefill", "decode", "total", "share")
LAYER_SORTS = ("total", "prefill", "decode", "name", "forward order")


def layer_modules(profile: dict[str, Any], sort: str = "total") -> list[dict[str, Any]]:
    modules = [_dict(m) for m in _list(_dict(profile.get("layers")).get("modules"))]

    def seconds(m: dict[str, Any], key: str) -> float:
        value = m.get(key)
        return float(value) if isinstance(value, int | float) else 0.0

    if sort == "name":
        return sorted(modules, key=lambda m: str(m.get("name")))
    if sort in ("total", "prefill", "decode"):
        return sorted(modules, key=lambda m: -seconds(m, f"{sort}_s"))
    return modules


def layer_rows(profile: dict[str, Any], sort: str = "total") -> list[tuple[str, ...]]:
    total = _dict(profile.get("layers")).get("forward_total_s")
    rows: list[tuple[str, ...]] = []
    for m in layer_modules(profile, sort):
        t = m.get("total_s")
        share = (
            f"{100 * t / total:.1f}%" if isinstance(t, int | float) and isinstance(total, int | float) and total else ""
        )
        layer = m.get("layer")
        rows.append((
            str(m.get("name", "")), str(m.get("kind", "")), "" if layer is None else str(layer),
            str(m.get("class", "")),
            str(m.get("calls", "")), fmt_s(m.get("prefill_s")), fmt_s(m.get("decode_s")), fmt_s(t), share,
        ))  # fmt: skip
    return rows


def layers_summary(profile: dict[str, Any], sort: str) -> str:
    layers = _dict(profile.get("layers"))
    lines = []
    if not profile.get("layers_on") and profile.get("layers_reason"):
        lines.append(f"per-layer timing off: {profile['layers_reason']}")
    kinds = {k: v for k, v in _dict(layers.get("by_kind")).items() if isinstance(v, int | float)}
    total = sum(kinds.values())
    if total:
        lines.append("by kind: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in kinds.items()))
    if layers.get("timed_fraction") is not None:
        lines.append(
            f"timed modules cover {100 * layers['timed_fraction']:.1f}% of the forward "
            f"({fmt_s(layers.get('forward_total_s'))} over {layers.get('timed_steps')} timed step(s))"
        )
    lines.append(f"sorted by {sort} (o: next order; or click a column)")
    return "\n".join(lines)


def memory_text(report: dict[str, Any]) -> str:
    profile = engine_profile(report)
    memory = [_dict(m) for m in _list(profile.get("memory"))]
    if not memory:
        return missing(report, "memory breakdown")
    lines = []
    for m in memory:
        total = m.get("total")
        lines.append(
            f"rank {m.get('rank')} ({m.get('device')}): {fmt_bytes(total)} in all, from {m.get('total_source')}"
            + (f"; peak {fmt_bytes(m.get('peak_total'))}" if m.get("peak_total") not in (None, total) else "")
        )
        for part, size in _dict(m.get("parts")).items():
            name = part.replace("_", " ")
            if not isinstance(size, int | float) or not isinstance(total, int | float) or total <= 0:
                lines.append(f"  {name:<17} {fmt_bytes(size):>11}")
                continue
            share = size / total
            bar = "█" * round(BAR_WIDTH * share)
            lines.append(f"  {name:<17} {fmt_bytes(size):>11} {100 * share:5.1f}% {bar}")
        lines += [f"  note: {n}" for n in _list(m.get("notes"))]
        lines.append("")
    nvml = _dict(profile.get("nvml"))
    if nvml:
        lines.append(
            "NVML: available" if nvml.get("available") else f"NVML: unavailable ({nvml.get('reason') or 'no reason'})"
        )
    return "\n".join(lines).rstrip()


KV_CODES = codes_for("kv-cache")


def kv_text(report: dict[str, Any]) -> str:
    kv = _dict(_dict(_dict(report.get("facts")).get("engine")).get("kv_cache"))
    profile = engine_profile(report)
    lines = []
    if kv:
        lines += [
            f"blocks        {kv.get('num_blocks')} x {kv.get('block_size')} tokens "
            f"= {_tokens(kv.get('num_blocks'), kv.get('block_size'))} tokens",
            f"tensors       {kv.get('num_layers')} layer tensor(s) in {kv.get('num_storages')} storage(s), "
            f"{fmt_bytes(kv.get('storage_bytes'))}",
            f"layout        {kv.get('layout') or 'not exposed'}; shape {kv.get('tensor_shape')} {kv.get('dtype')}",
        ]
        for g in _list(kv.get("groups")):
            g = _dict(g)
            lines.append(
                f"group         {g.get('layers')} layer(s), {g.get('type')}, {g.get('num_kv_heads')} KV heads x "
                f"{g.get('head_size')}, {g.get('dtype')}"
            )
    else:
        lines.append(missing(report, "KV cache layout"))
    usage = [_dict(u) for u in _list(profile.get("kv_usage"))]
    if usage:
        peak = max(usage, key=lambda u: u.get("usage") or 0)
        lines.append(
            f"usage         peak {peak.get('blocks')} of {profile.get('kv_num_blocks')} blocks "
            f"({100 * (peak.get('usage') or 0):.2f}%) at step {peak.get('index')}; {len(usage)} step(s) below"
        )
    elif kv:
        lines.append(f"usage         {NOT_IN_REPORT}")
    return "\n".join(lines)


def _tokens(blocks: Any, size: Any) -> str:
    return str(blocks * size) if isinstance(blocks, int) and isinstance(size, int) else "?"


def kv_usage_series(report: dict[str, Any]) -> list[float]:
    return [float(_dict(u).get("usage") or 0.0) for u in _list(engine_profile(report).get("kv_usage"))]


def kv_findings_text(report: dict[str, Any]) -> str:
    found = [_dict(f) for f in _list(report.get("findings")) if _dict(f).get("code") in KV_CODES]
    if not found:
        return f"KV findings ({', '.join(KV_CODES)}): {NOT_IN_REPORT}"
    first_lines = [(str(f.get("message") or "").splitlines() or [""])[0] for f in found]
    return "KV findings\n" + "\n".join(
        f"  {f.get('outcome', '?'):<5} {f.get('code')} {line}" for f, line in zip(found, first_lines, strict=True)
    )
