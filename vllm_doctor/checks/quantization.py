"""VD314-VD316: a quantized checkpoint against the model vLLM builds for it.

config.json's ``quantization_config`` makes vLLM build each layer that gets ``quant_config``
with the method's parameters (int8/fp8 ``weight``, ``weight_scale``, packed ``weight_packed``,
GPTQ's ``qweight``/``qzeros``/``scales``/``g_idx``, ...). The weights pass builds the model on
the meta device as the engine would, records each layer's quantization method
(compat/quant_build.py) and follows every checkpoint tensor through the model's real
``load_weights``; VD316 reads config.json and the headers alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, capped_findings, check
from vllm_doctor.checks.quant_load import (
    MalformedScale,
    checkpoint_quantization,
    layer_of,
    layer_pattern,
    malformed_scales,
    missing_quant_params,
    quant_layers,
    unquantized_layers,
)
from vllm_doctor.facts.quant_checkpoint import FORMAT_WORDS
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage

REFS = (
    "vllm/model_executor/layers/linear.py:UnquantizedLinearMethod",
    "vllm/model_executor/model_loader/default_loader.py:track_weights_loading",
)
DTYPE_WORDS = {"I8": "int8", "I32": "int32", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U8": "uint8"}
NO_CHECK = (
    "vLLM's own missing-weight check is off for quantized models: it runs with uninitialised scales, NaN or garbage "
    "output that changes from run to run"
)


@check(
    "VD314",
    "layer-built-without-quant-config",
    "A layer built without `quant_config` (or as a plain nn.Linear) in front of a quantized checkpoint.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "vLLM quantizes a layer only when the model passes `quant_config=vllm_config.quant_config` (and its `prefix`) "
        "to vLLM's linear layer; otherwise the layer gets `UnquantizedLinearMethod` and a bfloat16 `weight`. "
        "vllm-doctor builds the model on the meta device as the engine would, reads each layer's quantization method "
        "and follows the checkpoint's quantized weights and scales into the layers."
    ),
    why=(
        "vLLM copies the checkpoint's int8/fp8 weight into the layer's bfloat16 weight without a word (the integers "
        "become floats as they are), then stops with a bare `KeyError: '...weight_scale'` from load_weights, naming "
        "neither the layer nor the missing argument."
    ),
    example=(
        "self.down_proj = RowParallelLinear(..., bias=False, prefix=...)  # no quant_config; the checkpoint holds "
        "int8 down_proj.weight + down_proj.weight_scale"
    ),
    fix=(
        'pass `quant_config=vllm_config.quant_config` and `prefix=f"{prefix}.down_proj"` to the layer (replace a '
        "plain nn.Linear with vLLM's ColumnParallelLinear / RowParallelLinear / ReplicatedLinear); a layer meant to "
        "stay unquantized belongs in the quantization config's ignore list and unquantized in the checkpoint"
    ),
    references=REFS,
    requires=("checkpoint", "weights-load"),
)
def layer_built_without_quant_config(facts: Facts, emit: Emit) -> Iterable[Finding]:
    layers = quant_layers(facts)
    ckq = checkpoint_quantization(facts)
    if layers is None or not ckq.quantized:
        yield emit.not_applicable("the checkpoint is not quantized (config.json's quantization_config and its tensors)")
        return
    found = [layer for layer in unquantized_layers(facts) if not layer.unmatched]  # unmatched: VD317
    if not found:
        quantized = sum(1 for q in layers.modules.values() if q.quantized)
        yield emit.ok(
            f"{quantized} layer(s) are built with the {ckq.method} method for the checkpoint's tensors"
            + (" (VD317 names the layers the method does not quantize by name)" if unquantized_layers(facts) else "")
        )
        return
    groups: dict[str, list] = {}
    for layer in found:
        groups.setdefault(layer_pattern(layer.module), []).append(layer)
    siblings = sorted({q.quant_method for q in layers.modules.values() if q.quantized and q.quant_method})
    findings = []
    for pattern, members in groups.items():
        first = members[0]
        if first.ignored_by:  # the config's own ignore list (fp8's ignored_layers, ignore, ...) left it unquantized
            built = (
                f"is left unquantized by the quantization config's own ignore list ({first.ignored_by!r}; vLLM gave "
                f"it {first.quant_method or 'no quantization method'})"
            )
        elif first.quant_method is None:
            built = "is a plain nn.Linear (no quantization method)"
        else:
            built = f"was built without quant_config (vLLM gave it {first.quant_method}" + (
                f"; the other layers got {', '.join(siblings)})" if siblings else ")"
            )
        parts = []
        if first.quantized_tensors:
            tensor, dtype = first.quantized_tensors[0]
            stored = f"{DTYPE_WORDS.get(dtype, dtype)} {tensor.rsplit('.', 1)[-1]}"
            parts.append(f"the checkpoint's {stored} is copied into its {first.param_dtype} weight as plain values")
        if first.unloadable:
            leaves = sorted({n.rsplit(".", 1)[-1] for n in first.unloadable})
            parts.append(
                f"{', '.join(leaves)} has no parameter"
                + (f" (vLLM stops loading: {first.error.splitlines()[0]})" if first.error else "")
            )
        cause = "; the checkpoint quantized it all the same" if first.ignored_by else ""
        where = pattern if len(members) > 1 else first.module
        leaf = first.module.rsplit(".", 1)[-1]
        findings.append(
            emit.fail(
                f"{where} {built} in a {ckq.method} checkpoint: " + " and ".join(parts) + cause,
                where,
                {
                    "modules": [m.module for m in members],
                    "quant_method": first.quant_method,
                    "quantized_layers_use": siblings,
                    "parameter_dtype": first.param_dtype,
                    "checkpoint_tensors": [n for m in members for n in m.tensors][:20],
                    "quantized_tensors": [list(t) for m in members for t in m.quantized_tensors][:10],
                    "without_parameter": [n for m in members for n in m.unloadable][:10],
                    "ignored_by": first.ignored_by,
                    "vllm_error": first.error,
                },
                (
                    f"export {where} unquantized (float weight, no scales), as the ignore list says"
                    if first.ignored_by
                    else f'pass quant_config=vllm_config.quant_config and prefix=f"{{prefix}}.{leaf}" where {leaf} '
                    "is built"
                    + (
                        " (and build it as vLLM's ReplicatedLinear / RowParallelLinear, not nn.Linear)"
                        if first.quant_method is None
                        else ""
                    )
                ),
            )
        )
    yield from capped_findings(findings, emit, "layers built unquantized")


def _layer_key(module: str) -> tuple[int, str]:
    layer = layer_of(module)
    return (int(layer), "") if layer is not None else (-1, module)


@check(
    "VD315",
    "quantization-scales-not-loaded",
    (
        "Scales (or zero points) of a quantized layer that no checkpoint tensor fills, or that the checkpoint "
        "stores as an integer / boolean or in another shape, named per layer."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "A layer vLLM quantizes has, beside its weight, the parameters its method needs: `weight_scale`, "
        "`weight_zero_point`, `input_scale`, GPTQ's `scales`/`qzeros`/`g_idx`. vllm-doctor records which of them the "
        "checkpoint fills through load_weights (not the KV-cache scales vLLM defaults to 1.0), and the dtype and "
        "shape of each scale the checkpoint has against vLLM's parameter."
    ),
    why=(
        "vLLM's missing-weight check is off for quantized models: a layer whose scales the checkpoint lacks runs on "
        "uninitialised memory (NaN logprobs, token id 0, or garbage that changes from run to run), without a word. "
        "A scale stored as int64 or bool is cast as it is (a scale of 0 or 1.0), again without a word."
    ),
    example="a conversion script that dropped layer 1's weight_scale tensors, or wrote them as int64",
    fix=(
        "re-export the checkpoint with every layer's scales (or fix the names load_weights maps them by); vLLM's "
        'loader option `model_loader_extra_config={"enable_weights_track": true}` makes it refuse such a checkpoint'
    ),
    references=REFS,
    requires=("checkpoint", "weights-load"),
)
def quantization_scales_not_loaded(facts: Facts, emit: Emit) -> Iterable[Finding]:
    layers = quant_layers(facts)
    if layers is None or not layers.method:
        yield emit.not_applicable("vLLM builds the model unquantized")
        return
    missing = missing_quant_params(facts)
    malformed = _malformed_findings(malformed_scales(facts), emit)
    yield from malformed
    if not missing:
        if not malformed:
            quantized = sum(1 for q in layers.modules.values() if q.quantized)
            yield emit.ok(f"every scale of the {quantized} quantized layer(s) is loaded from the checkpoint")
        return
    by_layer: dict[tuple[int, str], dict[str, list[str]]] = {}
    for module, leaves in missing.items():
        for leaf in leaves:
            by_layer.setdefault(_layer_key(module), {}).setdefault(leaf, []).append(module)
    findings = []
    for (index, name), of_leaf in sorted(by_layer.items()):
        where = f"layer {index}" if index >= 0 else name
        said = "; ".join(
            f"{leaf} of {', '.join(m.rsplit('.', 1)[-1] for m in modules)}" for leaf, modules in sorted(of_leaf.items())
        )
        params = sorted(f"{m}.{leaf}" for leaf, modules in of_leaf.items() for m in modules)
        findings.append(
            emit.fail(
                f"{where}: {said} never loaded ({NO_CHECK})",
                where,
                {"layer": index if index >= 0 else None, "parameters": params, "method": layers.method},
                "add the layer's scales to the checkpoint (re-export it), or map their names in load_weights",
            )
        )
    yield from capped_findings(findings, emit, "layers with scales not loaded")


def _malformed_findings(found: list[MalformedScale], emit: Emit) -> list[Finding]:
    """One finding per layer and problem: the scales the checkpoint has, stored as another dtype
    kind (an integer, a boolean) than vLLM's float parameter, or in a shape it does not take."""
    groups: dict[tuple[tuple[int, str], str, str, str], list[MalformedScale]] = {}
    for m in found:
        key = (_layer_key(m.module), m.problem, m.dtype if m.problem == "dtype" else str(m.shape), m.leaf)
        groups.setdefault(key, []).append(m)
    findings = []
    for ((index, name), problem, _, leaf), members in sorted(groups.items()):
        first = members[0]
        where = f"layer {index}" if index >= 0 else name
        of = ", ".join(sorted({m.module.rsplit(".", 1)[-1] for m in members}))
        if problem == "dtype":
            said = (
                f"{leaf} of {of} is stored as {first.dtype}, but vLLM's {leaf} is {first.param_dtype}: "
                + (
                    "the booleans are loaded as 1.0 / 0.0"
                    if first.dtype == "BOOL"
                    else "the integers are loaded as floats as they are"
                )
                + " and the layer's output is scaled by them, without a word"
            )
            hint = f"re-export {leaf} as {first.param_dtype} (the scale the quantizing tool computed)"
        else:
            wants = {m.module.rsplit(".", 1)[-1]: m.param_shape for m in members}
            takes = (
                str(first.param_shape)
                if len({str(w) for w in wants.values()}) == 1
                else ", ".join(f"{name} {shape}" for name, shape in sorted(wants.items()))
            )
            said = (
                f"{leaf} of {of} is in the checkpoint with shape {first.shape}, but vLLM's parameter takes {takes}: "
                "it is not loaded (VD303 names each tensor)"
            )
            hint = f"re-export {leaf} in the shape the quantization method uses ({takes})"
        findings.append(
            emit.fail(
                f"{where}: {said}",
                where,
                {
                    "layer": index if index >= 0 else None,
                    "problem": problem,
                    "tensors": [m.tensor for m in members][:20],
                    "found": {"dtype": first.dtype, "shape": first.shape},
                    "expected": {"dtype": first.param_dtype, "shape": first.param_shape},
                },
                hint,
            )
        )
    return capped_findings(findings, emit, "layers with scales stored wrong")


@check(
    "VD316",
    "quantization-method-mismatch",
    "The checkpoint's tensors are quantized in another format than config.json's quantization_config says.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "vLLM picks the layers' parameters from `quantization_config.quant_method` (and compressed-tensors' config "
        "groups): int8 weights for W8A8 int8, float8 for fp8, packed int4 for W4A16, `qweight`/`qzeros`/`scales`/"
        "`g_idx` for GPTQ/AWQ. vllm-doctor compares that with the checkpoint's tensor names and dtypes (headers only)."
    ),
    why=(
        "A checkpoint written by one tool and a config that names another method load into the wrong parameters: "
        "float8 bytes cast into int8 parameters, GPTQ tensors that no parameter takes (a KeyError), or, with no "
        "quantization_config at all, integers loaded as bfloat16 values."
    ),
    example="float8 weights + weight_scale under a compressed-tensors config whose weights are type int, 8 bits",
    fix=(
        "use the quantization_config the tool that quantized the checkpoint wrote (the checkpoint's tensors decide), "
        "or re-export the checkpoint in the method the config names"
    ),
    references=("vllm/model_executor/layers/quantization/__init__.py:get_quantization_config",),
    requires=("checkpoint",),
)
def quantization_method_mismatch(facts: Facts, emit: Emit) -> Iterable[Finding]:
    ckq = checkpoint_quantization(facts)
    yield from _unbounded_pattern_findings(ckq.unbounded, emit)
    found = {f: names for f, names in ckq.formats.items()}
    described = "; ".join(f"{len(n)} {FORMAT_WORDS[f]} (e.g. {n[0]})" for f, n in sorted(found.items()))
    if ckq.method is None:
        if found and ckq.scales:
            yield emit.fail(
                f"the checkpoint is quantized ({described}; {len(ckq.scales)} scale tensors) but config.json has no "
                "quantization_config: vLLM builds an unquantized model and loads the integers as bfloat16 values",
                "config.json:quantization_config",
                {"formats": {f: n[:5] for f, n in found.items()}, "scales": ckq.scales[:5], "config_method": None},
                "add the quantization_config the quantizing tool wrote to config.json",
            )
            return
        yield emit.not_applicable("config.json has no quantization_config and the tensors are not quantized")
        return
    if ckq.expected is None:
        yield emit.skip(f"quant_method {ckq.method!r}: which weight format it implies is not known to this check")
        return
    other = {f: names for f, names in found.items() if f not in ckq.expected}
    if not other:
        yield emit.ok(
            f"the checkpoint's weights are {described or 'not quantized'}, as {ckq.method} says"
            if found
            else f"no quantized weight in the checkpoint under {ckq.method} (every layer float?)"
        )
        return
    wanted = ", ".join(FORMAT_WORDS[f] for f in sorted(ckq.expected))
    have = "; ".join(f"{len(n)} {FORMAT_WORDS[f]} (e.g. {n[0]})" for f, n in sorted(other.items()))
    yield emit.fail(
        f"config.json's quantization_config says {ckq.method} with {wanted}, but the checkpoint holds {have}: vLLM "
        "builds the parameters the config describes and loads the checkpoint's tensors into them",
        "config.json:quantization_config",
        {
            "config_method": ckq.method,
            "config_formats": sorted(ckq.expected),
            "checkpoint_formats": {f: n[:5] for f, n in other.items()},
        },
        "write the quantization_config of the tool that produced these tensors (or re-export the checkpoint as "
        f"{ckq.method})",
    )


@check(
    "VD317",
    "quantized-module-names-differ",
    "A method that quantizes layers by module name (GPTQ) finds none of the checkpoint's names in the model's layers.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "vLLM's GPTQ quantizes a layer only when its `prefix` contains one of `modules_in_block_to_quantize`, which "
        "vLLM fills from the checkpoint's names (the modules with integer tensors) when the config has none. "
        "vllm-doctor reads the names vLLM settled on and each layer's method from the model built on the meta "
        "device."
    ),
    why=(
        "A model that names its modules differently from the checkpoint (feed_forward for mlp, w2 for down_proj) gets "
        "those layers built unquantized although it passes quant_config: load_weights then looks for `qweight`, "
        "`g_idx` ... on a bfloat16 layer and fails with a bare KeyError."
    ),
    example="checkpoint: model.layers.0.mlp.down_proj.qweight; model: model.layers.0.feed_forward.down_proj",
    fix=(
        "name the model's modules as the checkpoint does (the `prefix` passed to each layer), or list the model's "
        "names in quantization_config's `modules_in_block_to_quantize` (vLLM's models map them through "
        "hf_to_vllm_mapper with `apply_vllm_mapper`)"
    ),
    references=(
        "vllm/model_executor/layers/quantization/utils/gptq_utils.py:is_layer_gptq_quantized",
        "vllm/model_executor/layers/quantization/auto_gptq.py:maybe_update_config",
    ),
    requires=("checkpoint", "weights-load"),
)
def quantized_module_names_differ(facts: Facts, emit: Emit) -> Iterable[Finding]:
    layers = quant_layers(facts)
    if layers is None or not layers.by_name:
        yield emit.not_applicable("the quantization method does not pick its layers by module name")
        return
    found = [layer for layer in unquantized_layers(facts) if layer.unmatched]
    if not found:
        yield emit.ok(f"every layer the checkpoint quantizes matches one of the {len(layers.by_name)} module names")
        return
    patterns = sorted({layer_pattern(layer.module) for layer in found})
    names = sorted({layer_pattern(n) for n in layers.by_name})
    first = next((layer for layer in found if layer.error), found[0])
    yield emit.fail(
        f"{layers.method} quantizes layers by module name and the model's {', '.join(patterns)} match none of the "
        f"checkpoint's ({', '.join(names[:8])}{' ...' if len(names) > 8 else ''}): vLLM builds them unquantized "
        f"({first.quant_method}) although quant_config is passed"
        + (f", and loading stops with {first.error.splitlines()[0]}" if first.error else ""),
        patterns[0],
        {
            "method": layers.method,
            "modules": [layer.module for layer in found],
            "modules_in_block_to_quantize": layers.by_name[:50],
            "vllm_error": first.error,
        },
        "name the model's modules as the checkpoint does (the prefix each layer is built with), or map them in "
        "load_weights and list the model's names in modules_in_block_to_quantize",
    )


def _unbounded_pattern_findings(patterns: list[dict[str, str]], emit: Emit) -> Iterable[Finding]:
    """A regular expression of the quantization config that vllm-doctor does not run (over the
    bound of :mod:`vllm_doctor.facts.user_regex`): vLLM matches it against every layer's name at
    start-up, as long as it takes; the model is not built (the weights pass and the engine stage)."""
    findings = [
        emit.fail(
            f"{p['key']} = {p['value']!r}: a regular expression vllm-doctor does not run: {p['why']}; vLLM matches "
            "it against every layer's name while it builds the model, for as long as that takes",
            f"config.json:{p['key']}",
            {"key": p["key"], "value": p["value"], "problem": p["why"], "kind": "unbounded-pattern"},
            "write the pattern without nested or alternating repetition (e.g. 're:.*lm_head', "
            "'re:.*self_attn\\.(q|k|v)_proj$'), or list the modules by name",
        )
        for p in patterns
    ]
    yield from capped_findings(findings, emit, "regular expressions vllm-doctor does not run")
