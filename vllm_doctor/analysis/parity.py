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

With images (a multimodal model), a prefill's comparison starts earlier, on the same pixel
values: the vision tower's output, then the projector's (:func:`compare_parts`); the first of
"vision tower", "projector", "decoder layer N" that differs is where the port diverges
(``ParityResult.first_divergent``): a wrong tower makes every later part differ too.

Layer outputs are compared on a *step*: the prefill of a prompt (every prompt position), or one
decode step (the one token fed through the KV cache after prefilling the prompt and the tokens
before it). :func:`localise` rests the verdict only on the step where the logprobs first differ
(:func:`first_difference`): a port whose decode path is wrong has a prefill on which every layer
matches, and "the difference is after the last layer" concluded from that prefill would send the
author to the wrong place.
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
    worst_position: int  # the prompt position (a decode step: the position of the token fed)
    position0_rel: float | None  # relative error at position 0 alone (no rotation there); None: not compared


@dataclass
class PartError:
    """A multimodal encoder part's output (every image's features, as rows) compared."""

    part: str  # "vision tower" | "projector"
    name: str  # the module's path in vLLM's model
    max_abs: float
    max_rel: float
    rows: int


@dataclass
class LayerCheck:
    """Each decoder layer's output compared on one step of one prompt.

    ``step`` is the output position whose logits that forward produces: 0 is the prefill of the
    prompt, s > 0 the decode step that feeds the s-th generated token's predecessor through the
    KV cache. ``diverging``: this is the step where the logprobs first differ (set by :func:`localise`).
    """

    prompt: int
    step: int
    layers: list[LayerError]
    first_divergent_layer: int | None
    reference_path: str = "a full forward"  # how the reference computed it (a decode step: its KV cache)
    diverging: bool = False
    note: str | None = None  # a caveat about this comparison (the capture run did not reproduce the step)
    encoder: list[PartError] = field(default_factory=list)  # with images: tower, projector (on the same pixels)
    rtol: float | None = None  # the hidden_rtol it was judged with (set by :func:`localise`)

    @property
    def first_divergent(self) -> str | None:
        """The first part that differs: "vision tower", "projector" or "decoder layer N"; None: none."""
        return first_divergent(self, self.rtol) if self.rtol is not None else None

    @property
    def phase(self) -> str:
        return _phase(self.step)

    def where(self) -> str:
        return describe_step(self.prompt, self.step)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "phase": self.phase, "first_divergent": self.first_divergent}


def describe_step(prompt: int, step: int) -> str:
    """``prefill of prompt 0`` / ``decode step 3 of prompt 1`` (for messages)."""
    return f"prefill of prompt {prompt}" if step == 0 else f"decode step {step} of prompt {prompt}"


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
    # every layer comparison made; ``layers`` / ``first_divergent_layer`` / ``hint`` are the one
    # the verdict rests on (``layers_on``): the diverging step's, or the prefill's when all agree
    layer_checks: list[LayerCheck] = field(default_factory=list)
    layers_on: dict[str, Any] | None = None
    images: int = 0  # per prompt (0: text prompts)
    encoder: list[PartError] = field(default_factory=list)  # the verdict's check's tower/projector rows
    # the first of "vision tower", "projector", "decoder layer N" that differs on the verdict's step
    first_divergent: str | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def first_difference(self) -> PromptMismatch | None:
        return first_difference(self.mismatches)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_difference
        where = None if first is None else {"prompt": first.prompt, "step": first.step, "phase": _phase(first.step)}
        out = {**asdict(self), "ok": self.ok, "first_difference": where}
        out["layer_checks"] = [c.to_dict() for c in self.layer_checks]
        return out

    def summary(self) -> str:
        """One line for a session summary: the verdict's layer and step, the largest logprob difference."""
        diff = f"max |logprob diff| {self.max_logprob_diff:.2g}"
        if self.ok:
            return diff
        if self.first_divergent in ENCODER_PARTS and self.layers_on is not None:
            where = describe_step(int(self.layers_on["prompt"]), int(self.layers_on["step"]))
            return f"first divergent: the {self.first_divergent} ({where}), {diff}"
        if self.first_divergent_layer is not None and self.layers_on is not None:
            where = describe_step(int(self.layers_on["prompt"]), int(self.layers_on["step"]))
            return f"first divergent layer {self.first_divergent_layer} ({where}), {diff}"
        if self.layers_on is not None:
            return f"every layer matches, the difference is after the last layer, {diff}"
        return f"first divergent layer not found, {diff}"

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
        lines.extend(self._layer_lines())
        if self.hint:
            lines.append(f"fix: {self.hint}")
        return "\n".join(lines)

    def _layer_lines(self) -> list[str]:
        """What the layer comparisons say, resting a verdict only on the diverging step."""
        rtol = self.hidden_rtol
        chosen = next((c for c in self.layer_checks if c.diverging), None)
        others = [c for c in self.layer_checks if c is not chosen]
        first = self.first_difference
        lines: list[str] = []
        if chosen is not None and chosen.encoder:
            lines.extend(_encoder_lines(chosen, rtol))
        if chosen is not None and chosen.first_divergent in ENCODER_PARTS:
            pass  # every later part sees another input: the encoder's lines say it all
        elif chosen is not None and chosen.first_divergent_layer is not None:
            row = next(e for e in chosen.layers if e.layer == chosen.first_divergent_layer)
            how = "one decode step through its KV cache" if chosen.phase == "decode" else "the prefill"
            lines.append(
                f"{chosen.where()}: layer {row.layer}'s output differs first (max rel err {row.max_rel:.3g} > rtol "
                f"{rtol:g}); the logprobs first differ on this step"
            )
            lines.append(
                f"first divergent layer: {row.layer} ({row.name}) - hidden states differ beyond rtol {rtol:g} on the "
                f"same token ids and positions (vLLM: {how}; the reference: {chosen.reference_path})"
            )
            lines.extend(_table(chosen.layers, row.layer))
        elif chosen is not None:
            worst = max((e.max_rel for e in chosen.layers), default=0.0)
            lines.append(
                f"every decoder layer's output matches within rtol {rtol:g} on the {chosen.where()}, where the "
                f"logprobs first differ (worst {worst:.2g}): the difference is after the last layer (final norm, "
                "lm_head, logits processing or its scale/soft-cap)"
            )
        elif self.ok and self.layer_checks:
            worst = max((e.max_rel for c in self.layer_checks for e in c.layers), default=0.0)
            parts = [e for c in self.layer_checks for e in c.encoder]
            if parts:
                worst_part = max(e.max_rel for e in parts)
                names = " and ".join(dict.fromkeys(e.part for e in parts))
                lines.append(f"the {names} outputs match within rtol {rtol:g} (worst {worst_part:.2g})")
            lines.append(f"every decoder layer's output matches within rtol {rtol:g} (worst {worst:.2g})")
        elif first is not None and self.layer_checks:
            lines.append(
                f"layer outputs were not compared on the {describe_step(first.prompt, first.step)}, where the "
                f"logprobs first differ ({self.capture_note or 'not captured'}): no conclusion about the layers"
            )
        elif self.capture_note:
            lines.append(f"layer outputs not compared: {self.capture_note}")
        if chosen is not None and chosen.note:
            lines.append(f"  note: {chosen.note}")
        for other in others if not self.ok else []:
            label = self._logprobs_on(other.prompt, other.step)
            if other.first_divergent_layer is None:
                worst = max((e.max_rel for e in other.layers), default=0.0)
                lines.append(
                    f"{other.where()} ({label}): every decoder layer's output matches within rtol {rtol:g} "
                    f"(worst {worst:.2g})"
                )
            else:
                row = next(e for e in other.layers if e.layer == other.first_divergent_layer)
                lines.append(
                    f"{other.where()} ({label}): layer {row.layer}'s output already differs "
                    f"(max rel err {row.max_rel:.3g} > rtol {rtol:g})"
                )
        return lines

    def _logprobs_on(self, prompt: int, step: int) -> str:
        """What the logprob comparison says about one step (a prompt is compared up to its first difference)."""
        m = next((m for m in self.mismatches if m.prompt == prompt), None)
        if m is None or m.step > step:
            return "the logprobs agree there"
        if m.step == step:
            return "the logprobs differ there too"
        return "past that prompt's first difference"


ENCODER_PARTS = ("vision tower", "projector")


def _encoder_lines(check: LayerCheck, rtol: float) -> list[str]:
    """The tower's and the projector's output on the same pixel values, the first that differs marked."""
    first = check.first_divergent
    lines = []
    if first in ENCODER_PARTS:
        row = next(e for e in check.encoder if e.part == first)
        lines.append(
            f"{check.where()}: the {first}'s output differs first (max rel err {row.max_rel:.3g} > rtol {rtol:g}; "
            f"{row.name}) on the same pixel values"
        )
    lines.append(f"  {'part':>12}  {'max abs err':>11}  {'max rel err':>11}  rows  module")
    for e in check.encoder:
        mark = "  <-" if e.part == first else ""
        lines.append(f"  {e.part:>12}  {e.max_abs:>11.3e}  {e.max_rel:>11.3e}  {e.rows:>4}  {e.name}{mark}")
    return lines


def first_divergent(check: LayerCheck, rtol: float) -> str | None:
    """ "vision tower", "projector" (in that order) or "decoder layer N": the first beyond ``rtol``."""
    for row in check.encoder:
        if row.max_rel > rtol:
            return row.part
    return None if check.first_divergent_layer is None else f"decoder layer {check.first_divergent_layer}"


def compare_parts(
    vllm_parts: dict[str, list[list[float]]], ref_parts: dict[str, list[list[float]]], names: dict[str, str]
) -> list[PartError]:
    """Each encoder part's output (rows: every image's features, in order), vLLM vs the reference:
    max abs error and that relative to the reference's largest value, in :data:`ENCODER_PARTS` order."""
    rows = []
    for part in [p for p in ENCODER_PARTS if p in vllm_parts and p in ref_parts]:
        ours, ref = vllm_parts[part], ref_parts[part]
        count = min(len(ours), len(ref))
        if not count:
            continue
        if len(ours[0]) != len(ref[0]):
            raise ValueError(f"the {part}'s output has {len(ours[0])} features in vLLM, {len(ref[0])} in the reference")
        scale = max(max(abs(x) for x in row) for row in ref[:count]) or 1.0
        worst = max(max(abs(a - b) for a, b in zip(ours[i], ref[i], strict=True)) for i in range(count))
        rows.append(PartError(part, names.get(part, part), worst, worst / scale, count))
    return rows


def _table(rows: list[LayerError], first: int) -> list[str]:
    lines = [f"  {'layer':>5}  {'max abs err':>11}  {'max rel err':>11}  {'pos 0 rel':>9}  worst pos"]
    for e in rows:
        if e.layer > first:
            break
        mark = "  <-" if e.layer == first else ""
        pos0 = "-" if e.position0_rel is None else f"{e.position0_rel:.2e}"
        lines.append(f"  {e.layer:>5}  {e.max_abs:>11.3e}  {e.max_rel:>11.3e}  {pos0:>9}  {e.worst_position:>9}{mark}")
    return lines


def _phase(step: int) -> str:
    return "prefill" if step == 0 else "decode"


def first_difference(mismatches: list[PromptMismatch]) -> PromptMismatch | None:
    """The earliest step where the runs part (lowest step, then lowest prompt): where to compare layers.

    A step-0 difference in any prompt is a prefill difference, which is where the layers are
    compared first; only when every prefill agrees does a decode step get compared."""
    return min(mismatches, key=lambda m: (m.step, m.prompt), default=None)


def localise(result: ParityResult, checks: list[LayerCheck]) -> None:
    """Record ``checks`` on ``result`` and rest its verdict on the right one.

    The verdict (``layers``, ``first_divergent_layer``, ``hint``, ``layers_on``) comes from the
    check on the step where the logprobs first differ; when the runs agree, from the first check
    made. A check on any other step is kept (and shown) as context, never as the verdict."""
    first = result.first_difference
    for check in checks:
        check.diverging = first is not None and (check.prompt, check.step) == (first.prompt, first.step)
        check.rtol = result.hidden_rtol
    result.layer_checks = checks
    chosen = next((c for c in checks if c.diverging), None)
    if chosen is None and result.ok and checks:
        chosen = checks[0]
    if chosen is None:
        result.layers, result.first_divergent_layer, result.hint, result.layers_on = [], None, None, None
        result.encoder, result.first_divergent = [], None
        return
    result.layers, result.first_divergent_layer = chosen.layers, chosen.first_divergent_layer
    result.encoder, result.first_divergent = chosen.encoder, chosen.first_divergent
    result.layers_on = {"prompt": chosen.prompt, "step": chosen.step, "phase": chosen.phase}
    prefill = [c for c in checks if c.phase == "prefill" and c is not chosen]
    if result.first_divergent in ENCODER_PARTS:
        result.hint = ENCODER_HINTS[result.first_divergent]
    else:
        result.hint = hint_for(chosen.layers, chosen.first_divergent_layer, result.hidden_rtol, chosen.phase, prefill)


ENCODER_HINTS = {
    "vision tower": (
        "the vision tower computes something else from the same pixel values: check that load_weights loads its "
        "tensors (a load_weights that skips vision_tower.* and returns None leaves the tower at its construction "
        "values and switches off vLLM's missing-weight check; `vllm-doctor check` compares the checkpoint with the "
        "loaded parameters), the prefix mapping (hf_to_vllm_mapper), then its layers: patch embedding, position "
        "embeddings, attention heads, layer norms (eps), activation, the feature layer selected"
    ),
    "projector": (
        "the vision tower matches and the projector does not: its activation (gelu vs relu / gelu_tanh / quick_gelu, "
        "compare with the config's projector_hidden_act), the order and weights of its linear layers (linear_1, "
        "linear_2 and their biases), or a norm / reshape it applies to the tower's features"
    ),
}


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
    first_position: int = 0,
) -> tuple[list[LayerError], int | None]:
    """Max abs / rel error per layer (by index) on the common positions; the first beyond rtol.

    ``first_position``: the prompt position of the first row (a decode step's one row: the
    position of the token fed); positions are reported from it."""
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
            worst_position=first_position + worst,
            position0_rel=per_pos[0] / scale if first_position == 0 else None,
        )
        rows.append(row)
        if first is None and row.max_rel > rtol:
            first = row.layer
    return rows, first


def hint_for(
    rows: list[LayerError],
    first: int | None,
    rtol: float,
    phase: str = "prefill",
    prefill_checks: list[LayerCheck] | None = None,
) -> str | None:
    """A fix hint from the shape of the first divergent layer's error, when recognisable.

    ``phase`` "decode" with ``prefill_checks`` on which that layer matched: a decode-only path."""
    if first is None:
        return None
    row = next(r for r in rows if r.layer == first)
    matched_on_prefill = [c for c in prefill_checks or [] if _layer_matches(c, first, rtol)]
    if phase == "decode" and matched_on_prefill:
        return (
            f"layer {first} matches on the {matched_on_prefill[0].where()} and differs on a decode step: code that "
            "runs only when one token per sequence is processed. Look for branches on the attention metadata "
            "(max_query_len == 1, num_decodes, decode_* fields), the number of tokens or is_prefill flags in that "
            "layer, a decode-only kernel or layout, and what the layer writes to or reads from the KV cache "
            "(K/V written in another layout or scale than they are read back)."
        )
    if row.position0_rel is not None and row.position0_rel <= rtol and row.worst_position > 0:
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


def _layer_matches(check: LayerCheck, layer: int, rtol: float) -> bool:
    row = next((r for r in check.layers if r.layer == layer), None)
    return row is not None and row.max_rel <= rtol
