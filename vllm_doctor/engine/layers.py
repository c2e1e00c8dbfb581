"""Which modules the per-layer profiler times, and what kind each one is.

Kinds: attention, mlp, norm, embedding, logits. The profiler times the root model, each
decoder layer (an element of a ``ModuleList`` named layers/h/blocks) and the *topmost* module
of each kind (``self_attn``, not ``self_attn.qkv_proj``), so kind totals never double count.
Forward time not inside any kind module is reported as "other" (residual adds, rotary
embeddings outside attention, glue code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

KINDS = ("embedding", "attention", "mlp", "norm", "logits")
_LAYER_NAME = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)$")
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


def module_kind(name: str, module: nn.Module) -> str | None:
    cls = type(module).__name__.lower()
    leaf = name.rsplit(".", 1)[-1].lower()
    if "logitsprocessor" in cls or leaf in ("logits_processor", "lm_head") or "lmhead" in cls:
        return "logits"
    if "rotary" in cls or "rope" in leaf:
        return None  # timed as part of its attention block
    if "embed" in cls or "embed" in leaf:
        return "embedding"
    if "attention" in cls or leaf in ("self_attn", "attn", "attention", "cross_attn"):
        return "attention"
    if any(k in cls for k in ("mlp", "moe", "feedforward", "experts")) or leaf in (
        "mlp",
        "ffn",
        "feed_forward",
        "block_sparse_moe",
        "experts",
    ):
        return "mlp"
    if "norm" in cls or "norm" in leaf:
        return "norm"
    return None


_LAYER_PREFIX = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|blocks)\.\d+)(?:\.|$)")


def decoder_layer_name(name: str) -> str:
    """The decoder layer a module belongs to ("model.layers.3" for "model.layers.3.self_attn.attn");
    the name itself outside any layer."""
    match = _LAYER_PREFIX.match(name)
    return match.group(1) if match else name


def layer_index(name: str) -> int | None:
    match = _LAYER_INDEX.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class TimedModule:
    name: str  # qualified name in the model ("" is the root)
    kind: str  # one of KINDS, "layer" or "model"
    layer: int | None
    cls: str


def select_modules(model: nn.Module, within: nn.Module | None = None, skip: tuple[str, ...] = ()) -> list[TimedModule]:
    """Root, decoder layers and topmost kind modules, in model order. ``within``: a multimodal
    model's language model, the only part whose modules are timed (the vision tower's layers
    are no decoder layers; the encoder is timed as one call, ``encoder_s``), the logits
    processor wherever it sits; ``skip``: or the encoder's parts by name, left out."""
    chosen: list[TimedModule] = [TimedModule("", "model", None, type(model).__qualname__)]
    kind_roots: list[str] = []
    parents: dict[str, nn.Module] = {}
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
        kind = module_kind(name, mod)
        if kind is None or any(name.startswith(root + ".") for root in kind_roots):
            continue
        kind_roots.append(name)
        chosen.append(TimedModule(name, kind, layer_index(name), type(mod).__qualname__))
    return chosen
