"""Which layers run quantized, in a line: ``profiles["engine"]["quantization"]``.

Pure arithmetic over a worker's :class:`~vllm_doctor.facts.quant.QuantFacts` (``doctor_quant``):
the linear layers grouped by the method and weight storage they run with, and the layers that
run without the checkpoint's quantization, each with whether the config's ignore list names it.
"""

from __future__ import annotations

from dataclasses import replace

from vllm_doctor.analysis.records import QuantGroup, QuantSummary, QuantUnquantized
from vllm_doctor.analysis.roofline import fmt_si_bytes
from vllm_doctor.facts.quant import QuantFacts

MAX_NAMED = 4  # unquantized layers named in the line (the JSON lists them all)


def quant_summary(q: QuantFacts | None) -> QuantSummary | None:
    """The summary of a quantized model's layers; None for a model without a quantization config."""
    if q is None or not q.method:
        return None
    groups: dict[tuple[str, str | None], QuantGroup] = {}
    for x in q.linear:
        if not x.quantized:
            continue
        key = (x.method_text, x.storage)
        g = groups.get(key) or QuantGroup(method=key[0], weight_dtype=key[1])
        groups[key] = QuantGroup(
            method=g.method,
            weight_dtype=g.weight_dtype,
            layers=g.layers + 1,
            weight_bytes=g.weight_bytes + (x.weight_bytes or 0),
            other_bytes=g.other_bytes + x.other_bytes,
            in_kernel=g.in_kernel or x.weight_in_kernel,
        )
    unquantized = [
        QuantUnquantized(
            name=x.name,
            kind=x.kind,
            method=x.method,
            weight_dtype=(x.weight_dtype or "").removeprefix("torch.") or None,
            weight_bytes=x.weight_bytes,
            ignored=q.ignored(x),
        )
        for x in q.layers
        if not x.quantized and x.kind in ("linear", "lm_head", "experts")
    ]
    summary = QuantSummary(
        method=q.method,
        linear_layers=len(q.linear),
        quantized_linear_layers=sum(g.layers for g in groups.values()),
        groups=list(groups.values()),
        unquantized=unquantized,
        ignore=list(q.ignore),
    )
    return replace(summary, text=quant_text(summary))


def quant_text(s: QuantSummary) -> str:
    """e.g. ``compressed-tensors W8A8Int8 on 8 of 8 linear layers (int8 weights, 295 kB + 16.4 kB
    of scales, held by vLLM's CPU kernel); lm_head unquantized (ignored by the config)``."""
    parts: list[str] = []
    for g in s.groups:
        held = ", held by vLLM's CPU kernel: bytes from shape x bits" if g.in_kernel else ""
        parts.append(
            f"{s.method} {g.method} on {g.layers} of {s.linear_layers} linear layers "
            f"({g.weight_dtype or '?'} weights, {fmt_si_bytes(g.weight_bytes)} + {fmt_si_bytes(g.other_bytes)} "
            f"of scales{held})"
        )
    if not s.groups:
        parts.append(f"{s.method}: none of the {s.linear_layers} linear layers runs quantized")
    ignored = [x for x in s.unquantized if x.ignored]
    stray = [x for x in s.unquantized if not x.ignored]
    if ignored:
        parts.append(_named(ignored) + " unquantized (ignored by the config)")
    if stray:
        dtypes = sorted({x.weight_dtype or "?" for x in stray})
        parts.append(_named(stray) + f" unquantized ({', '.join(dtypes)}) and NOT in the config's ignore list (VD407)")
    return "; ".join(parts)


def _named(layers: list[QuantUnquantized]) -> str:
    names = [x.name for x in layers[:MAX_NAMED]]
    more = f" and {len(layers) - MAX_NAMED} more" if len(layers) > MAX_NAMED else ""
    return ", ".join(names) + more
