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
from typing import Any

from vllm_doctor.analysis.roofline import fmt_rate
from vllm_doctor.units import fmt_s

BUCKETS = ("prefill", "decode")  # the per-layer profiler's buckets: prefill = prefill and mixed steps
TIMING_MODULES, TIMING_CALLS = "modules", "attention calls"

# the kinds compared, by how each side was timed: (kind, the profiler's kinds summed, what it holds)
KindTable = tuple[tuple[str, tuple[str, ...], str], ...]
KINDS_BOTH_MODULES: KindTable = (
    ("embedding", ("embedding",), "the token embedding"),
    ("attention", ("attention",), "the self-attention module: q/k/v and output projections, rotary, the attention op"),
    ("mlp", ("mlp",), "the MLP module"),
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
DECODER = ("embedding", "attention", "mlp", "norm", "dense", "other")
KINDS_MIXED: KindTable = (
    ("decoder", DECODER, "the forward before the logits: embedding, every decoder layer, the final norm"),
    ("logits", ("logits",), "the logits processor (LM head)"),
)
LABELS = {"mlp": "MLP", "decoder": "decoder stack", "dense": "dense span (projections, norms, MLP)"}


def fmt_ratio(ratio: float | None) -> str:
    """``2.40x``, ``76x``; ``n/a`` for None."""
    if ratio is None:
        return "n/a"
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2f}x"


def kind_label(kind: str | None) -> str:
    return LABELS.get(kind or "", kind or "step")


def timing_of(engine: Mapping[str, Any]) -> str | None:
    """How a side's layers were timed: per module (eager), at the attention calls (torch.compile or
    CUDA graphs: no Python runs between them), or
    None (no per-layer timing)."""
    modules = (engine.get("layers") or {}).get("modules") or []
    if not modules:
        return None
    return TIMING_CALLS if any(m.get("kind") == "dense" for m in modules) else TIMING_MODULES


def _bucket_of(phase: str) -> str:
    return "decode" if phase == "decode" else "prefill"


def per_step_kinds(engine: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per bucket: the profiler's kinds in seconds per step timed per layer (``other``: the
    forward of those steps outside every kind). Empty where nothing was timed per layer."""
    modules = (engine.get("layers") or {}).get("modules") or []
    steps = engine.get("steps") or []
    out: dict[str, dict[str, float]] = {}
    for bucket in BUCKETS:
        timed = [s for s in steps if s.get("layers_timed") and _bucket_of(str(s.get("phase"))) == bucket]
        n = len(timed) or max(
            (int(m.get(f"{bucket}_calls") or 0) for m in modules if m.get("kind") == "layer"), default=0
        )
        if not n:
            continue
        kinds: dict[str, float] = {}
        for m in modules:
            kind = m.get("kind")
            if kind in ("layer", "model", None):
                continue
            kinds[kind] = kinds.get(kind, 0.0) + float(m.get(f"{bucket}_s") or 0.0)
        forward = [float(s["forward_s"]) for s in timed if s.get("forward_s") is not None]
        per_step = {k: v / n for k, v in kinds.items()}
        if forward:
            inside = sum(v for k, v in per_step.items() if k != "logits")
            mean = sum(forward) / len(forward)
            rest = mean - inside
            # a residue of float rounding (the spans tile the forward in compiled modes) is no time
            per_step["other"] = rest if rest > 1e-6 * mean else 0.0
        out[bucket] = per_step
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (a > 0 and b > 0) or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return a / b


def kind_table(port: Mapping[str, Any], twin: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], str]:
    """The kinds both sides can be compared on, the kinds they cannot (with why), and the basis."""
    tp, tt = timing_of(port), timing_of(twin)
    rotary = "rotary: timed inside the attention on both sides (the profiler has no rotary span)"
    if tp is None or tt is None:
        side = " and ".join(n for n, t in (("the port", tp), ("the twin", tt)) if t is None)
        return {}, [f"every kind: no per-layer timing on {side} (per-layer timing off)"], "none"
    if tp == tt == TIMING_MODULES:
        table, not_sep = KINDS_BOTH_MODULES, [rotary]
        basis = "both timed per module (run eagerly)"
    elif tp == tt == TIMING_CALLS:
        table = KINDS_BOTH_CALLS
        not_sep = [
            "mlp, norms: inside the span between two attention ops on both sides (kind dense)",
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
    pk, tk = per_step_kinds(port), per_step_kinds(twin)
    port_steps = _timed_steps(port)
    twin_steps = _timed_steps(twin)
    kinds: dict[str, Any] = {}
    for kind, parts, covers in table:
        entry: dict[str, Any] = {"covers": covers, "phases": {}}
        totals = {"port": 0.0, "twin": 0.0}
        seen = False
        for bucket in BUCKETS:
            if bucket not in pk or bucket not in tk:
                continue
            ps = sum(pk[bucket].get(p, 0.0) for p in parts)
            ts = sum(tk[bucket].get(p, 0.0) for p in parts)
            if ps <= 0 and ts <= 0:
                continue
            seen = True
            entry["phases"][bucket] = {"port_s": ps, "twin_s": ts, "ratio": _ratio(ps, ts)}
            totals["port"] += ps * port_steps.get(bucket, 0)
            totals["twin"] += ts * twin_steps.get(bucket, 0)
        if not seen:
            continue
        n_port = sum(port_steps.get(b, 0) for b in entry["phases"]) or 1
        n_twin = sum(twin_steps.get(b, 0) for b in entry["phases"]) or 1
        entry["port_s"], entry["twin_s"] = totals["port"] / n_port, totals["twin"] / n_twin
        entry["ratio"] = _ratio(entry["port_s"], entry["twin_s"])
        kinds[kind] = entry
    return kinds, not_sep, basis


def _timed_steps(engine: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in engine.get("steps") or []:
        if s.get("layers_timed"):
            b = _bucket_of(str(s.get("phase")))
            out[b] = out.get(b, 0) + 1
    return out


def roofline_entry(engine: Mapping[str, Any], phase: str) -> dict[str, Any] | None:
    """A side's roofline of one phase, as the A/B carries it (rate, share of peak, the peak)."""
    roof = engine.get("roofline") or {}
    entry = (roof.get("phases") or {}).get(phase)
    if not roof.get("available") or not entry:
        return None
    return {
        "bytes_per_s": entry.get("bytes_per_s"),
        "bandwidth_share": entry.get("bandwidth_share"),
        "peak_bytes_s": (roof.get("device") or {}).get("bandwidth_bytes_s"),
        "flops_per_s": entry.get("flops_per_s"),
        "compute_share": entry.get("compute_share"),
        "above_peak": bool(entry.get("above_peak")),
    }


def _compiled(compile_state: Mapping[str, Any] | None) -> bool | None:
    """Did vLLM torch.compile the model (a module with ``@support_torch_compile``)?"""
    if not compile_state:
        return None
    return bool(compile_state.get("compiled_modules"))


def _cuda_graphs(compile_state: Mapping[str, Any] | None) -> bool | None:
    """Did vLLM capture CUDA graphs (it does for an uncompiled model too: FULL graphs)?"""
    if not compile_state:
        return None
    return bool(compile_state.get("cudagraphs"))


def phase_table(port: Mapping[str, Any], twin: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pp, tp = port.get("phases") or {}, twin.get("phases") or {}
    for phase in ("prefill", "decode", "mixed"):
        a, b = pp.get(phase), tp.get(phase)
        if not a or not b:
            continue
        out[phase] = {
            "port_steps": a.get("steps"),
            "twin_steps": b.get("steps"),
            "port_step_s": a.get("step_s_mean"),
            "twin_step_s": b.get("step_s_mean"),
            "step_ratio": _ratio(a.get("step_s_mean"), b.get("step_s_mean")),
            "port_forward_s": a.get("forward_s_mean"),
            "twin_forward_s": b.get("forward_s_mean"),
            "forward_ratio": _ratio(a.get("forward_s_mean"), b.get("forward_s_mean")),
            "port_tok_s": a.get("tokens_per_s"),
            "twin_tok_s": b.get("tokens_per_s"),
            "throughput_ratio": _ratio(b.get("tokens_per_s"), a.get("tokens_per_s")),
            "port_roofline": roofline_entry(port, phase),
            "twin_roofline": roofline_entry(twin, phase),
        }
    return out


def largest_gap(phases: Mapping[str, Any], kinds: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """Where the port loses the most time against the twin over the workload: per (phase, kind)
    the per-step excess times the port's steps of that phase; the phases' step times where no
    kind compares."""
    steps = {b: 0 for b in BUCKETS}
    for phase, p in phases.items():
        steps[_bucket_of(phase)] += int(p.get("port_steps") or 0)
    # (excess over the workload, phase, kind, port s, twin s, steps)
    candidates: list[tuple[float, str, str | None, float, float, int]] = []
    for kind, entry in kinds.items():
        for bucket, e in (entry.get("phases") or {}).items():
            if e.get("ratio") is not None:
                n = steps.get(bucket, 0)
                candidates.append(((e["port_s"] - e["twin_s"]) * n, bucket, kind, e["port_s"], e["twin_s"], n))
    if not candidates:
        for phase, p in phases.items():
            if p.get("step_ratio") is not None:
                n = int(p.get("port_steps") or 0)
                candidates.append(
                    ((p["port_step_s"] - p["twin_step_s"]) * n, phase, None, p["port_step_s"], p["twin_step_s"], n)
                )
    who = f"vLLM's {architecture}"
    if not candidates:
        return {
            "phase": None,
            "kind": None,
            "ratio": None,
            "text": f"nothing to compare with {who} (no phase ran on both)",
        }
    excess, where, gap_kind, port_s, twin_s, n = max(candidates, key=lambda c: c[0])
    ratio = port_s / twin_s
    if excess <= 0:
        text = f"no gap: the port is as fast as {who} or faster in every phase and kind compared"
    else:
        text = (
            f"{where} {kind_label(gap_kind)} {fmt_ratio(ratio)} slower than {who} ({fmt_s(port_s)} vs "
            f"{fmt_s(twin_s)} per step; about {fmt_s(excess)} over the workload's {n} {where} step(s))"
        )
    return {
        "phase": where,
        "kind": gap_kind,
        "ratio": ratio,
        "port_s": port_s,
        "twin_s": twin_s,
        "excess_s": excess,
        "text": text,
    }


def compare_runs(
    port: Mapping[str, Any], twin: Mapping[str, Any], architecture: str, match: Mapping[str, Any]
) -> dict[str, Any]:
    """``profiles["twin"]`` from the two runs. Each side: ``{"engine": profiles["engine"],
    "workload": profiles["workload"], "compile": facts["engine"]["compile"]}``; ``match``: how the
    twin was found (``how``, ``weights``, ``notes``)."""
    pe, te = port.get("engine") or {}, twin.get("engine") or {}
    phases = phase_table(pe, te)
    kinds, not_separable, basis = kind_table(pe, te)
    pw, tw = port.get("workload") or {}, twin.get("workload") or {}
    port_tok, twin_tok = pw.get("output_tokens_per_s"), tw.get("output_tokens_per_s")
    return {
        "architecture": architecture,
        "match": dict(match),
        "compiled": {"port": _compiled(port.get("compile")), "twin": _compiled(twin.get("compile"))},
        "cuda_graphs": {"port": _cuda_graphs(port.get("compile")), "twin": _cuda_graphs(twin.get("compile"))},
        "execution": {"port": port.get("compile"), "twin": twin.get("compile")},
        "clock": {"port": pe.get("clock"), "twin": te.get("clock")},
        "workload": {k: pw.get(k) for k in ("prompts", "input_len", "output_len")},
        "port_tok_s": port_tok,
        "twin_tok_s": twin_tok,
        "throughput_ratio": _ratio(twin_tok, port_tok),
        "phases": phases,
        "kinds": kinds,
        "kinds_basis": basis,
        "kinds_per": "second per step timed per layer (the first steps of each phase, then every n-th); "
        "prefill holds prefill and mixed steps",
        "not_separable": not_separable,
        "largest_gap": largest_gap(phases, kinds, architecture),
    }


def roofline_text(phase: str, entry: Mapping[str, Any]) -> str:
    """``port: decode 23 % of 4.81 TB/s; twin: 41 %`` (on a device with a known peak), else the rates."""
    port, twin = entry.get("port_roofline") or {}, entry.get("twin_roofline") or {}
    if not port and not twin:
        return ""

    def side(e: Mapping[str, Any]) -> str:
        if not e:
            return "n/a"
        if e.get("above_peak"):
            return f"{fmt_rate(e.get('bytes_per_s'))} (ABOVE the peak: a doctor bug)"
        share = e.get("bandwidth_share")
        return f"{100 * share:.0f} %" if share is not None else fmt_rate(e.get("bytes_per_s"))

    peak = port.get("peak_bytes_s") or twin.get("peak_bytes_s")
    if peak and port.get("bandwidth_share") is not None:
        return f"port: {phase} {side(port)} of {fmt_rate(peak)}; twin: {side(twin)}"
    return f"port: {phase} {side(port)}; twin: {side(twin)} (peak unknown)"
