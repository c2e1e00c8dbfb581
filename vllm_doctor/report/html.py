"""A self-contained, offline HTML report: inline CSS and SVG only (no script, font or URL).

Charts: per-layer forward time (stacked by kind), step timeline (prefill vs decode), KV-cache
usage over the run, memory breakdown; the findings; the engine anatomy as an SVG diagram.
Renders from the report's JSON (``Report.to_dict()``), so a saved report.json re-renders: its
engine sections are read into their records (:mod:`vllm_doctor.analysis.records`) once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from html import escape
from itertools import pairwise
from typing import Any

from vllm_doctor.analysis.records import (
    EngineAnatomy,
    EngineProfile,
    KvUsagePoint,
    LayerTables,
    MemoryBreakdown,
    RooflineLayer,
    StepRow,
    TwinAB,
    WorkloadRun,
    held,
    read_report,
)
from vllm_doctor.analysis.roofline import fmt_rate, fmt_si_bytes
from vllm_doctor.analysis.twin_compare import fmt_ratio, kind_label, roofline_text
from vllm_doctor.model import Report, report_order
from vllm_doctor.report.profile import (
    accounting_text,
    execution_text,
    forward_step,
    marks_cost_text,
    slowest_layer,
    step_clock_text,
    timing_cost_text,
)
from vllm_doctor.units import clock_name, fmt_bytes, fmt_s

COLORS = {
    "embedding": "#8e6c8a",
    "attention": "#4e79a7",
    "mla": "#2f5d8a",
    "state": "#b6992d",
    "dense": "#edc948",
    "router": "#9c755f",
    "experts": "#ff9da7",
    "mlp": "#f28e2b",
    "norm": "#76b7b2",
    "logits": "#59a14f",
    "other": "#bab0ac",
    "prefill": "#e15759",
    "decode": "#4e79a7",
    "mixed": "#b07aa1",
    "weights": "#4e79a7",
    "kv_cache": "#f28e2b",
    "peak_activations": "#e15759",
    "cuda_graphs": "#76b7b2",
    "port": "#e15759",
    "twin": "#4e79a7",
}
OUTCOME_CLASS = {
    "fail": "bad",
    "crash": "bad",
    "warn": "warnc",
    "pass": "ok",
    "skip": "muted",
    "not_applicable": "muted",
}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666;font-size:13px}table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}th{background:#fafafa}
.bad{color:#b00020;font-weight:600}.warnc{color:#a15c00;font-weight:600}.ok{color:#2e7d32}.muted{color:#888}
.chart{margin:8px 0 4px}.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
code{background:#f4f4f4;padding:0 3px;border-radius:3px}.note{color:#666;font-size:12px;margin:2px 0}
details summary{cursor:pointer;color:#444}
"""


def _legend(keys: list[str]) -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span><i style="background:{COLORS.get(k, "#999")}"></i>{escape(k.replace("_", " "))}</span>'
            for k in keys
        )
        + "</div>"
    )


def _svg(width: int, height: int, body: str, label: str) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">{body}</svg>'
    )


def layer_chart(layers: LayerTables) -> str:
    rows = layers.by_layer
    kinds = layers.by_kind
    if not rows and not kinds:
        return '<p class="note">no per-layer timing (see the note above)</p>'
    width, label_w, row_h = 900, 150, 18
    items: list[tuple[str, dict[str, float], float]] = []
    for r in rows:
        parts = dict(r.kinds)
        rest = max(0.0, r.total_s - sum(parts.values()))
        if rest:
            parts["other"] = rest
        items.append((f"layer {r.layer}", parts, r.total_s))
    for k in ("embedding", "logits"):
        if kinds.get(k):
            items.append((k, {k: kinds[k]}, kinds[k]))
    top = max((t for _, _, t in items), default=0) or 1.0
    body = []
    for i, (name, parts, total) in enumerate(items):
        y = i * row_h + 4
        body.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end" font-size="11">{escape(name)}</text>')
        x = float(label_w)
        for kind, v in parts.items():
            w = (width - label_w - 90) * v / top
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{row_h - 5}" '
                f'fill="{COLORS.get(kind, "#999")}">'
                f"<title>{escape(name)} {escape(kind)}: {fmt_s(v)}</title></rect>"
            )
            x += w
        body.append(f'<text x="{x + 4:.1f}" y="{y + 12}" font-size="11">{fmt_s(total)}</text>')
    svg = _svg(width, len(items) * row_h + 10, "".join(body), "forward time per decoder layer, stacked by kind")
    total_kinds = sum(kinds.values()) or 1.0
    kind_text = ", ".join(f"{escape(k)} {100 * v / total_kinds:.0f}% ({fmt_s(v)})" for k, v in kinds.items())
    sampled = f"summed over the {layers.timed_steps} steps timed per layer" + (
        f" (the first steps of each phase, then every {layers.sample_every}-th)"
        if (layers.sample_every or 1) > 1
        else ""
    )
    return (
        svg
        + _legend([k for k in COLORS if k in kinds or any(k in p for _, p, _ in items)][:6])
        + f'<p class="note">by kind: {kind_text}; {escape(sampled)}</p>'
    )


def step_chart(steps: list[StepRow]) -> str:
    if not steps:
        return '<p class="note">no steps recorded</p>'
    width, height, left, bottom = 900, 180, 76, 20
    shown = steps[:600]
    top = max(s.step_s for s in shown) or 1.0
    bar_w = max(1.0, (width - left - 10) / len(shown))
    body = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{width}" y2="{height - bottom}" stroke="#999"/>',
        f'<text x="{left - 4}" y="12" text-anchor="end" font-size="10">{fmt_s(top)}</text>',
        f'<text x="{left - 4}" y="{height - bottom}" text-anchor="end" font-size="10">0</text>',
    ]
    for i, s in enumerate(shown):
        h = (height - bottom - 10) * s.step_s / top
        x = left + i * bar_w
        tip = (
            f"step {s.index} {s.phase}: {fmt_s(s.step_s)}, forward {fmt_s(s.forward_s)}, "
            f"{s.num_reqs} req(s), {s.prefill_tokens} prefill + {s.decode_tokens} decode tokens"
        )
        body.append(
            f'<rect x="{x:.1f}" y="{height - bottom - h:.1f}" width="{max(bar_w - 1, 0.8):.1f}" height="{h:.1f}" '
            f'fill="{COLORS.get(s.phase, "#999")}"><title>{escape(tip)}</title></rect>'
        )
    body.append(f'<text x="{width / 2}" y="{height - 4}" text-anchor="middle" font-size="10">step</text>')
    note = f'<p class="note">first {len(shown)} of {len(steps)} steps</p>' if len(steps) > len(shown) else ""
    phases = [p for p in ("prefill", "decode", "mixed") if any(s.phase == p for s in shown)]
    return _svg(width, height, "".join(body), "step time, prefill vs decode") + _legend(phases) + note


def kv_chart(usage: list[KvUsagePoint], num_blocks: Any) -> str:
    if not usage:
        return '<p class="note">no KV usage recorded</p>'
    width, height, left, bottom = 900, 150, 76, 20
    t_max = max(u.t or 0.0 for u in usage) or 1.0
    top = max(0.001, max(u.usage for u in usage) * 1.15)  # scale to the peak: small caches stay readable
    x_scale, y_scale = (width - left - 10) / t_max, (height - bottom - 10) / top
    pts = " ".join(f"{left + x_scale * (u.t or 0.0):.1f},{height - bottom - y_scale * u.usage:.1f}" for u in usage)
    body = (
        f'<line x1="{left}" y1="{height - bottom}" x2="{width}" y2="{height - bottom}" stroke="#999"/>'
        f'<text x="{left - 4}" y="14" text-anchor="end" font-size="10">{100 * top:.2f}%</text>'
        f'<text x="{left - 4}" y="{height - bottom}" text-anchor="end" font-size="10">0%</text>'
        f'<polyline points="{pts}" fill="none" stroke="{COLORS["kv_cache"]}" stroke-width="2"/>'
        f'<text x="{width / 2}" y="{height - 4}" text-anchor="middle" font-size="10">time ({t_max:.2f} s)</text>'
    )
    peak = max(u.usage for u in usage)
    return _svg(width, height, body, "KV cache usage over the run") + (
        f'<p class="note">peak {100 * peak:.2f}% of {escape(str(num_blocks))} blocks (blocks held by running '
        f"requests)</p>"
    )


def memory_chart(memory: list[MemoryBreakdown]) -> str:
    if not memory:
        return '<p class="note">no memory facts</p>'
    out = []
    width, label_w = 900, 90
    for m in memory:
        parts = {k: v for k, v in m.parts.items() if v}
        total = float(m.total or sum(v for v in parts.values() if v > 0) or 1)
        x, body = (
            float(label_w),
            [f'<text x="{label_w - 6}" y="20" text-anchor="end" font-size="11">rank {m.rank}</text>'],
        )
        for k, v in parts.items():
            if v <= 0:
                continue
            w = (width - label_w - 10) * v / total
            body.append(
                f'<rect x="{x:.1f}" y="6" width="{max(w, 0.5):.1f}" height="20" fill="{COLORS.get(k, "#bab0ac")}">'
                f"<title>{escape(k)}: {fmt_bytes(v)}</title></rect>"
            )
            x += w
        out.append(_svg(width, 32, "".join(body), f"memory breakdown rank {m.rank}"))
        rows = "".join(
            f"<tr><td>{escape(k.replace('_', ' '))}</td>"
            f"<td>{fmt_bytes(v) if v is not None else 'not measurable'}</td></tr>"
            for k, v in m.parts.items()
        )
        out.append(_legend(list(parts)))
        out.append(
            f"<table><tr><th>part</th><th>bytes</th></tr>{rows}<tr><th>total</th><th>{fmt_bytes(m.total)} "
            f"({escape(str(m.total_source))})</th></tr></table>"
        )
        out.extend(f'<p class="note">{escape(n)}</p>' for n in m.notes)
    return "".join(out)


def anatomy_svg(anatomy: EngineAnatomy | None) -> str:
    """Boxes: processes (front end, engine core, workers) with what each holds."""
    if anatomy is None:
        return '<p class="note">the engine did not start: no anatomy</p>'
    procs = anatomy.processes
    kv = anatomy.kv_cache
    model = anatomy.model
    box_w, box_h, gap = 270, 112, 24
    width = max(3, len(procs)) * (box_w + gap) + gap
    body = []
    centers = []
    for i, p in enumerate(procs):
        x, y = gap + i * (box_w + gap), 30
        centers.append(x + box_w / 2)
        title = f"{p.role}" + (f" {p.rank}" if p.rank is not None else "")
        color = {"front end": "#e8f0fb", "engine core": "#fdf1e2", "worker": "#e9f5ea"}.get(p.role, "#f4f4f4")
        body.append(f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="8" fill="{color}" stroke="#888"/>')
        body.append(
            f'<text x="{x + 10}" y="{y + 20}" font-size="13" font-weight="600">{escape(title)} (pid '
            f"{escape(str(p.pid))})</text>"
        )
        lines = [str(h).rsplit(".", 1)[-1] for h in p.holds if h]
        if p.device:
            lines.insert(0, f"device {p.device}")
        if p.in_process_with:
            lines.append(f"in the {p.in_process_with} process")
        for j, line in enumerate(lines[:5]):
            body.append(f'<text x="{x + 10}" y="{y + 40 + j * 15}" font-size="11">{escape(line[:42])}</text>')
    for a, b in pairwise(centers):
        body.append(
            f'<line x1="{a + box_w / 2}" y1="86" x2="{b - box_w / 2}" y2="86" stroke="#666" marker-end="url(#arrow)"/>'
        )
    ex = anatomy.executor
    body.append(
        f'<text x="{gap}" y="18" font-size="12">executor: {escape(str(ex.backend))} '
        f"{escape(str(ex.class_name or '').rsplit('.', 1)[-1])}</text>"
    )
    y2 = 30 + box_h + 26
    body.append(
        f'<text x="{gap}" y="{y2}" font-size="12">model: {escape(str(model.class_name))} '
        f"[{escape(str(model.origin))}]</text>"
    )
    body.append(
        f'<text x="{gap}" y="{y2 + 18}" font-size="12">KV cache: {escape(str(kv.num_layers))} layer tensor(s) '
        f"in "
        f"{escape(str(kv.num_storages))} storage(s), {fmt_bytes(kv.storage_bytes)}, "
        f"{escape(str(kv.num_blocks))} blocks x {escape(str(kv.block_size))} tokens, layout "
        f"{escape(str(kv.layout or 'not exposed'))}, shape {escape(str(kv.tensor_shape))}</text>"
    )
    defs = (
        '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>'
    )
    return _svg(width, y2 + 30, defs + "".join(body), "engine anatomy")


def findings_table(findings: list[dict[str, Any]]) -> str:
    problems = [f for f in findings if f["outcome"] in ("fail", "warn", "crash")]
    others = [f for f in findings if f not in problems]

    def rows(items: list[dict[str, Any]]) -> str:
        return "".join(
            f"<tr><td "
            f'class="{OUTCOME_CLASS.get(f["outcome"], "")}">{escape(f["outcome"])}</td><td>{escape(f["code"])}</td>'
            f"<td>{escape(f['severity'])}</td><td>{escape(f['message'])}"
            + (f'<br><span class="note">fix: {escape(f["hint"])}</span>' if f.get("hint") else "")
            + f"</td><td><code>{escape(f.get('subject') or '')}</code></td></tr>"
            for f in items
        )

    head = "<tr><th>outcome</th><th>code</th><th>severity</th><th>message</th><th>subject</th></tr>"
    html = f"<table>{head}{rows(problems)}</table>" if problems else '<p class="ok">no problems found</p>'
    if others:
        html += (
            f"<details><summary>{len(others)} passing / skipped / "
            f"n/a</summary><table>{head}{rows(others)}</table></details>"
        )
    return html


def phases_table(prof: EngineProfile, workload: WorkloadRun | None) -> str:
    """Per phase: steps, tokens, step times, the forward beside the step time of the same steps,
    and a line per phase naming what the doctor's per-layer timing cost its steps."""
    rows = "".join(
        f"<tr><td>{escape(ph)}</td><td>{p.steps}</td><td>{p.tokens}</td><td>{p.mean_batch}</td>"
        f"<td>{fmt_s(p.step_s_mean)}</td><td>{fmt_s(p.step_s_p90)}</td><td>{fmt_s(p.forward_s_mean)}</td>"
        f"<td>{fmt_s(p.forward_steps_step_s_mean)}</td><td>{_num(p.tokens_per_s)}</td></tr>"
        for ph, p in prof.phases.items()
    )
    html = (
        "<table><tr><th>phase</th><th>steps</th><th>tokens</th><th>mean batch</th><th>step mean</th><th>step p90</th>"
        "<th>forward mean</th><th>step mean of the forward's steps</th><th>tokens/s</th></tr>"
        f"{rows}</table>"
        f'<p class="note">step and forward times on the {escape(clock_name(prof.clock))}</p>'
    )
    for ph, p in prof.phases.items():
        on_clock = step_clock_text(ph, p, prof.clock)
        if on_clock:
            html += f'<p class="note">step clock: {escape(on_clock)}</p>'
    for ph, p in prof.phases.items():
        cost = timing_cost_text(ph, p)
        if cost:
            html += f'<p class="note">{escape(cost)}</p>'
    marks = marks_cost_text(prof.layers)
    if marks:
        html += f'<p class="note">{escape(marks)}</p>'
    if prof.time_accounting is not None:
        html += f'<p class="note">{escape(accounting_text(prof.time_accounting))}</p>'

    if workload is not None:
        w = workload
        html += (
            f'<p class="note">workload: {w.prompts} prompt(s) x {w.input_len} tokens in, '
            f"{w.output_len} out; {w.generated_tokens} tokens in "
            f"{fmt_s(w.wall_s)} "
            f"({w.output_tokens_per_s} output tokens/s, doctor attached)</p>"
        )
    return html


def _share(value: Any) -> str:
    return f"{100 * float(value):.0f} %" if value is not None else "–"


def _layer_row(x: RooflineLayer) -> str:
    problem = escape("; ".join(x.problems))
    cell = f'<td class="bad">{problem}</td>' if x.above_peak else f"<td>{_share(x.bandwidth_share)}</td>"
    return (
        f"<tr><td>{x.layer}</td><td>{escape(str(x.phase))}</td><td>{fmt_s(x.time_s)}</td>"
        f"<td>{fmt_si_bytes(x.bytes.total)}</td><td>{fmt_rate(x.bytes_per_s)}</td>"
        f"{cell}</tr>"
    )


def roofline_table(profile: EngineProfile) -> str:
    """``profile.roofline``: per phase the bytes and FLOPs of a step, the achieved rates and
    their shares of the device's peaks; a rate above a peak in red as the doctor bug it is."""
    roof = profile.roofline
    if roof is None:
        return ""
    if not roof.available:
        return f'<p class="note">roofline not available: {escape(str(roof.reason))}</p>'
    dev = roof.device
    model = roof.model
    rows = []
    for phase, e in roof.phases.items():
        b, w = e.bytes, e.workload
        tflops = e.flops_per_s
        problem = "; ".join(e.problems)
        rows.append(
            f"<tr><td>{escape(phase)}</td><td>{fmt_s(e.step_s)}</td><td>{w.tokens:.0f} / "
            f"{w.seqs:.1f} / {w.context_tokens:.0f}</td><td>{fmt_si_bytes(b.weights)}</td>"
            f"<td>{fmt_si_bytes(b.kv_read)}</td><td>{fmt_si_bytes(b.kv_write)}</td>"
            f"<td>{fmt_si_bytes(b.activations)}</td><td>{fmt_rate(e.bytes_per_s)}</td>"
            f"<td>{_share(e.bandwidth_share)}</td>"
            f"<td>{f'{tflops / 1e12:.3g}' if tflops is not None else 'n/a'}</td>"
            f"<td>{_share(e.compute_share)}</td>"
            + (f'<td class="bad">{escape(problem)}</td>' if e.above_peak else f"<td>{escape(problem)}</td>")
            + "</tr>"
        )
    peak_bw = fmt_rate(dev.bandwidth_bytes_s) if dev.bandwidth_bytes_s else "unknown"
    peak_fl = f"{dev.flops_s / 1e12:.4g} TFLOP/s dense {dev.flops_dtype}" if dev.flops_s else "unknown"
    notes = "".join(f'<p class="note">{escape(str(n))}</p>' for n in roof.notes)
    layers = [x for x in roof.layers if x.bytes_per_s is not None]
    layer_rows = "".join(_layer_row(x) for x in layers)
    layer_html = (
        "<details><summary>per timed decoder layer</summary><table><tr><th>layer</th><th>phase</th><th>time per call"
        f"</th><th>bytes</th><th>bandwidth</th><th>of peak</th></tr>{layer_rows}</table></details>"
        if layers
        else ""
    )
    return (
        f'<p class="note">device {escape(str(dev.name))}: peak {escape(peak_bw)} '
        f"({escape(str(dev.bandwidth_source))}), {escape(peak_fl)} ({escape(str(dev.flops_source))}). "
        f"Model: {model.params / 1e9:.3g} B parameters per rank, "
        f"{fmt_si_bytes(model.weights_read_bytes)} of weights read per step "
        f"({escape(str(model.weights_source))}). Bandwidth = (weights + KV) / step "
        "time; the KV context is an upper bound (blocks in use x block size); activations are an upper bound, "
        "not in the bandwidth.</p>"
        "<table><tr><th>phase</th><th>step</th><th>tokens / seqs / context</th><th>weights</th><th>KV read</th>"
        "<th>KV written</th><th>activations</th><th>bandwidth</th><th>of peak</th><th>TFLOP/s</th><th>of peak</th>"
        f"<th>problem</th></tr>{''.join(rows)}</table>{notes}{layer_html}"
    )


def ranks_table(prof: EngineProfile) -> str:
    """Per-rank numbers side by side (each forward beside the step time of the same steps), and
    the imbalance (the slowest rank sets the step)."""
    if len(prof.per_rank) < 2:
        return ""
    rows = []
    for r in prof.per_rank:
        slowest = slowest_layer(r.by_layer)
        cells = [
            r.rank,
            r.tp_rank,
            r.pp_rank,
            r.device,
            forward_step(r.phases.get("prefill")),
            forward_step(r.phases.get("decode")),
            f"layer {slowest.layer}: {fmt_s(slowest.total_s)}" if slowest else "n/a",
            fmt_bytes(r.kv_storage_bytes),
        ]
        rows.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    notes = "".join(
        f'<p class="note">{escape(phase)}: rank {imb.slowest_rank} is the slowest ({fmt_s(imb.slowest_s)}), rank '
        f"{imb.fastest_rank} the fastest ({fmt_s(imb.fastest_s)})"
        + (f": {imb.ratio:.2f}x" if imb.ratio else "")
        + "; the slowest rank sets the step.</p>"
        for phase, imb in prof.rank_imbalance.items()
    )
    head = (
        "<tr><th>rank</th><th>tp</th><th>pp</th><th>device</th><th>prefill forward / step</th>"
        "<th>decode forward / step</th><th>slowest layer</th><th>KV storage</th></tr>"
    )
    return f'<h2 id="ranks">Per rank</h2><table>{head}{"".join(rows)}</table>{notes}'


def _pair_rows(rows: Sequence[tuple[str, float | None, float | None, str]]) -> str:
    """Side-by-side bars: per row the port's time over the twin's, on one scale per row."""
    width, label_w, bar_h = 900, 240, 12
    body: list[str] = []
    y = 4
    for label, port_s, twin_s, ratio in rows:
        top = max(port_s or 0.0, twin_s or 0.0) or 1.0
        body.append(f'<text x="{label_w - 6}" y="{y + 18}" text-anchor="end" font-size="11">{escape(label)}</text>')
        for i, (who, v) in enumerate((("port", port_s), ("twin", twin_s))):
            w = (width - label_w - 200) * (v or 0.0) / top
            yy = y + i * (bar_h + 2)
            body.append(
                f'<rect x="{label_w}" y="{yy}" width="{max(w, 0.5):.1f}" height="{bar_h}" fill="{COLORS[who]}">'
                f"<title>{escape(label)}, {who}: {fmt_s(v)}</title></rect>"
                f'<text x="{label_w + w + 4:.1f}" y="{yy + 10}" font-size="10">{who} {fmt_s(v)}'
                + (f" ({escape(ratio)})" if i == 0 and ratio else "")
                + "</text>"
            )
        y += 2 * bar_h + 12
    return _svg(width, y + 4, "".join(body), "the port's time beside the twin's")


def twin_section(ab: TwinAB | None) -> str:
    """``profiles["twin"]``: the port against vLLM's in-tree twin, side-by-side bars per phase and
    per layer kind, the largest gap, what could not be separated; one line when there is no twin."""
    if ab is None:
        return ""
    head = '<h2 id="twin">Twin A/B: the port against vLLM\'s in-tree twin</h2>'
    if ab.none:
        return head + f'<p class="note">{escape(ab.none)}</p>'
    match = ab.match
    arch = escape(str(ab.architecture))
    notes = "".join(f'<p class="note">{escape(str(n))}</p>' for n in match.notes)
    gap = ab.largest_gap
    gap_class = "bad" if (gap.excess_s or 0) > 0 else "ok"
    phase_rows = [(f"{ph} step", p.port_step_s, p.twin_step_s, fmt_ratio(p.step_ratio)) for ph, p in ab.phases.items()]
    kind_rows = [
        (f"{b} {kind_label(kind)}", e.port_s, e.twin_s, fmt_ratio(e.ratio))
        for kind, k in ab.kinds.items()
        for b, e in k.phases.items()
    ]
    table = "".join(
        f"<tr><td>{escape(ph)}</td><td>{fmt_s(p.port_step_s)}</td><td>{fmt_s(p.twin_step_s)}</td>"
        f"<td>{fmt_ratio(p.step_ratio)}</td><td>{fmt_s(p.port_forward_s)} / {fmt_s(p.port_forward_steps_step_s)}</td>"
        f"<td>{fmt_s(p.twin_forward_s)} / {fmt_s(p.twin_forward_steps_step_s)}</td><td>{_num(p.port_tok_s)}</td>"
        f"<td>{_num(p.twin_tok_s)}</td><td>{fmt_ratio(p.throughput_ratio)}</td>"
        f"<td>{escape(roofline_text(ph, p))}</td></tr>"
        for ph, p in ab.phases.items()
    )
    covers = "".join(
        f"<li><b>{escape(kind_label(kind))}</b>: {escape(str(k.covers))}</li>" for kind, k in ab.kinds.items()
    )
    not_sep = "".join(f"<li>{escape(str(t))}</li>" for t in ab.not_separable)
    scaled = "".join(f"<li>{escape(str(t))}</li>" for t in ab.kinds_scaled)
    how = "found from the checkpoint's layout" if match.how == "auto" else "forced with --twin"
    weights = "the same weights" if match.weights == "same" else "random weights on both (load_format=dummy)"
    port_side, twin_side = escape(execution_text(ab.execution.port)), escape(execution_text(ab.execution.twin))
    return (
        head + f"<p>vLLM's <code>{arch}</code> ({how}; {weights}), same workload, same mode. Port: {port_side}, "
        f"twin: {twin_side}. Throughput (output tokens, whole workload): port {_num(ab.port_tok_s)}, "
        f"twin {_num(ab.twin_tok_s)} tok/s, twin/port = {fmt_ratio(ab.throughput_ratio)}.</p>"
        + notes
        + (f'<p class="{gap_class}">largest gap: {escape(str(gap.text))}</p>' if gap.text else "")
        + "<table><tr><th>phase</th><th>port step</th><th>twin step</th><th>port/twin</th>"
        "<th>port forward / its steps</th><th>twin forward / its steps</th><th>port tok/s</th>"
        f"<th>twin tok/s</th><th>twin/port</th><th>roofline</th></tr>{table}</table>"
        + (_pair_rows(phase_rows) if phase_rows else "")
        + _legend(["port", "twin"])
        + (
            f'<p class="note">per layer kind, seconds per step timed per layer '
            f"({escape(str(ab.kinds_basis))})</p>" + _pair_rows(kind_rows) + f"<ul>{covers}</ul>"
            if kind_rows
            else ""
        )
        + (f'<p class="note">not separable:</p><ul>{not_sep}</ul>' if not_sep else "")
        + (f'<p class="note">scaled:</p><ul>{scaled}</ul>' if scaled else "")
    )


def _num(value: Any) -> str:
    return f"{float(value):.1f}" if value is not None else "n/a"


CPU_BEGIN, CPU_END = "<!-- vllm-doctor:cpu-profile -->", "<!-- /vllm-doctor:cpu-profile -->"


def cpu_profile_section(index: dict[str, Any]) -> str:
    """Links to a cpu-profile's flamegraphs and speedscope files (the index.json beside the report)."""
    rows = []
    for p in index.get("processes") or []:
        links = []
        if p.get("flamegraph"):
            name = escape(str(p["flamegraph"]), quote=True)
            links.append(f'<a href="{name}">flamegraph</a>')
        if p.get("speedscope"):
            name = escape(str(p["speedscope"]), quote=True)
            links.append(f'<a href="{name}">speedscope JSON</a>')
        note = f' <span class="muted">{escape(str(p["error"]))}</span>' if p.get("error") else ""
        rows.append(
            f"<tr><td>{escape(str(p.get('label')))}</td><td>{escape(str(p.get('pid')))}</td>"
            f"<td><code>{escape(str(p.get('title')))}</code></td><td>{' | '.join(links) or '-'}{note}</td></tr>"
        )
    return "\n".join(
        [
            CPU_BEGIN,
            '<h2 id="cpu">CPU profile (py-spy)</h2>',
            f'<p class="note">{escape(str(index.get("duration_s")))} s at {escape(str(index.get("rate_hz")))} Hz '
            "recorded by <code>vllm-doctor cpu-profile</code>; open the speedscope files at speedscope.app.</p>",
            "<table><tr><th>process</th><th>pid</th><th>title</th><th>files</th></tr>" + "".join(rows) + "</table>",
            CPU_END,
        ]
    )


def link_cpu_profile(html: str, index: dict[str, Any]) -> str:
    """``html`` (a report.html) with the CPU-profile section put in, or replaced, before </body>."""
    if CPU_BEGIN in html and CPU_END in html:
        head, _, rest = html.partition(CPU_BEGIN)
        html = head.rstrip("\n") + rest.partition(CPU_END)[2]
    body_end = html.rfind("</body>")
    if body_end < 0:
        return html + "\n" + cpu_profile_section(index)
    return html[:body_end].rstrip("\n") + "\n" + cpu_profile_section(index) + "\n" + html[body_end:]


def render_html(report: Report | Mapping[str, Any], cpu_profile: dict[str, Any] | None = None) -> str:
    """report.html of ``report``: its records (the engine's anatomy and profile, the workload,
    the A/B) drawn by attribute; the findings as report.json lists them. ``report`` may also be a
    report.json as JSON (any doctor version's): it is read into its records first."""
    if not isinstance(report, Report):
        report = read_report(dict(report))
    env = report.environment
    profile = held(report, "profiles", "engine", EngineProfile) or EngineProfile()
    workload = held(report, "profiles", "workload", WorkloadRun)
    anatomy = held(report, "facts", "engine", EngineAnatomy)
    findings = [f.to_dict() for f in sorted(report.findings, key=report_order)]
    counts = Counter(f["outcome"] for f in findings)
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    layers_note = "" if profile.layers_on else f'<p class="note">{escape(str(profile.layers_reason or ""))}</p>'
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>vllm-doctor profile: {escape(str(report.target))}</title><style>{CSS}</style></head><body>",
        f'<h1>vllm-doctor profile</h1><div class="meta"><code>{escape(str(report.target))}</code><br>'
        f"vLLM {escape(str(env.get('vllm')))} | torch {escape(str(env.get('torch')))} | transformers "
        f"{escape(str(env.get('transformers')))} | vllm-doctor {escape(str(env.get('vllm_doctor')))} | timer: "
        f"{escape(clock_name(profile.clock))} | findings: {escape(summary)}</div>",
        '<h2 id="findings">Findings</h2>',
        findings_table(findings),
        '<h2 id="anatomy">Engine anatomy</h2>',
        anatomy_svg(anatomy),
        '<h2 id="steps">Steps: prefill vs decode</h2>',
        phases_table(profile, workload),
        step_chart(profile.steps),
        '<h2 id="roofline">Roofline: the step against the device\'s peak</h2>' if profile.roofline else "",
        roofline_table(profile),
        '<h2 id="layers">Forward time per layer</h2>',
        layers_note,
        layer_chart(profile.layers),
        ranks_table(profile),
        '<h2 id="kv">KV cache usage over the run</h2>',
        kv_chart(profile.kv_usage, profile.kv_num_blocks),
        '<h2 id="memory">Memory breakdown</h2>',
        memory_chart(profile.memory),
        twin_section(held(report, "profiles", "twin", TwinAB)),
        cpu_profile_section(cpu_profile) if cpu_profile else "",
        '<p class="note">Generated by vllm-doctor. Self-contained: no scripts, fonts or network requests.</p>',
        "</body></html>",
    ]
    return "\n".join(parts)
