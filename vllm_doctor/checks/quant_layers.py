"""VD407: a linear layer that runs unquantized in a quantized model (topic ``placement``, the
family of VD405's parameter dtypes).

It reads each worker's :class:`~vllm_doctor.facts.quant.QuantFacts` (``doctor_quant``): the quant
method vLLM gave every linear layer. A layer built without ``quant_config`` gets
``UnquantizedLinearMethod`` whatever the checkpoint holds.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import quants, subject
from vllm_doctor.facts.engine import EngineFacts
from vllm_doctor.model import Finding, Severity, Stage

MAX_NAMED = 6


@check(
    "VD407",
    "layer-runs-unquantized",
    "A linear layer runs unquantized in a quantized model, and the quantization config does not ignore it.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="placement",
    what=(
        "Reads the quantization method vLLM gave each linear layer of the loaded model (`layer.quant_method`): in a "
        "model with a `quantization_config`, lists the layers that run `UnquantizedLinearMethod` although the "
        "config's `ignore` list (`ignored_layers`, `modules_to_not_convert`) does not name them, with their weight "
        "dtype and the method the other layers run."
    ),
    why=(
        "vLLM quantizes a layer only if the model passes `quant_config` to it. A layer built without it is a plain "
        "bfloat16 layer with no `weight_scale`: the checkpoint's int8/fp8 weight is copied into it as if it were "
        "the real value (`param.data.copy_`, a cast, no scale), and a `load_weights` that skips names it has no "
        "parameter for drops the scale without a word. The model runs and generates garbage; vLLM's "
        "missing-weight check is off for quantized models."
    ),
    example=(
        "self.o_proj = RowParallelLinear(hidden, hidden, bias=False, prefix=f'{prefix}.o_proj')  "
        "# no quant_config=vllm_config.quant_config"
    ),
    fix=(
        "Pass `quant_config=vllm_config.quant_config` (and a unique `prefix`) to every vLLM linear layer the "
        "checkpoint quantizes. If the checkpoint really keeps that layer unquantized, name it in the "
        "quantization config's `ignore` list."
    ),
    references=("docs/quantization.md",),
    requires=("engine",),
)
def layer_runs_unquantized(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = quants(facts, emit)
    yield from crashes
    if not pairs and not crashes:
        yield emit.skip("no worker reported its layers' quantization methods (a doctor without doctor_quant)")
        return
    # every rank builds the same classes: the first worker's layers speak for all
    for w, q in pairs[:1]:
        if not q.method:
            yield emit.not_applicable("the model has no quantization config", subject(w))
            continue
        quantized = [x for x in q.linear if x.quantized]
        methods = sorted({f"{q.method} {x.method_text}" for x in quantized})
        stray = q.unexpected_unquantized()
        if not stray:
            ignored = len(q.linear) - len(quantized)
            yield emit.ok(
                f"{len(quantized)} of {len(q.linear)} linear layers run {', '.join(methods) or q.method}"
                + (f"; the other {ignored} are in the config's ignore list" if ignored else ""),
                subject(w),
            )
            continue
        dtypes = sorted({(x.weight_dtype or "?").removeprefix("torch.") for x in stray})
        names = [x.name for x in stray]
        shown = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
        others = (
            f"while {len(quantized)} run {', '.join(methods)}" if quantized else f"while the checkpoint is {q.method}"
        )
        yield emit.fail(
            f"{len(stray)} of {len(q.linear)} linear layers run unquantized ({stray[0].method}, "
            f"{'/'.join(dtypes)} weights) {others}, and the config's ignore list {q.ignore} does not name them: "
            + shown,
            f"{subject(w)} / {names[0]}",
            {
                "layers": names,
                "method": stray[0].method,
                "weight_dtypes": dtypes,
                "quantized_layers": len(quantized),
                "quantized_with": methods,
                "ignore": q.ignore,
                "module_classes": sorted({x.module_class or "?" for x in stray}),
            },
            "pass quant_config=vllm_config.quant_config to these layers (vLLM then creates their weight_scale and "
            "loads the quantized weight); if the checkpoint keeps them unquantized, name them in the config's ignore "
            "list",
        )
