"""Parity of a vLLM port with a reference implementation: pure comparison of plain data.

Two parts, both over JSON-able data the two runs returned:

- :func:`compare_outputs`: greedy tokens with the semantics of vLLM's ``check_logprobs_close``
  (tests/models/utils.py: the runs may pick different tokens only where each pick is in the
  other's top-k; the comparison of that prompt stops there) PLUS the logprob values: the chosen
  token's logprob and every top-k token both runs report must agree within ``atol``. Token
  agreement alone passes broken ports (a wrong rotary layout or swapped shards often keep the
  greedy tokens of a small model and move the logprobs by 1e-3..1e-2).
- :func:`compare_hidden`: each decoder layer's output on the same token ids and positions; the
  first layer whose relative error (max |a-b| / max |ref|) exceeds ``hidden_rtol`` is where the
  port diverges, with a hint when the error's shape is recognisable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# dtype -> (logprob atol in nats, hidden-state relative tolerance). float32 ports that are
# right match the reference to ~1e-6 on CPU; broken ones differ by >= 1e-3.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-3, 1e-3),
    "float16": (5e-2, 2e-2),
    "bfloat16": (1e-1, 5e-2),
}


def tolerances(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, TOLERANCES["bfloat16"])


@dataclass
class PromptMismatch:
    prompt: int
    step: int
    kind: str  # "token" (a pick outside the other's top-k) | "logprob" (values beyond atol)
    detail: str
    max_abs_diff: float = 0.0


@dataclass
class LayerError:
    layer: int
    name: str
    max_abs: float
    max_rel: float
    worst_position: int
    position0_rel: float  # relative error at position 0 alone (no rotation there)


@dataclass
class ParityResult:
    """What ``assert_logprobs_close`` decides on. ``ok``: tokens and values agree."""

    model: str
    reference: str
    dtype: str
    atol: float
    hidden_rtol: float
    prompts: int
    max_tokens: int
    top_k: int
    mismatches: list[PromptMismatch] = field(default_factory=list)
    max_logprob_diff: float = 0.0
    layers: list[LayerError] = field(default_factory=list)
    first_divergent_layer: int | None = None
    hint: str | None = None
    capture_note: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def message(self) -> str:
        """The failure text: what differed, where, by how much, the fix if known."""
        verdict = "agree" if self.ok else "disagree"
        head = (
            f"vLLM and the {self.reference} reference {verdict} on {self.model} ({self.dtype}, "
            f"{self.prompts} prompt(s) x {self.max_tokens} tokens, top-{self.top_k}, atol {self.atol:g} nats)"
        )
        lines = [head]
        for m in self.mismatches[:5]:
            lines.append(f"  prompt {m.prompt} step {m.step}: {m.detail}")
        if len(self.mismatches) > 5:
            lines.append(f"  ... and {len(self.mismatches) - 5} more")
        if self.max_logprob_diff or all(m.kind != "token" for m in self.mismatches):
            lines.append(f"  largest logprob difference (tokens in both top-k): {self.max_logprob_diff:.3g} nats")
        if self.first_divergent_layer is not None:
            shown = [e for e in self.layers if e.layer <= self.first_divergent_layer]
            lines.append(
                f"first divergent layer: {self.first_divergent_layer} ({shown[-1].name}) "
                f"- hidden states differ beyond rtol {self.hidden_rtol:g} on the same token ids and positions"
            )
            lines.append(f"  {'layer':>5}  {'max abs err':>11}  {'max rel err':>11}  {'pos 0 rel':>9}  worst pos")
            for e in shown:
                mark = "  <-" if e.layer == self.first_divergent_layer else ""
                lines.append(
                    f"  {e.layer:>5}  {e.max_abs:>11.3e}  {e.max_rel:>11.3e}  {e.position0_rel:>9.2e}  "
                    f"{e.worst_position:>9}{mark}"
                )
        elif self.layers and self.ok:
            worst = max(e.max_rel for e in self.layers)
            lines.append(f"every decoder layer's output matches within rtol {self.hidden_rtol:g} (worst {worst:.2g})")
        elif self.layers:
            lines.append(
                f"every decoder layer's output matches within rtol {self.hidden_rtol:g}: the difference is after "
                "the last layer (final norm, lm_head, logits processing or its scale/soft-cap)"
            )
        elif self.capture_note:
            lines.append(f"layer outputs not compared: {self.capture_note}")
        if self.hint:
            lines.append(f"fix: {self.hint}")
        return "\n".join(lines)


def _lp(step: dict[str, float], token: int) -> float | None:
    value = step.get(str(token))
    return None if value is None else float(value)


def compare_outputs(
    vllm_outputs: list[dict[str, Any]], ref_outputs: list[dict[str, Any]], atol: float, top_k: int
) -> tuple[list[PromptMismatch], float]:
    """check_logprobs_close semantics plus logprob values; returns (mismatches, largest diff)."""
    mismatches: list[PromptMismatch] = []
    largest = 0.0
    for p, (ours, ref) in enumerate(zip(vllm_outputs, ref_outputs, strict=False)):
        for step, (tok_v, tok_r) in enumerate(zip(ours["token_ids"], ref["token_ids"], strict=False)):
            lps_v, lps_r = ours["logprobs"][step], ref["logprobs"][step]
            # the values first, also at the step where the picks part (a near-tie keeps its values)
            diffs = {token: abs(float(lps_v[token]) - float(lps_r[token])) for token in set(lps_v) & set(lps_r)}
            worst_token = max(diffs, key=lambda t: diffs[t]) if diffs else None
            worst = diffs[worst_token] if worst_token is not None else 0.0
            largest = max(largest, worst)
            if worst > atol and worst_token is not None:
                chosen = diffs.get(str(tok_v), diffs.get(str(tok_r), 0.0))
                picks = f"same token {tok_v}" if tok_v == tok_r else f"vLLM picked {tok_v}, the reference {tok_r}"
                mismatches.append(
                    PromptMismatch(
                        p,
                        step,
                        "logprob",
                        f"{picks}, but logprob of token {worst_token} is {float(lps_v[worst_token]):.6f} in vLLM "
                        f"vs {float(lps_r[worst_token]):.6f} (|diff| {worst:.3g} > {atol:g}; chosen token's "
                        f"|diff| {chosen:.3g})",
                        worst,
                    )
                )
                break  # one line per prompt is enough to act on
            if tok_v != tok_r:
                # vLLM's rule: each pick must be in the other's top-k; then the sequences part
                if str(tok_v) not in lps_r or str(tok_r) not in lps_v:
                    mismatches.append(
                        PromptMismatch(
                            p,
                            step,
                            "token",
                            f"vLLM picked {tok_v}, the reference {tok_r}: not in each other's top-{top_k}",
                        )
                    )
                break
    return mismatches, largest


def compare_hidden(
    vllm_layers: dict[str, list[list[float]]],
    ref_layers: dict[str, list[list[float]]],
    names: dict[str, str],
    rtol: float,
) -> tuple[list[LayerError], int | None]:
    """Max abs / rel error per layer (by index) on the common positions; the first beyond rtol."""
    rows: list[LayerError] = []
    first: int | None = None
    for key in sorted(set(vllm_layers) & set(ref_layers), key=int):
        ours, ref = vllm_layers[key], ref_layers[key]
        positions = min(len(ours), len(ref))
        if not positions:
            continue
        scale = max(max(abs(x) for x in row) for row in ref[:positions]) or 1.0
        if len(ours[0]) != len(ref[0]):
            raise ValueError(f"layer {key}: vLLM's hidden size is {len(ours[0])}, the reference's {len(ref[0])}")
        per_pos = [max(abs(a - b) for a, b in zip(ours[i], ref[i], strict=True)) for i in range(positions)]
        worst = max(range(positions), key=lambda i: per_pos[i])
        row = LayerError(
            layer=int(key),
            name=names.get(key, f"layer {key}"),
            max_abs=per_pos[worst],
            max_rel=per_pos[worst] / scale,
            worst_position=worst,
            position0_rel=per_pos[0] / scale,
        )
        rows.append(row)
        if first is None and row.max_rel > rtol:
            first = row.layer
    return rows, first


def hint_for(rows: list[LayerError], first: int | None, rtol: float) -> str | None:
    """A fix hint from the shape of the first divergent layer's error, when recognisable."""
    if first is None:
        return None
    row = next(r for r in rows if r.layer == first)
    if row.position0_rel <= rtol and row.worst_position > 0:
        return (
            f"layer {first} agrees at position 0 and differs from position 1 on: a positional bug. Rotary embedding "
            "layout (get_rope(..., is_neox_style=...): NeoX/rotate-half vs GPT-J/interleaved), rope_theta or "
            "rope scaling, rotary_dim / partial rotary, or the positions passed to the layer."
        )
    if row.max_rel < 2e-2:
        return (
            f"layer {first} differs a little at every position (rel {row.max_rel:.2g}): a numerical detail of "
            "that layer. RMSNorm/LayerNorm epsilon (compare with config.rms_norm_eps), an activation variant "
            "(gelu vs gelu_tanh), or a scale factor."
        )
    return (
        f"layer {first} computes something else from the same input at every position (rel {row.max_rel:.2g}): "
        "check its weights in load_weights (swapped q/k/v or gate/up shards in stacked_params_mapping, a "
        "missing bias), swapped projections, and the residual order (norm before/after the add)."
    )
