"""What each panel of ``top`` draws, as pure functions of a frame (no I/O, no clock).

Every function takes a :class:`~vllm_doctor.live.sources.Frame` and the panel's width and
returns a ``rich.text.Text``; stale frames are drawn dim (the numbers are frozen at the last
good scrape), unknown numbers as ``–``.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from vllm_doctor.analysis.records import DevicePeaks, RooflinePhase
from vllm_doctor.analysis.roofline import fmt_rate, phase_text
from vllm_doctor.live.derive import HISTOGRAMS, LatencyStat, MetricsFrame, fmt_latency
from vllm_doctor.live.sources import MODEL_SAMPLE_EVERY, Frame, ModelSummary
from vllm_doctor.units import clock_name, fmt_bytes, fmt_s

BARS = "▁▂▃▄▅▆▇█"
DASH = "–"
LAT_LABELS = {"ttft": "TTFT", "itl": "inter-tok", "e2e": "end-to-end", "queue": "queue"}
SHORT_LABELS = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E", "queue": "queue"}


def num(value: float | None, fmt: str = "{:.1f}", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return fmt.format(value) + unit


def spark(values: Sequence[float | None], restarts: Sequence[bool], width: int, scale: float | None = None) -> Text:
    """A sparkline of the last ``width`` values: gaps stay blank, restarts are a red ``│``.

    Bars are relative to the largest value shown, or to ``scale`` (a fraction's 1.0: a KV cache
    at 0.2 % stays a flat line, not full bars).
    """
    width = max(1, width)
    vals = list(values)[-width:]
    marks = list(restarts)[-len(vals) :] if restarts else [False] * len(vals)
    marks = [False] * (len(vals) - len(marks)) + marks
    finite = [v for v in vals if v is not None]
    top = scale if scale is not None else (max(finite) if finite else 0.0)
    out = Text(" " * (width - len(vals)))
    run: list[str] = []  # consecutive bars go in as one span (drawing cost grows with spans)
    for v, restart in zip(vals, marks, strict=True):
        if v is not None and not restart:
            run.append(BARS[0 if top <= 0 else min(len(BARS) - 1, int(v / top * (len(BARS) - 1) + 0.5))])
            continue
        if run:
            out.append("".join(run), style="green")
            run = []
        out.append("│" if restart else " ", style="bold red" if restart else "")
    if run:
        out.append("".join(run), style="green")
    return out


def bar(fraction: float | None, width: int) -> Text:
    width = max(4, width)
    if fraction is None:
        return Text("·" * width, style="dim")
    filled = round(max(0.0, min(1.0, fraction)) * width)
    style = "red" if fraction >= 0.9 else "yellow" if fraction >= 0.7 else "green"
    out = Text()
    out.append("█" * filled, style=style)
    out.append("·" * (width - filled), style=f"{style} dim")  # spans in order, none overlapping
    return out


def _line(text: Text, label: str, value: str, style: str = "bold") -> None:
    text.append(f"{label:<14}", style="cyan")
    text.append(value + "\n", style=style)


def _value_style(m: MetricsFrame) -> str:
    return "dim" if m.stale else "bold"


def engine_panel(frame: Frame, width: int) -> Text:
    m = frame.metrics
    v, st = m.values, _value_style(m)
    out = Text()
    _line(out, "running", num(v.get("running"), "{:.0f}"), st)
    out.append_text(spark(m.history.get("running", ()), m.history_restarts, max(8, width - 2)))
    out.append("\n")
    _line(out, "waiting", num(v.get("waiting"), "{:.0f}"), st)
    out.append_text(spark(m.history.get("waiting", ()), m.history_restarts, max(8, width - 2)))
    out.append("\n")
    preempt = num(v.get("preemptions"), "{:.0f}") + "  (" + num(m.rates.get("preempt_ps"), "{:.2f}", "/s") + ")"
    _line(out, "preempted", preempt, st)
    _line(out, "restarts seen", str(m.restarts), "bold red" if m.restarts else st)
    start = v.get("start_time")
    _line(out, "server up", fmt_duration(frame.t - start) if start else DASH, st)
    if m.parse_errors:
        out.append(f"{m.parse_errors} unreadable /metrics line(s)\n", style="yellow")
    return out


def fmt_duration(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def throughput_panel(frame: Frame, width: int) -> Text:
    m = frame.metrics
    st = _value_style(m)
    out = Text()
    spark_w = max(8, width - 2)
    for key, label, unit in (
        ("gen_tps", "generation", " tok/s"),
        ("prompt_tps", "prompt", " tok/s"),
        ("req_ps", "requests", " req/s"),
    ):
        value = num(m.rates.get(key), "{:.1f}", unit)
        # the server's interval between the scrapes is uncertain (replies late): at least this
        _line(out, label, f"≥ {value}" if m.rates_lower_bound and value != DASH else value, st)
        out.append_text(spark(m.history.get(key, ()), m.history_restarts, spark_w))
        out.append("\n")
    return out


def latency_text(stat: LatencyStat | None) -> tuple[str, str, str, str]:
    """(n, p50, p90, p99) cells for one histogram."""
    if stat is None:
        return ("n/a", DASH, DASH, DASH)
    if stat.n == 0:
        return ("0", DASH, DASH, DASH)
    qs = {round(q.q * 100): q.text() for q in stat.quantiles}
    return (str(stat.n), qs.get(50, DASH), qs.get(90, DASH), qs.get(99, DASH))


def latency_panel(frame: Frame, width: int, detail: bool = False) -> Text:
    m = frame.metrics
    st = _value_style(m)
    out = Text()
    span = max((s.span_s for s in m.latency.values() if s is not None), default=0.0)
    head = f"last {fmt_duration(span)}" if span else "collecting"
    out.append(f"window {fmt_duration(m.window_s)} ({head})\n", style="dim")
    # the long labels where their table fits (47 columns, 44 with narrower quantile columns: a
    # 100-column terminal's panel has 46), else short labels (80 columns: a 36-column table)
    wide = width >= 11 + 6 + 3 * 9
    lw, nw, pw = (11, 6, 10 if width >= 11 + 6 + 3 * 10 else 9) if wide else (6, 6, 8)
    out.append(f"{'':<{lw}}{'n':>{nw}}{'p50':>{pw}}{'p90':>{pw}}{'p99':>{pw}}\n", style="cyan")
    for key in HISTOGRAMS:
        n, p50, p90, p99 = latency_text(m.latency.get(key))
        if not wide:
            p50, p90, p99 = (c.replace("< ", "<").replace(" ms", "ms").replace(" s", "s") for c in (p50, p90, p99))
        out.append(f"{(LAT_LABELS if wide else SHORT_LABELS)[key]:<{lw}}", style="cyan")
        out.append(f"{n:>{nw}}{p50:>{pw}}{p90:>{pw}}{p99:>{pw}}\n", style=st)
    firsts = sorted({s.first_bound for s in m.latency.values() if s is not None and s.n})
    if firsts:
        out.append("'<' = inside the first bucket\n", style="dim")
    if detail:
        for key in HISTOGRAMS:
            stat = m.latency.get(key)
            if stat is None:
                continue
            mean = fmt_latency(stat.mean_s) if stat.mean_s is not None else DASH
            out.append(f"{LAT_LABELS[key]}: mean {mean}, first bucket {fmt_latency(stat.first_bound)}; ", style="dim")
            for q in stat.quantiles:
                hi = "+Inf" if math.isinf(q.hi) else fmt_latency(q.hi)
                out.append(f"p{round(q.q * 100)} in [{fmt_latency(q.lo)}, {hi}] ", style="dim")
            out.append("\n")
    return out


def kv_panel(frame: Frame, width: int) -> Text:
    m = frame.metrics
    st = _value_style(m)
    usage = m.values.get("kv_usage")
    out = Text()
    _line(out, "usage", num(usage * 100 if usage is not None else None, "{:.1f}", " %"), st)
    out.append_text(bar(usage, max(8, width - 2)))
    out.append("\n")
    blocks = m.kv_blocks
    used = f"{usage * blocks:.0f} / {blocks}" if usage is not None and blocks else num(blocks, "{:.0f}")
    _line(out, "blocks", used + (f" × {m.block_size} tok" if m.block_size else ""), st)
    hit = m.prefix_hit_rate
    _line(out, "prefix hits", num(hit * 100 if hit is not None else None, "{:.1f}", " %") + " (window)", st)
    out.append_text(spark(m.history.get("kv_usage", ()), m.history_restarts, max(8, width - 2), scale=1.0))
    out.append("\n")
    return out


def devices_panel(frame: Frame, width: int) -> Text:
    d = frame.devices
    out = Text()
    if d is None:
        out.append("device sampling is off\n", style="dim")
        return out
    if not d.nvml_available or not d.gpus:
        out.append("no NVML: ", style="yellow")
        out.append(str(d.nvml_reason or "no NVIDIA GPU") + "\n", style="dim")
    for g in d.gpus:
        util = num(g.util_gpu_pct, "{:.0f}", "%")
        mem = f"{fmt_bytes(g.mem_used)}/{fmt_bytes(g.mem_total)}"
        out.append(f"GPU{g.index} ", style="cyan")
        out.append(f"{str(g.name or '')[:20]}\n", style="dim")
        out.append(f" util {util} mem {mem}\n", style="bold")
        power = f"{num(g.power_w, '{:.0f}')}/{num(g.power_limit_w, '{:.0f}')} W"
        clocks = f"sm {num(g.sm_clock_mhz, '{:.0f}')} MHz"
        out.append(f" {power} {num(g.temp_c, '{:.0f}', '°C')} {clocks}\n")
        for p in g.processes[:4]:
            out.append(f"  pid {p.pid} {str(p.name or '')[:16]} {fmt_bytes(p.used_memory)}\n", style="dim")
    if d.processes:
        out.append(f"{'pid':>7} {'role':<12} {'cpu%':>6} {'rss':>11} {'thr':>4}\n", style="cyan")
        for q in d.processes[:8]:
            out.append(
                f"{q.pid:>7} {str(q.role or '')[:12]:<12} {num(q.cpu_pct, '{:.0f}'):>6} "
                f"{fmt_bytes(q.rss):>11} {num(q.threads, '{:.0f}'):>4}\n"
            )
    elif not d.gpus:
        out.append("no engine processes known yet\n", style="dim")
    return out


def model_panel(frame: Frame, width: int) -> Text:
    out = Text()
    if frame.model is None:
        out.append("model channel off (start the server with VLLM_DOCTOR=1, as this user)\n", style="dim")
        return out
    model = frame.model
    if not model.available and not model.steps:
        out.append((model.reason or "not available") + "\n", style="dim")
        return out
    if model.model_class:
        out.append(model.model_class.rsplit(".", 1)[-1], style="bold")
        if model.window_s is not None:
            quiet = model.quiet_s
            window = f"{model.window_s:.0f} s"
            out.append(f"  idle; last steps {quiet:.0f} s ago ({window})" if quiet else f"  last {window}", style="dim")
        out.append("\n")
    if model.clock and model.phases:
        out.append(clock_line(model)[:width] + "\n", style="dim")
    for phase, p in model.phases.items():
        out.append(f"{phase:<8}", style="cyan")
        if p.forward_steps_step_s_mean is not None:  # the forward beside the step time of the same steps
            out.append(f"{p.steps:>5} steps  fwd {fmt_s(p.forward_s_mean)} of {fmt_s(p.forward_steps_step_s_mean)}\n")
        else:
            fwd = DASH if p.forward_s_mean is None else fmt_s(p.forward_s_mean)
            out.append(f"{p.steps:>5} steps  fwd {fwd}  p50 step {fmt_s(p.step_s_p50)}\n")
    why = forward_missing(model)
    for line in textwrap.wrap(f"fwd {DASH}: {why}" if why else "", max(20, width), subsequent_indent="  ")[:3]:
        out.append(line + "\n", style="dim")  # the reason whole, on as many rows as it takes (at most 3)
    for phase, p in model.phases.items():  # a multimodal model's encoder, where a phase ran it
        if p.encoder_steps and p.encoder_s is not None and p.encoder_step_s:
            out.append("encoder ", style="cyan")
            share = 100 * p.encoder_s / p.encoder_step_s
            line = f"{phase} {fmt_s(p.encoder_s)} in {p.encoder_steps} step(s) = {share:.0f} %"
            out.append((line if len(line) + 8 <= width else line.split(" = ")[0])[: width - 8] + "\n")
    if model.slowest_layers:
        # per step timed per layer, as the forward beside them; a recording without the count
        # says what its numbers are: each layer's sum over the window's timed steps
        n = model.layers_timed_steps
        label = "slowest layers/step: " if n else "slowest layers, window sum: "
        shown = [f"#{x.layer} {fmt_s(x.total_s / (n or 1))}" for x in model.slowest_layers[:3]]
        while len(shown) > 1 and len(label) + len(" · ".join(shown)) > width:
            shown.pop()  # fewer layers rather than a cut number
        out.append(label, style="cyan")
        out.append(" · ".join(shown) + "\n")
    roof = model.roofline
    for phase, entry in (roof.phases if roof is not None else {}).items():
        out.append("roofline ", style="cyan")
        line = roofline_text(phase, entry, roof.device if roof is not None else DevicePeaks(), width - len("roofline "))
        out.append(line + "\n", style="bold red" if entry.above_peak else "")
    kv = model.kv
    if kv.storage_bytes:
        out.append("KV ", style="cyan")
        line = f"{fmt_bytes(kv.storage_bytes)} in {kv.num_blocks} blocks ({kv.dtype})"
        if kv.capacity_tokens is not None:  # vLLM's own capacity (its start-up line)
            at = (
                f", {kv.max_concurrency:.1f} requests of {kv.max_model_len:,}"
                if kv.max_concurrency and kv.max_model_len
                else ""
            )
            line = f"{fmt_bytes(kv.storage_bytes)}: {kv.capacity_tokens:,} tokens{at} ({kv.dtype})"
            if len(line) + 3 > width:  # drop a part rather than crop a number
                line = f"{fmt_bytes(kv.storage_bytes)}: {kv.capacity_tokens:,} tokens"
        out.append(line + "\n")
    doctor = model.doctor
    if doctor is not None and doctor.worker_share is not None:
        # what the doctor's own code took in the worker this window: its share bounds its cost
        # (the calls' own time only where the line has room: a cropped line reads as a cut number)
        line = f"{100 * doctor.worker_share:.2g} % of the worker, {fmt_s(doctor.per_step_s)}/step"
        calls = f", calls {fmt_s(doctor.rpc_s)}"
        if doctor.own_budget and doctor.samples_skipped:  # the budget widened the sampling this window
            calls += f", {doctor.samples_skipped:,} samples skipped (budget {100 * doctor.own_budget:.2g} %)"
        out.append("doctor ", style="cyan")
        out.append(line + (calls if len("doctor ") + len(line) + len(calls) <= width else "") + "\n", style="dim")
    if not model.findings:
        out.append("no VD4xx/VD5xx findings\n", style="green")
    for f in model.findings[:4]:
        style = "red" if f.severity == "error" else "yellow"
        out.append(f"{f.code} ", style=style)
        out.append(f"{str(f.message)[: max(20, width - 8)]}\n")
        if f.hint:
            out.append(f"  fix: {f.hint[: max(20, width - 9)]}\n", style="dim")
    return out


def clock_line(model: ModelSummary) -> str:
    """The clock the panel's times are on, and on how many of the window's steps where not all
    (the sampled step clock on a GPU: the sampled steps, the step after each, every 32nd and a window's first on the
    device's clock; the step means count the others at the mean of the unsampled ones on it)."""
    steps = sum(p.steps for p in model.phases.values())
    on = sum(p.steps if p.clock_steps is None else p.clock_steps for p in model.phases.values())
    text = f"times on the {clock_name(model.clock)}"
    return text if on >= steps else text + f", {on} of {steps} steps (the rest at their mean)"


def forward_missing(model: ModelSummary) -> str:
    """Why a phase line says ``fwd –`` ("" when every phase has its forward): the server's mode
    has no forward the doctor times (vLLM's compiled root model, no full CUDA graph), or no step
    of that phase in this window was one of the sampled ones."""
    missing = [phase for phase, p in model.phases.items() if p.forward_s_mean is None and p.steps]
    if not missing:
        return ""
    every = model.sample_every or MODEL_SAMPLE_EVERY
    compiled = model.mode not in (None, "eager")
    # a phase with this many steps had one sampled: its forward is not timed at all
    if (compiled and len(missing) == len(model.phases)) or any(model.phases[p].steps >= every for p in missing):
        where = f"under {model.mode}" if compiled else "on this server"
        return f"not timed {where} (the doctor times the forward in eager mode)"
    return f"no {'/'.join(missing)} step sampled in this window (1 step in {every} is)"


def roofline_text(phase: str, entry: RooflinePhase, peaks: DevicePeaks, room: int) -> str:
    """The longest of the roofline's forms that fits ``room`` cells: the sentence with the
    step's bytes, then the share and the rate, then the share alone (never a cut number)."""
    full = phase_text(phase, entry, peaks, short=True)  # decode 41 % of 4.81 TB/s (1.97 TB/s: weights ...)
    head = full.split(" (", 1)[0] if not entry.above_peak else f"{phase} {fmt_rate(entry.bytes_per_s)}"
    rate = f" ({fmt_rate(entry.bytes_per_s)})" if entry.bandwidth_share is not None else ""
    forms = [full, head + rate, head] if not entry.above_peak else [full, f"{head}: above peak, step time wrong", head]
    return next((f for f in forms if len(f) <= room), forms[-1][: max(1, room)])


LEVELS = " ▁▂▃▄▅▆▇█"
HISTORY_BUCKET = 5  # refreshes per column of the tall charts
CHART_ROWS = 12
HISTORY_GAP = 3  # columns between the charts
CHARTS = (
    ("gen_tps", "generation tok/s", None),
    ("running", "running requests", None),
    ("kv_usage", "KV cache usage", 1.0),
)


def buckets(
    values: Sequence[float | None], restarts: Sequence[bool], seq: int, bucket: int, columns: int
) -> list[tuple[float | None, bool]]:
    """The newest ``columns`` whole buckets of ``bucket`` refreshes: (mean, a restart inside).

    Buckets are aligned on the refresh count ``seq``, so a column changes only when its bucket
    is complete (the charts move once every ``bucket`` refreshes, not every refresh); a bucket
    with no value is a gap.
    """
    vals = list(values)
    marks = list(restarts)[-len(vals) :] if restarts else []
    marks = [False] * (len(vals) - len(marks)) + marks
    cut = len(vals) - (seq % bucket)  # drop the bucket still filling
    out: list[tuple[float | None, bool]] = []
    end = cut
    while end - bucket >= 0 and len(out) < columns:
        chunk = [v for v in vals[end - bucket : end] if v is not None]
        out.append((sum(chunk) / len(chunk) if chunk else None, any(marks[end - bucket : end])))
        end -= bucket
    return out[::-1]


def tall_chart(cols: Sequence[tuple[float | None, bool]], width: int, rows: int, scale: float | None) -> list[Text]:
    """``rows`` lines of block bars (8 levels a row), newest on the right; gaps blank, restarts red."""
    finite = [v for v, _ in cols if v is not None]
    top = scale if scale is not None else (max(finite) if finite else 0.0)
    pad = max(0, width - len(cols))
    lines = []
    for r in range(rows):
        floor = (rows - 1 - r) * 8
        cells = []
        for v, restart in cols:
            if restart:
                cells.append("│")
            elif v is None or top <= 0:
                cells.append(" ")
            else:
                eighths = round(max(0.0, min(1.0, v / top)) * rows * 8)
                cells.append(LEVELS[max(0, min(8, eighths - floor))])
        line = Text(" " * pad)
        line.append("".join(cells), style="green")
        for i, (_, restart) in enumerate(cols):
            if restart:
                line.stylize("bold red", pad + i, pad + i + 1)
        lines.append(line)
    return lines


def _chart_width(width: int) -> int:
    return max(10, (width - HISTORY_GAP * (len(CHARTS) - 1)) // len(CHARTS))


def chart_rows(content_height: int) -> int:
    """The tall charts' rows in a history panel ``content_height`` rows high (its head, foot and
    legend take 3): the panel fills the screen's last grid row; never fewer than CHART_ROWS."""
    return max(CHART_ROWS, content_height - 3)


def history_key(frame: Frame, width: int) -> tuple[Any, ...]:
    """Everything :func:`history_panel` draws from: equal keys, equal panels (it is redrawn only
    when a bucket completes, the width or the interval changes)."""
    chart_w = _chart_width(width)
    m = frame.metrics
    cols = tuple(
        tuple(buckets(m.history.get(key, ()), m.history_restarts, frame.seq, HISTORY_BUCKET, chart_w))
        for key, _, _ in CHARTS
    )
    return (width, frame.interval_s, cols)


def history_panel(frame: Frame, width: int, rows: int = CHART_ROWS) -> Text:
    """Tall charts of the last minutes (a 160x48 terminal's lower half), one column per
    ``HISTORY_BUCKET`` refreshes: generation throughput, running requests, KV cache usage;
    ``rows`` high (:func:`chart_rows`)."""
    gap = HISTORY_GAP
    chart_w = _chart_width(width)
    blocks = []
    for (key, label, scale), cols in zip(CHARTS, history_key(frame, width)[2], strict=True):
        finite = [v for v, _ in cols if v is not None]
        top = scale if scale is not None else (max(finite) if finite else None)
        if key == "kv_usage":  # bars of the whole cache; the label says the peak, not the scale
            peak = max(finite) * 100 if finite else None
            top_s = "–" if peak is None else f"{peak:.{2 if peak < 1 else 1}f} % (scale 100 %)"
        else:
            top_s = num(top, "{:.1f}" if (top or 0) < 100 else "{:.0f}")
        head = Text(f"{label}", style="cyan")
        head.append(f"  max {top_s}"[: max(0, chart_w - len(label))], style="dim")
        span_s = len(cols) * HISTORY_BUCKET * frame.interval_s
        axis = f"-{fmt_duration(span_s)}" if cols else "collecting"
        foot = Text(f"{axis:<{max(1, chart_w - 3)}}now"[:chart_w], style="dim")
        blocks.append([head, *tall_chart(cols, chart_w, rows, scale), foot])
    out = Text()
    for row in zip(*blocks, strict=True):
        for i, cell in enumerate(row):
            piece = cell.copy()
            piece.truncate(chart_w, pad=True)
            out.append_text(piece)
            if i < len(row) - 1:
                out.append(" " * gap)
        out.append("\n")
    bucket_s = HISTORY_BUCKET * frame.interval_s
    out.append(f"one column = {bucket_s:g} s (mean of {HISTORY_BUCKET} refreshes); │ = a restart\n", style="dim")
    return out


PANELS = {
    "engine": ("engine", engine_panel),
    "throughput": ("throughput", throughput_panel),
    "latency": ("latency", latency_panel),
    "kv": ("KV cache", kv_panel),
    "devices": ("GPUs / processes", devices_panel),
    "model": ("model (from inside)", model_panel),
    "history": ("history", history_panel),
}
# drawn first when the terminal is small (80x24): the four engine panels
PRIORITY = ("engine", "throughput", "latency", "kv", "devices", "model", "history")
