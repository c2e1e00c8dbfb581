"""What the weights pass says about a quantized model's layers, for VD314/VD315 and for the
per-name checks that defer to them (VD301, VD302, VD304); no check registers here.

The weights pass (compat/quant_build.py) reports each layer's quantization method as vLLM picked it
(``facts.weight_load["quant"]``) and the parameters vLLM fills itself when the checkpoint has
none (the KV-cache methods' ``q/k/v_scale`` and zero points). With the ledger's accounts:

- an *unquantized layer* (VD314): vLLM built it with an ``Unquantized*`` method (no
  ``quant_config`` passed, or a plain ``nn.Linear``) while the checkpoint holds quantized weights
  or scales for it (tensors loaded into it, or looked up under its name);
- *missing scales* (VD315): a layer vLLM quantizes whose scales / zero points / other
  quantization parameters no checkpoint tensor fills.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import wire
from vllm_doctor.facts.quant_checkpoint import (
    FP8_DTYPES,
    INT_DTYPES,
    WEIGHT_LEAVES,
    CheckpointQuant,
    checkpoint_quant,
    is_scale,
)
from vllm_doctor.facts.static import Facts

LAYER = re.compile(r"(?<=\.)(\d+)(?=\.)")


@dataclass(frozen=True)
class QuantModule:
    """One layer of ``facts.weight_load["quant"]["modules"]`` (compat/quant_build.py)."""

    quant_method: str | None = None
    scheme: str | None = None
    plain_linear: bool = False
    kv_cache: bool = False
    quantized: bool = False
    params: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class QuantLayers:
    """``facts.weight_load["quant"]``."""

    method: str | None = None
    modules: dict[str, QuantModule] = field(default_factory=dict)
    defaulted: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # checkpoint tensors the method's mapper discards
    by_name: list[str] | None = None  # the module names a method quantizes by name (GPTQ); None: not by name


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
    data = facts.usable_weight_load()
    if data is None or "quant" not in data:
        return None
    return wire.read(QuantLayers, data["quant"])


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


def _targets(t: dict[str, Any]) -> set[str]:
    """The parameter names a checkpoint tensor went to, was handed to, or was looked up as."""
    out = set(t["params"])
    out |= {h["param"] for h in t.get("handed_to") or [] if h.get("param")}
    out |= {e["looked_up"] for e in t["errors"] if e.get("looked_up")}
    return out


def unquantized_layers(facts: Facts) -> list[UnquantizedLayer]:
    """The layers VD314 names (empty unless the checkpoint is quantized by config and tensors)."""
    layers = quant_layers(facts)
    data = facts.usable_weight_load()
    if layers is None or data is None:
        return []
    ckq = checkpoint_quantization(facts)
    if not ckq.quantized:
        return []
    params: dict[str, Any] = data["params"]
    tensors: dict[str, Any] = data["tensors"]
    candidates = {m: q for m, q in layers.modules.items() if m and not q.quantized and not q.kv_cache}
    found: dict[str, dict[str, Any]] = {}
    for tname, t in tensors.items():
        for target in _targets(t):
            module = target.rsplit(".", 1)[0]
            if module not in candidates:
                continue
            rec = found.setdefault(module, {"tensors": [], "quantized": [], "unloadable": [], "error": ""})
            if tname not in rec["tensors"]:
                rec["tensors"].append(tname)
            if t["dtype"] in INT_DTYPES | FP8_DTYPES:
                rec["quantized"].append((tname, t["dtype"]))
            if target not in params:
                rec["unloadable"].append(tname)
                if not rec["error"] and t["errors"]:
                    rec["error"] = str(t["errors"][0]["error"])
    out = []
    for module, rec in sorted(found.items()):
        if not rec["quantized"] and not any(is_scale(n) for n in rec["unloadable"]):
            continue  # float tensors only (an ignored lm_head, a norm): not quantized in the checkpoint
        q = candidates[module]
        weight = params.get(f"{module}.weight")
        out.append(
            UnquantizedLayer(
                module=module,
                quant_method=q.quant_method,
                param_dtype=weight["dtype"] if weight else None,
                tensors=rec["tensors"],
                quantized_tensors=rec["quantized"],
                unloadable=rec["unloadable"],
                error=rec["error"],
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


def missing_quant_params(facts: Facts) -> dict[str, list[str]]:
    """Module -> the quantization parameters (scales, zero points, ...) of a layer vLLM quantizes
    that no checkpoint tensor fills (VD315; VD301 defers to it)."""
    layers = quant_layers(facts)
    data = facts.usable_weight_load()
    if layers is None or data is None or not layers.method:
        return {}
    params: dict[str, Any] = data["params"]
    out: dict[str, list[str]] = {}
    for module, q in layers.modules.items():
        if not q.quantized:
            continue
        for leaf in q.params:
            name = f"{module}.{leaf}" if module else leaf
            p = params.get(name)
            if p is None or p["written"] or leaf in WEIGHT_LEAVES or leaf == "bias" or name in layers.defaulted:
                continue
            out.setdefault(module, []).append(leaf)
    return out


def layer_pattern(module: str) -> str:
    """model.layers.3.mlp.down_proj -> model.layers.*.mlp.down_proj."""
    return LAYER.sub("*", module)


def layer_of(module: str) -> str | None:
    found = LAYER.search(module)
    return found.group(1) if found else None
