"""Which modules the per-layer profiler times.

What kind each module is has one answer, :mod:`vllm_doctor.compat.roles` (asked of vLLM's layer
classes, the token mixers' KV specs and ``get_mm_mapping()``; by name only for a model's own
classes): attention, mla, state, mlp, norm, embedding, logits, and in a mixture of experts router
and experts. The profiler times the root model, each decoder layer (an element of a ``ModuleList``
named layers/h/blocks) and the *topmost* module of each kind (``self_attn``, not
``self_attn.qkv_proj``), so kind totals never double count. Forward time not inside any kind
module is reported as "other" (residual adds, rotary embeddings outside attention, glue code).

An MoE block (the decoder layer's child that holds vLLM's fused experts: ``FusedMoE`` /
``RoutedExperts``, or any module whose ``weight_loader`` takes an ``expert_id``, asked of the
model by :func:`vllm_doctor.compat.common.is_fused_moe`) is not timed as one "mlp": its router
(the block's ``gate``/``router`` child) is kind "router", the child that runs the experts
(vLLM's ``MoERunner`` or ``FusedMoE``) kind "experts"; a shared expert the block calls itself
stays "mlp". A module the experts' module also holds (a gate or shared expert vLLM runs inside
the fused op) is not timed apart: its time is in "experts" (never counted twice).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from vllm_doctor.compat.common import is_fused_moe
from vllm_doctor.compat.roles import KINDS, decoder_layer_name, mixer_roots, module_kind

__all__ = [
    "KINDS",
    "ROUTER_NAMES",
    "TimedModule",
    "decoder_layer_name",
    "layer_index",
    "mixer_roots",
    "module_kind",
    "moe_parts",
    "select_modules",
]

ROUTER_NAMES = ("gate", "router")
_LAYER_NAME = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)$")
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")
_LAYER_PREFIX = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|blocks)\.\d+)(?:\.|$)")


def layer_index(name: str) -> int | None:
    match = _LAYER_INDEX.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class TimedModule:
    name: str  # qualified name in the model ("" is the root)
    kind: str  # one of KINDS, "layer" or "model"
    layer: int | None
    cls: str


def moe_parts(model: nn.Module) -> dict[str, str | None]:
    """The parts of each MoE block: qualified name -> kind ("router", "experts", "mlp" for a
    shared expert the block runs itself), "" for the block itself (not timed: its parts are),
    None for a module the experts' module also holds (timed inside it, not apart). Empty for a
    dense model."""
    modules = dict(model.named_modules())
    fused = [n for n, m in modules.items() if n and is_fused_moe(m)]
    fused = [n for n in fused if not any(n.startswith(f + ".") for f in fused)]  # topmost only
    out: dict[str, str | None] = {}
    for name in fused:
        match = _LAYER_PREFIX.match(name)
        if match is None or name == match.group(1):
            out[name] = "experts"
            continue
        layer = match.group(1)
        rest = name[len(layer) + 1 :].split(".")
        if len(rest) == 1:  # the fused module is the layer's child: the whole MoE is "experts"
            out[name] = "experts"
            continue
        block, experts = f"{layer}.{rest[0]}", f"{layer}.{rest[0]}.{rest[1]}"
        out[block] = ""
        out[experts] = "experts"
        inside = {id(m) for m in modules[experts].modules()}
        for child_name, child in modules[block].named_children():
            full = f"{block}.{child_name}"
            if full == experts:
                continue
            if id(child) in inside:
                out[full] = None  # run inside the experts' call (vLLM's runner holds it)
            elif child_name in ROUTER_NAMES:
                out[full] = "router"
            elif "shared" in child_name and "gate" not in child_name:
                out[full] = "mlp"
    return out


def select_modules(
    model: nn.Module,
    within: nn.Module | None = None,
    skip: tuple[str, ...] = (),
    mixers: dict[str, str] | None = None,
) -> list[TimedModule]:
    """Root, decoder layers and topmost kind modules, in model order. ``within``: a multimodal
    model's language model, the only part whose modules are timed (the vision tower's layers
    are no decoder layers; the encoder is timed as one call, ``encoder_s``), the logits
    processor wherever it sits; ``skip``: or the encoder's parts by name, left out; ``mixers``:
    where vLLM's token mixers sit and their kinds (:func:`vllm_doctor.compat.mixers.mixer_paths`):
    the decoder layer's child that holds one is timed as that kind (attention, mla, state),
    whatever its name."""
    chosen: list[TimedModule] = [TimedModule("", "model", None, type(model).__qualname__)]
    kind_roots: list[str] = []
    parents: dict[str, nn.Module] = {}
    moe = moe_parts(model)
    roots = mixer_roots(mixers or {})
    prefix = None if within is None else next((n for n, m in model.named_modules() if m is within), None)
    for name, mod in model.named_modules():
        if not name:
            continue
        if prefix and not (name == prefix or name.startswith(prefix + ".")) and module_kind(name, mod) != "logits":
            continue
        if skip and any(name == p or name.startswith(p + ".") for p in skip):
            continue
        parent_name = name.rsplit(".", 1)[0] if "." in name else ""
        parents[name] = mod
        parent = parents.get(parent_name, model if not parent_name else None)
        if _LAYER_NAME.search(name) and isinstance(parent, nn.ModuleList):
            chosen.append(TimedModule(name, "layer", layer_index(name), type(mod).__qualname__))
            continue
        if any(name.startswith(root + ".") for root in kind_roots):
            continue
        if name in moe:
            moe_kind = moe[name]
            if moe_kind == "":
                continue  # the MoE block itself: its parts are timed
            kind_roots.append(name)  # (None: held by the experts' module, timed inside it)
            if moe_kind is not None:
                chosen.append(TimedModule(name, moe_kind, layer_index(name), type(mod).__qualname__))
            continue
        kind = roots.get(name) or module_kind(name, mod)
        if kind is None:
            continue
        kind_roots.append(name)
        chosen.append(TimedModule(name, kind, layer_index(name), type(mod).__qualname__))
    return chosen
