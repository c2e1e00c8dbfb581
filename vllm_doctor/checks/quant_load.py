"""What the weights pass says about a quantized model's layers, for VD314/VD315 and for the
per-name checks that defer to them (VD301, VD302, VD304); no check registers here.

The weights pass (compat/quant_build.py) reports each layer's quantization method as vLLM picked it
(``facts.usable_weights().quant``, a :class:`~vllm_doctor.facts.static.QuantLayers`) and the
parameters vLLM fills itself when the checkpoint has none (the KV-cache methods' ``q/k/v_scale``
and zero points). With the ledger's accounts:

- an *unquantized layer* (VD314): vLLM built it with an ``Unquantized*`` method (no
  ``quant_config`` passed, or a plain ``nn.Linear``) while the checkpoint holds quantized weights
  or scales for it (tensors loaded into it, or looked up under its name);
- *missing scales* (VD315): a layer vLLM quantizes whose scales / zero points / other
  quantization parameters no checkpoint tensor fills;
- *malformed scales* (VD315): a scale the checkpoint has for such a layer, stored as an integer
  or boolean where vLLM's parameter is a float (vLLM casts it as it is: a scale of 0 or 1), or in
  a shape the parameter does not take (the load fails for it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vllm_doctor.facts.checkpoint import FLOAT_DTYPES
from vllm_doctor.facts.quant_checkpoint import (
    FP8_DTYPES,
    INT_DTYPES,
    WEIGHT_LEAVES,
    CheckpointQuant,
    checkpoint_quant,
    is_scale,
)
from vllm_doctor.facts.static import Facts, QuantLayers, TensorLoad

LAYER = re.compile(r"(?<=\.)(\d+)(?=\.)")
# a parameter's dtype as the weights pass records it (torch's name) -> the safetensors name
ST_DTYPES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
    "int8": "I8",
    "uint8": "U8",
    "int32": "I32",
    "int64": "I64",
    "bool": "BOOL",
}


@dataclass(frozen=True)
class UnquantizedLayer:
    """A layer vLLM builds unquantized in front of quantized checkpoint tensors."""

    module: str
    quant_method: str | None  # None: a plain nn.Linear
    param_dtype: str | None  # the dtype of its weight parameter
    tensors: list[str]  # the checkpoint tensors meant for it (their VD302/VD304 defer here)
    quantized_tensors: list[tuple[str, str]]  # (tensor, dtype) of its quantized weights
    unloadable: list[str]  # its scales etc. that have no parameter
    error: str = ""  # what load_weights raised for them
    ignored_by: str | None = None  # the config's ignore entry that names it
    unmatched: bool = False  # the method quantizes by name and no name it quantizes matches this layer (VD317)


def quant_layers(facts: Facts) -> QuantLayers | None:
    """The layers' quantization methods (the reply's ``quant``), or None without them."""
    got = facts.usable_weights()
    return got.quant if got is not None else None


def checkpoint_quantization(facts: Facts) -> CheckpointQuant:
    ck = facts.checkpoint
    return checkpoint_quant(facts.config, [(t.name, t.dtype) for t in ck.tensors] if ck is not None else [])


def defaulted_params(facts: Facts) -> dict[str, str]:
    """Parameters vLLM fills itself when the checkpoint has none (VD301 does not report them)."""
    layers = quant_layers(facts)
    return dict(layers.defaulted) if layers is not None else {}


def dropped_by_method(facts: Facts) -> set[str]:
    """Checkpoint tensors the quantization method tells vLLM's AutoWeightsLoader to discard
    (GPTQ's g_idx): VD302 does not report them as skipped."""
    layers = quant_layers(facts)
    return set(layers.dropped) if layers is not None else set()


def _targets(t: TensorLoad) -> set[str]:
    """The parameter names a checkpoint tensor went to, was handed to, or was looked up as."""
    out = set(t.params)
    out |= {h.param for h in t.handed_to if h.param}
    out |= {e.looked_up for e in t.errors if e.looked_up}
    return out


@dataclass
class _MeantFor:
    """The checkpoint tensors meant for one layer built unquantized, as they are gathered."""

    tensors: list[str] = field(default_factory=list)
    quantized: list[tuple[str, str]] = field(default_factory=list)  # (tensor, dtype) of its quantized weights
    unloadable: list[str] = field(default_factory=list)  # those that have no parameter
    error: str = ""  # the first error loading one of those raised


def unquantized_layers(facts: Facts) -> list[UnquantizedLayer]:
    """The layers VD314 names (empty unless the checkpoint is quantized by config and tensors)."""
    data = facts.usable_weights()
    layers = quant_layers(facts)
    if layers is None or data is None:
        return []
    ckq = checkpoint_quantization(facts)
    if not ckq.quantized:
        return []
    params, tensors = data.params, data.tensors
    candidates = {m: q for m, q in layers.modules.items() if m and not q.quantized and not q.kv_cache}
    found: dict[str, _MeantFor] = {}
    for tname, t in tensors.items():
        for target in _targets(t):
            module = target.rsplit(".", 1)[0]
            if module not in candidates:
                continue
            rec = found.setdefault(module, _MeantFor())
            if tname not in rec.tensors:
                rec.tensors.append(tname)
            if t.dtype in INT_DTYPES | FP8_DTYPES:
                rec.quantized.append((tname, t.dtype))
            if target not in params:
                rec.unloadable.append(tname)
                if not rec.error and t.errors:
                    rec.error = t.errors[0].error
    out = []
    for module, rec in sorted(found.items()):
        if not rec.quantized and not any(is_scale(n) for n in rec.unloadable):
            continue  # float tensors only (an ignored lm_head, a norm): not quantized in the checkpoint
        q = candidates[module]
        weight = params.get(f"{module}.weight")
        out.append(
            UnquantizedLayer(
                module=module,
                quant_method=q.quant_method,
                param_dtype=weight.dtype if weight is not None else None,
                tensors=rec.tensors,
                quantized_tensors=rec.quantized,
                unloadable=rec.unloadable,
                error=rec.error,
                ignored_by=ckq.ignored(module),
                unmatched=bool(layers.by_name) and not any(n in module for n in layers.by_name or []),
            )
        )
    return out


def unquantized_tensors(facts: Facts) -> set[str]:
    """The checkpoint tensors VD314 accounts for (VD302 and VD304 defer to it)."""
    return {n for layer in unquantized_layers(facts) for n in layer.tensors}


def unquantized_modules(facts: Facts) -> set[str]:
    return {layer.module for layer in unquantized_layers(facts)}


def st_dtype(torch_dtype: str) -> str:
    """``float32`` / ``torch.float32`` -> ``F32`` (the name safetensors headers use)."""
    name = torch_dtype.removeprefix("torch.")
    return ST_DTYPES.get(name, name.upper())


@dataclass(frozen=True)
class MalformedScale:
    """A checkpoint scale of a layer vLLM quantizes, present but of the wrong dtype or shape."""

    module: str
    leaf: str  # the parameter's leaf (weight_scale, input_scale)
    tensor: str  # the checkpoint tensor
    problem: str  # "dtype" | "shape"
    dtype: str  # the tensor's (safetensors name)
    shape: list[int]
    param_dtype: str  # the parameter's (safetensors name)
    param_shape: list[int]  # the parameter's (a fused parameter's whole shape)
    error: str = ""  # what the loader raised for it


def _quant_param_targets(layers: QuantLayers) -> dict[str, tuple[str, str]]:
    """Parameter name -> (module, leaf) for the quantization parameters (not the weight, not the
    bias) of every layer vLLM quantizes."""
    out = {}
    for module, q in layers.modules.items():
        if q.quantized:
            for leaf in q.params:
                if leaf not in WEIGHT_LEAVES and leaf != "bias":
                    out[f"{module}.{leaf}" if module else leaf] = (module, leaf)
    return out


def _wrong_kind(dtype: str, param_dtype: str) -> bool:
    """A scale stored as a boolean, or as an integer where the parameter is a float: vLLM's loader
    casts it as it is (True -> 1.0, an int64 0 -> 0.0), it never means the float it should."""
    if dtype == "BOOL":
        return param_dtype != "BOOL"
    return dtype not in FLOAT_DTYPES and param_dtype in FLOAT_DTYPES


def malformed_scales(facts: Facts) -> list[MalformedScale]:
    """The checkpoint's scales of layers vLLM quantizes that are there but stored wrong (VD315
    names them with the dtype/shape found and the one wanted; VD301, VD303, VD304 defer to it)."""
    data = facts.usable_weights()
    layers = quant_layers(facts)
    if layers is None or data is None or not layers.method:
        return []
    targets = _quant_param_targets(layers)
    params = data.params
    out = []
    for tname, t in data.tensors.items():
        if not is_scale(tname):
            continue
        for target in sorted(_targets(t)):
            if target not in targets or target not in params:
                continue
            module, leaf = targets[target]
            p = params[target]
            pdt = st_dtype(p.dtype)
            error = t.errors[0].error if t.errors else ""
            want = list(t.expected_shape or p.shape)
            if _wrong_kind(t.dtype, pdt):
                out.append(MalformedScale(module, leaf, tname, "dtype", t.dtype, list(t.shape), pdt, want, error))
            elif t.status == "shape_mismatch":
                out.append(MalformedScale(module, leaf, tname, "shape", t.dtype, list(t.shape), pdt, want, error))
            break
    return out


def malformed_tensors(facts: Facts) -> set[str]:
    """The checkpoint tensors VD315 names as malformed scales (VD303 and VD304 defer to it)."""
    return {m.tensor for m in malformed_scales(facts)}


def missing_quant_params(facts: Facts) -> dict[str, list[str]]:
    """Module -> the quantization parameters (scales, zero points, ...) of a layer vLLM quantizes
    that no checkpoint tensor fills (VD315; VD301 defers to it)."""
    data = facts.usable_weights()
    layers = quant_layers(facts)
    if layers is None or data is None or not layers.method:
        return {}
    params = data.params
    present = {(m.module, m.leaf) for m in malformed_scales(facts)}  # there, stored wrong: not "missing"
    out: dict[str, list[str]] = {}
    for module, q in layers.modules.items():
        if not q.quantized:
            continue
        for leaf in q.params:
            name = f"{module}.{leaf}" if module else leaf
            p = params.get(name)
            if p is None or p.written or leaf in WEIGHT_LEAVES or leaf == "bias" or name in layers.defaulted:
                continue
            if (module, leaf) not in present:
                out.setdefault(module, []).append(leaf)
    return out


def layer_pattern(module: str) -> str:
    """model.layers.3.mlp.down_proj -> model.layers.*.mlp.down_proj."""
    return LAYER.sub("*", module)


def layer_of(module: str) -> str | None:
    found = LAYER.search(module)
    return found.group(1) if found else None
