"""Terminal rendering of the engine stage: anatomy, memory, per-step and per-layer summary."""

from __future__ import annotations

from typing import Any

from vllm_doctor.analysis.roofline import fmt_rate, phase_text
from vllm_doctor.analysis.twin_compare import fmt_ratio, kind_label, roofline_text
from vllm_doctor.units import clock_name, fmt_bytes, fmt_s


def _short(qualname: Any) -> str:
    return str(qualname).rsplit(".", 1)[-1] if qualname else "?"


def render_anatomy(anatomy: dict[str, Any]) -> str:
    """Which process holds what, the model's origin and the KV layout."""
    if not anatomy:
        return "engine anatomy: unavailable (the engine did not start)"
    fe = anatomy.get("front_end") or {}
    ex = anatomy.get("executor") or {}
    model = anatomy.get("model") or {}
    kv = anatomy.get("kv_cache") or {}
    runner = anatomy.get("model_runner") or {}
    comp = anatomy.get("compile") or {}
    lines = ["engine anatomy"]
    if fe.get("url"):
        version = f" (vLLM {fe['server_version']})" if fe.get("server_version") else ""
        lines.append(
            f"  front end     API server at {fe['url']}{version}, serving {', '.join(fe.get('served_models') or ['?'])}"
        )
    else:
        lines.append(
            f"  front end     pid {fe.get('pid')}: {_short(fe.get('llm_class'))} -> "
            f"{_short(fe.get('core_client_class'))}"
        )
    if fe.get("engine_core_in_process"):
        lines.append(f"  engine core   pid {fe.get('pid')} (in the front end's process)")
    else:
        lines.append(
            f"  engine core   pid {', '.join(str(p) for p in fe.get('engine_core_pids') or ['?'])} (own process)"
        )
    lines.append(
        f"  executor      {ex.get('backend') or '?'}" + (f" ({_short(ex.get('class'))})" if ex.get("class") else "")
    )
    for w in anatomy.get("workers") or []:
        lines.append(
            f"  worker {w.get('rank')}      pid {w.get('pid')} (parent {w.get('ppid')}), local rank "
            f"{w.get('local_rank')}, "
            f"device {w.get('device')}: {_short(w.get('worker_class'))} / {_short(w.get('model_runner_class'))}"
        )
    lines.append(f"  model runner  {runner.get('class')} ({runner.get('kind')})")
    lines.append(
        f"  model         {model.get('class')} [{model.get('origin')}]"
        + (f" from {model.get('file')}" if model.get("file") else "")
    )
    if comp:
        if comp.get("eager"):
            how = "eager"
        elif comp.get("compiled") and not comp.get("compiled_modules"):
            how = "uncompiled (no class of the model has @support_torch_compile; VD603)"
        else:
            how = "compiled"
        lines.append(
            f"  execution     {how} (torch.compile mode {comp.get('compilation_mode')}, "
            f"CUDA graphs {comp.get('cudagraph_mode')})"
        )
    if kv.get("num_blocks") is not None:
        lines.append(
            f"  KV cache      {kv.get('num_layers')} layer tensor(s) in {kv.get('num_storages')} storage(s), "
            f"{fmt_bytes(kv.get('storage_bytes'))}; {kv.get('num_blocks')} blocks x {kv.get('block_size')} tokens; "
            f"layout {kv.get('layout') or 'not exposed'}; shape {kv.get('tensor_shape')} {kv.get('dtype')}"
        )
        for g in kv.get("groups") or []:
            lines.append(
                f"                group: {g.get('layers')} layer(s), {g.get('type')}, {g.get('num_kv_heads')} KV "
                f"heads x {g.get('head_size')}, {g.get('dtype')}"
            )
    return "\n".join(lines)


def render_profile(profile: dict[str, Any], workload: dict[str, Any] | None = None) -> str:
    if not profile or not profile.get("steps"):
        return "forward profile: no steps recorded"
    lines = [
        f"forward profile: times on the {clock_name(profile.get('clock'))}, "
        f"per-layer {'on' if profile.get('layers_on') else 'off'}"
    ]
    if profile.get("layers_reason"):
        lines.append(f"  {profile['layers_reason']}")
    if workload:
        lines.append(
            f"  workload      {workload.get('prompts')} prompt(s) x {workload.get('input_len')} in / "
            f"{workload.get('output_len')} out: "
            f"{workload.get('generated_tokens')} tokens in {fmt_s(workload.get('wall_s'))} "
            f"({workload.get('output_tokens_per_s')} tok/s)"
        )
    accounting = profile.get("time_accounting")
    if accounting:
        lines.append(f"  time          {accounting_text(accounting)}")
    for phase, p in (profile.get("phases") or {}).items():
        share = p.get("forward_share")
        forward = fmt_s(p["forward_s_mean"]) + (f" ({100 * share:.0f}% of its steps)" if share is not None else "")
        lines.append(
            f"  {phase:<8}      {p['steps']} step(s), {p['tokens']} tokens, batch {p['mean_batch']}, step "
            f"{fmt_s(p['step_s_mean'])} mean "
            f"(p90 {fmt_s(p['step_s_p90'])}), forward {forward}"
        )
    kinds = (profile.get("layers") or {}).get("by_kind") or {}
    total = sum(kinds.values())
    if total:
        layers = profile.get("layers") or {}
        sampled = f" (per-layer timings of {layers.get('timed_steps')} of {len(profile.get('steps') or [])} steps)"
        lines.append("  by kind       " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in kinds.items()) + sampled)
    cost = doctor_cost_text(profile.get("doctor_overhead") or {})
    if cost:
        lines.append(f"  doctor cost   {cost}")
    usage = profile.get("kv_usage") or []
    if usage:
        peak = max(usage, key=lambda u: u["usage"])
        lines.append(
            f"  KV usage      peak {peak['blocks']} of {profile.get('kv_num_blocks')} blocks "
            f"({100 * peak['usage']:.2g}%)"
        )
    for m in profile.get("memory") or []:
        parts = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in (m.get("parts") or {}).items())
        lines.append(
            f"  memory (rank {m.get('rank')}) {parts} of {fmt_bytes(m.get('total'))} ({m.get('total_source')})"
        )
    roofline = render_roofline(profile)
    if roofline:
        lines.append(roofline)
    lines.extend(render_ranks(profile))
    return "\n".join(lines)


def accounting_text(acc: dict[str, Any]) -> str:
    """:func:`vllm_doctor.analysis.engine.time_accounting` in words."""
    head = (
        f"steps add up to {fmt_s(acc['steps_s'])} on the {clock_name(acc.get('clock')).split(' (')[0]} = "
        f"{100 * acc['share']:.0f}% of the workload's {fmt_s(acc['wall_s'])} wall time"
    )
    if acc.get("above_wall"):
        return head + ": DOCTOR BUG, one engine's steps cannot take longer than the workload (the step clock is wrong)"
    between = acc.get("between_steps_s")
    if between is None:
        return head + (
            f"; {fmt_s(acc['outside_steps_s'])} ran outside any step (scheduling, output processing: the engine's host)"
        )
    clock = clock_name(acc.get("clock")).split(" (")[0]
    idle = "the device stood idle " if acc.get("clock") == "cuda_events" else ""  # on CPU the host is the device
    text = (
        f"; between steps {idle}{fmt_s(between)} ({100 * between / acc['wall_s']:.0f}%, "
        f"{fmt_s(acc.get('between_steps_mean_s'))} a step on the {clock}: the engine's scheduling and output "
        f"processing on the host), {fmt_s(acc['edges_s'])} before the first step and after the last "
        f"(requests in, outputs out)"
    )
    return head + text


def render_ranks(profile: dict[str, Any]) -> list[str]:
    """Per-rank lines of a multi-rank profile, side by side, and the imbalance between ranks."""
    ranks = profile.get("per_rank") or []
    if len(ranks) < 2:
        return []
    lines = ["  per rank      rank  tp  pp  device    prefill fwd  decode fwd   slowest layer      KV storage"]
    for r in ranks:
        phases = r.get("phases") or {}
        slowest = max(r.get("by_layer") or [], key=lambda x: x.get("total_s", 0.0), default=None)
        slow_text = f"layer {slowest['layer']} {fmt_s(slowest['total_s'])}" if slowest else "n/a"
        lines.append(
            f"                {r.get('rank')!s:>4}  {r.get('tp_rank')!s:>2}  {r.get('pp_rank')!s:>2}  "
            f"{r.get('device')!s:<8}  {fmt_s((phases.get('prefill') or {}).get('forward_s_mean')):>11}  "
            f"{fmt_s((phases.get('decode') or {}).get('forward_s_mean')):>10}   {slow_text:<17}  "
            f"{fmt_bytes(r.get('kv_storage_bytes'))}"
        )
    for phase, imb in (profile.get("rank_imbalance") or {}).items():
        ratio = f"{imb['ratio']:.2f}x" if imb.get("ratio") else "n/a"
        lines.append(
            f"  imbalance     {phase}: rank {imb['slowest_rank']} is the slowest ({fmt_s(imb['slowest_s'])}), "
            f"rank {imb['fastest_rank']} the fastest ({fmt_s(imb['fastest_s'])}): {ratio}; the slowest rank sets "
            "the step"
        )
    return lines


def doctor_cost_text(over: dict[str, Any]) -> str:
    """``analysis.engine.doctor_overhead`` in words: per step, and of the worker's wall time."""
    if over.get("share") is None:
        return ""
    parts = ", ".join(
        f"{k.replace('_', ' ')} {fmt_s(v / over['steps'])}" for k, v in (over.get("host_s") or {}).items()
    )
    text = f"{fmt_s(over['per_step_s'])} host time per step = {100 * over['share']:.2g}% of the worker's step ({parts})"
    if over.get("worker_share") is not None:
        text += (
            f"; with the calls it served between steps ({fmt_s(over.get('rpc_s'))}), "
            f"{100 * over['worker_share']:.2g}% of the worker's {fmt_s(over.get('window_s'))}"
        )
    return text


def render_roofline(profile: dict[str, Any]) -> str:
    """``profile["roofline"]`` (analysis.roofline) in words: one line per phase, the timed
    layers' range, and every rate above the device's peak as the doctor bug it is."""
    roof = profile.get("roofline") or {}
    if not roof:
        return ""
    if not roof.get("available"):
        return f"  roofline      n/a: {roof.get('reason')}"
    peaks = roof.get("device") or {}
    lines: list[str] = []
    for phase, entry in (roof.get("phases") or {}).items():
        lines.append(f"  {'roofline' if not lines else '':<14}{phase_text(phase, entry, peaks)}")
    for bucket in ("prefill", "decode"):
        timed = [x for x in roof.get("layers") or [] if x.get("phase") == bucket and x.get("bytes_per_s") is not None]
        if not timed:
            continue
        rates = sorted(float(x["bytes_per_s"]) for x in timed)
        shares = sorted(float(x["bandwidth_share"]) for x in timed if x.get("bandwidth_share") is not None)
        span = fmt_rate(rates[0]) if len(rates) == 1 else f"{fmt_rate(rates[0])} to {fmt_rate(rates[-1])}"
        share = ""
        if len(shares) == len(timed):
            share = f" = {100 * shares[0]:.0f}" + (f"-{100 * shares[-1]:.0f}" if len(shares) > 1 else "") + " % of peak"
        lines.append(f"                {len(timed)} timed layer(s), {bucket}: {span}{share}")
    problems = [p for e in (roof.get("phases") or {}).values() for p in e.get("problems") or []]
    problems += [
        f"layer {x['layer']} ({x['phase']}): {p}" for x in roof.get("layers") or [] for p in x.get("problems") or []
    ]
    for p in problems[:4]:
        lines.append(f"  DOCTOR BUG    {p}")
    if len(problems) > 4:
        lines.append(f"                ... and {len(problems) - 4} more rate(s) above the peak")
    return "\n".join(lines)


def execution_text(state: dict[str, Any] | None) -> str:
    """How vLLM ran a side: ``compiled (torch.compile, CUDA graphs)``, ``uncompiled (in CUDA graphs)``
    (vLLM captures FULL graphs of a model it does not compile), ``uncompiled``."""
    if not state:
        return "?"
    graphs = bool(state.get("cudagraphs"))
    if state.get("compiled_modules"):
        return "compiled (torch.compile" + (", CUDA graphs)" if graphs else ")")
    return "uncompiled (in CUDA graphs)" if graphs else "uncompiled"


def render_twin(twin: dict[str, Any] | None) -> str:
    """``profiles["twin"]`` (analysis.twin_compare) in words: the port against vLLM's in-tree twin
    per phase, per layer kind and the largest gap; one line when there is no twin."""
    if not twin:
        return ""
    arch = twin.get("architecture")
    if twin.get("none"):
        head = f"twin A/B: vLLM's {arch}: " if arch else "twin A/B: "
        return head + str(twin["none"])
    match = twin.get("match") or {}
    how = "found from the checkpoint's layout" if match.get("how") == "auto" else "forced with --twin"
    weights = "the same weights" if match.get("weights") == "same" else "random weights on both (load_format=dummy)"
    clock = clock_name((twin.get("clock") or {}).get("port"))
    lines = [
        f"twin A/B: the port against vLLM's {arch} ({how}; {weights}), same workload, same mode; times on the {clock}"
    ]
    lines += [f"  note          {n}" for n in match.get("notes") or []]
    execution = twin.get("execution") or {}
    lines.append(
        f"  execution     port {execution_text(execution.get('port'))}, twin {execution_text(execution.get('twin'))}"
    )
    ratio = twin.get("throughput_ratio")
    lines.append(
        f"  throughput    port {_tok(twin.get('port_tok_s'))} tok/s, twin {_tok(twin.get('twin_tok_s'))} tok/s "
        f"(output tokens over the whole workload): twin/port = {fmt_ratio(ratio)}"
    )
    for phase, p in (twin.get("phases") or {}).items():
        lines.append(
            f"  {phase:<12}  step {fmt_s(p.get('port_step_s'))} vs {fmt_s(p.get('twin_step_s'))} = "
            f"{fmt_ratio(p.get('step_ratio'))}, forward {fmt_s(p.get('port_forward_s'))} vs "
            f"{fmt_s(p.get('twin_forward_s'))} = {fmt_ratio(p.get('forward_ratio'))}; "
            f"{_tok(p.get('port_tok_s'))} vs {_tok(p.get('twin_tok_s'))} tok/s"
        )
    roof = [roofline_text(phase, p) for phase, p in (twin.get("phases") or {}).items()]
    for i, text in enumerate(t for t in roof if t):
        lines.append(f"  {'roofline' if i == 0 else '':<14}{text}")
    kinds = twin.get("kinds") or {}
    if kinds:
        lines.append(f"  by kind       port vs twin per step timed per layer; {twin.get('kinds_basis')}")
        width = max(14, *(len(kind_label(kind)) + 1 for kind in kinds))
        for kind, k in kinds.items():
            per = "; ".join(
                f"{b} {fmt_s(e.get('port_s'))} vs {fmt_s(e.get('twin_s'))} = {fmt_ratio(e.get('ratio'))}"
                for b, e in (k.get("phases") or {}).items()
            )
            lines.append(f"    {kind_label(kind):<{width}}{per}")
    for text in twin.get("not_separable") or []:
        lines.append(f"  not separable {text}")
    gap = twin.get("largest_gap") or {}
    if gap.get("text"):
        lines.append(f"  largest gap   {gap['text']}")
    return "\n".join(lines)


def _tok(value: Any) -> str:
    return f"{float(value):.0f}" if value is not None else "n/a"
