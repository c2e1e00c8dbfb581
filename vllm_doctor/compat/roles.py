"""What each module of a built model is: one answer, asked of vLLM first.

The per-layer profiler (which modules it times and under which kind), the roofline, the
performance lint (VD6xx: the projections, the encoder's attention, the A/B cost a projection's
time counts under), parity's hidden-state capture (decoder layers, encoder parts), the
quantization facts and the checks read a module's role here, and nowhere else:

- :func:`layer_class`: a leaf layer, by vLLM's own layer classes along its MRO (``LinearBase``,
  ``ParallelLMHead``, ``VocabParallelEmbedding``, ``LogitsProcessor``, ``FusedMoE`` /
  ``RoutedExperts``,
  ``AttentionLayerBase``, the classes of ``vllm.model_executor.layers.layernorm`` and
  ``rotary_embedding``), else torch's (``nn.Linear``, ``nn.Embedding``, its norms).
- :func:`module_kind`: the kind a module's time counts under (:data:`KINDS`): its layer class
  where it is one of vLLM's or torch's layers, else, for the model's own classes (which declare
  nothing), its class name and its place (``self_attn``, ``mlp``, ``lm_head``).
- :func:`model_parts`: a multimodal model's language model and encoder parts (towers and
  connectors), from vLLM's ``get_mm_mapping()`` (the module prefixes vLLM's LoRA manager and
  multimodal runner read), else ``SupportsMultiModal.get_language_model()``, else the children
  named like a tower or a projector (a Hugging Face reference model: :func:`named_parts`).

The kind of a token mixer (attention, MLA, state) is its own KV spec's:
:mod:`vllm_doctor.compat.mixers`; :func:`mixer_roots` places it on the decoder layer's child
that holds it. Nothing here imports vLLM: its classes are recognised by name and module along
the MRO, which holds across versions (0.26 to 0.33).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from vllm_doctor.compat import mixers
from vllm_doctor.compat.common import is_fused_moe
from vllm_doctor.facts.mixers import FAMILY

KINDS = ("embedding", "attention", "mla", "state", "router", "experts", "mlp", "norm", "logits")

# vLLM's layer classes by their name along the MRO, checked in this order (ParallelLMHead is a
# VocabParallelEmbedding; LinearBase subclasses share nothing else): -> the layer's class kind.
# Fused experts: compat.common.is_fused_moe
_VLLM_LAYERS: tuple[tuple[str, str], ...] = (
    ("AttentionLayerBase", "attention"),
    ("LogitsProcessor", "logits"),
    ("ParallelLMHead", "lm_head"),
    ("VocabParallelEmbedding", "embedding"),
    ("LinearBase", "linear"),
)
# vLLM's modules whose classes are all one kind (CustomOps without a common base class)
_VLLM_MODULES: tuple[tuple[str, str], ...] = (
    ("vllm.model_executor.layers.layernorm", "norm"),
    ("vllm.model_executor.layers.rotary_embedding", "rotary"),
)
_TORCH_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


@dataclass(frozen=True)
class LayerClass:
    """A leaf layer's class kind: ``attention``, ``mla``, ``state`` (a token mixer, by
    :func:`vllm_doctor.compat.mixers.layer_kind`), ``logits``, ``lm_head``, ``embedding``,
    ``experts``, ``linear``, ``norm`` or ``rotary``; ``vllm``: one of vLLM's layers (else torch's)."""

    kind: str
    vllm: bool


def _is_vllm(cls: type) -> bool:
    return cls.__module__.startswith("vllm.")


def layer_class(module: nn.Module) -> LayerClass | None:
    """What layer ``module`` is, by the classes it is built of (None: neither vLLM's nor torch's
    layers; a model's own class)."""
    mro = type(module).__mro__
    vllm_names = {c.__name__ for c in mro if _is_vllm(c)}
    for name, kind in _VLLM_LAYERS:
        if name in vllm_names:
            if kind == "attention":  # a token mixer: attention, MLA or a state (Mamba, GDN, ...)
                kind = FAMILY.get(mixers.layer_kind(module, None) or "", "attention")
            return LayerClass(kind, True)
    if is_fused_moe(module):  # FusedMoE (RoutedExperts since 0.31), or a loader taking expert_id
        return LayerClass("experts", any(_is_vllm(c) for c in mro))
    for prefix, kind in _VLLM_MODULES:
        if any(c.__module__ == prefix or c.__module__.startswith(prefix + ".") for c in mro):
            return LayerClass(kind, True)
    if isinstance(module, nn.Linear):
        return LayerClass("linear", False)
    if isinstance(module, nn.Embedding):
        return LayerClass("embedding", False)
    if isinstance(module, _TORCH_NORMS):
        return LayerClass("norm", False)
    return None


# a layer class's kind -> the kind its time counts under (linear: its parent's; None: inside its parent's)
_TIMED_AS: dict[str, str | None] = {
    "attention": "attention",
    "mla": "mla",
    "state": "state",
    "logits": "logits",
    "lm_head": "logits",
    "embedding": "embedding",
    "experts": "experts",
    "norm": "norm",
    "rotary": None,  # timed as part of its attention block
}


def module_kind(name: str, module: nn.Module) -> str | None:
    """The kind ``module``'s time counts under (one of :data:`KINDS`), or None (it is timed as
    part of its parent, or is no kind: a decoder layer, the model). vLLM's and torch's layers
    say what they are; a model's own class by its name and place."""
    layer = layer_class(module)
    if layer is not None and layer.kind in _TIMED_AS:
        return _TIMED_AS[layer.kind]
    return _named_kind(name, module)


def _named_kind(name: str, module: nn.Module) -> str | None:
    """A model's own module (or a plain linear) by its class name and its place in the model."""
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
    # "moe" in a class name: the MoE block, not the model or decoder layer of an MoE model (TinyMoeModel)
    moe_block = "moe" in cls and not any(k in cls for k in ("model", "layer", "decoder", "causallm"))
    if (
        moe_block
        or any(k in cls for k in ("mlp", "feedforward", "experts"))
        or leaf in ("mlp", "ffn", "feed_forward", "block_sparse_moe", "experts")
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


def mixer_roots(mixers: dict[str, str]) -> dict[str, str]:
    """The decoder layer's child that holds each token mixer (``model.layers.0.self_attn`` for
    ``model.layers.0.self_attn.mla_attn.mla_attn``, ``model.layers.0.mixer`` for a Mamba mixer)
    -> the mixer's kind; a mixer outside any decoder layer stands for itself."""
    out: dict[str, str] = {}
    for path, kind in mixers.items():
        layer = decoder_layer_name(path)
        if layer == path or not path.startswith(layer + "."):
            out[path] = kind
            continue
        out[f"{layer}.{path[len(layer) + 1 :].split('.')[0]}"] = kind
    return out


def kinds_by_path(model: nn.Module, mixers: dict[str, str] | None = None) -> dict[str, str]:
    """Each module under a kind -> the kind its time counts under: the topmost module with a
    kind (a token mixer's root by its KV spec, else :func:`module_kind`) and everything inside
    it, as the per-layer profiler counts them (``model.layers.0.self_attn.q_proj`` ->
    ``attention``; ``model.layers.0.mixer.in_proj`` -> ``state``)."""
    roots = mixer_roots(mixers or {})
    out: dict[str, str] = {}
    top: tuple[str, str] | None = None  # kind modules do not nest: named_modules() walks one at a time
    for name, module in model.named_modules():
        if not name:
            continue
        if top is not None and name.startswith(top[0] + "."):
            out[name] = top[1]
            continue
        kind = roots.get(name) or module_kind(name, module)
        top = (name, kind) if kind is not None else None
        if kind is not None:
            out[name] = kind
    return out


# ---------------------------------------------------------------------------------------------
# a multimodal model's parts

VISION_TOWER, PROJECTOR = "vision tower", "projector"
_ENCODER_PART = re.compile(r"vision|visual|image|audio|video|projector|multi_modal|^mm_")
_PROJECTOR_PART = re.compile(r"projector|multi_modal|connector|merger|aligner|mm_proj")


@dataclass(frozen=True)
class ModelParts:
    """A model's language model and encoder parts, by module path, and where that was read:
    ``get_mm_mapping`` (vLLM's declaration), ``get_language_model`` (the parts are the
    top-level modules beside it), ``names`` (children named like a tower or a projector) or
    ``text model`` (none)."""

    language_model: str | None = None  # None: the model is its own language model, or unnamed
    towers: tuple[str, ...] = ()
    connectors: tuple[str, ...] = ()
    source: str = "text model"

    @property
    def encoder(self) -> tuple[str, ...]:
        """Every encoder part, the towers first; a connector inside a tower (Qwen2.5-VL's
        ``visual.merger``) is in its tower, not named again."""
        inner = tuple(c for c in self.connectors if not any(_inside(c, t) for t in self.towers))
        return self.towers + inner

    def part_of(self, path: str) -> str | None:
        """:data:`PROJECTOR` or :data:`VISION_TOWER` for a module in an encoder part (the
        innermost part that holds it), None outside them."""
        if any(_inside(path, c) for c in self.connectors):
            return PROJECTOR
        if any(_inside(path, t) for t in self.towers):
            return VISION_TOWER
        return None

    def in_encoder(self, path: str) -> bool:
        return self.part_of(path) is not None

    def pairs(self) -> list[tuple[str, str]]:
        """``(part, module path)`` for each encoder part, the towers before the connectors."""
        return [(VISION_TOWER, t) for t in self.towers] + [
            (PROJECTOR, c) for c in self.connectors if c not in self.towers
        ]


def _inside(path: str, part: str) -> bool:
    return path == part or path.startswith(part + ".")


def model_parts(model: nn.Module) -> ModelParts:
    """A vLLM model's parts: vLLM's ``get_mm_mapping()`` where the model declares it, else its
    language model (``get_language_model()``) and the top-level modules beside it, else the
    children named like a tower or a projector. A text model has none."""
    if not getattr(model, "supports_multimodal", False):
        return ModelParts()
    paths = {n for n, _ in model.named_modules()}
    declared = _declared_parts(model, paths)
    if declared is not None:
        return declared
    lm_path = _language_model_path(model)
    if lm_path is not None:
        beside = _beside(model, lm_path)
        return ModelParts(
            language_model=lm_path,
            towers=tuple(p for p in beside if not _PROJECTOR_PART.search(p.rsplit(".", 1)[-1])),
            connectors=tuple(p for p in beside if _PROJECTOR_PART.search(p.rsplit(".", 1)[-1])),
            source="get_language_model",
        )
    return named_parts(model)


def named_parts(model: nn.Module) -> ModelParts:
    """Parts by name alone (a Hugging Face reference model, or a vLLM model that declares
    nothing): the children (of the model, or of its ``model``) named like a tower or a
    projector (``vision_tower``, ``visual``, ``multi_modal_projector``, ``audio_tower``, ...)."""
    names = [n for n, _ in model.named_children()]
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module):
        names += [f"model.{n}" for n, _ in inner.named_children()]
    found = [n for n in names if _ENCODER_PART.search(n.rsplit(".", 1)[-1])]
    if not found:
        return ModelParts()
    return ModelParts(
        towers=tuple(n for n in found if not _PROJECTOR_PART.search(n.rsplit(".", 1)[-1])),
        connectors=tuple(n for n in found if _PROJECTOR_PART.search(n.rsplit(".", 1)[-1])),
        source="names",
    )


def _declared_parts(model: nn.Module, paths: set[str]) -> ModelParts | None:
    """vLLM's ``MultiModelKeys`` (``language_model``, ``connector``, ``tower_model``: module
    prefixes, with or without a trailing dot) resolved to the modules this model has; None where
    the model declares none, or names no module it has (a stale declaration is not believed)."""
    get = getattr(model, "get_mm_mapping", None)
    if not callable(get):
        return None
    try:
        keys = get()
    except Exception:
        return None

    def resolve(field: str) -> tuple[str, ...]:
        value = getattr(keys, field, None)
        items = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else []
        found = []
        for item in items:
            if not isinstance(item, str):
                continue
            prefix = item.rstrip(".")
            if prefix in paths:
                found.append(prefix)
        return tuple(dict.fromkeys(found))

    lms, connectors, towers = resolve("language_model"), resolve("connector"), resolve("tower_model")
    if not (towers or connectors):
        return None
    return ModelParts(
        language_model=lms[0] if lms else None,
        towers=towers,
        connectors=connectors,
        source="get_mm_mapping",
    )


def _language_model_path(model: nn.Module) -> str | None:
    get = getattr(model, "get_language_model", None)
    if not callable(get):
        return None
    try:
        lm = get()
    except Exception:
        return None
    if not isinstance(lm, nn.Module) or lm is model:
        return None
    return next((n for n, m in model.named_modules() if m is lm), None)


def _beside(model: nn.Module, lm_path: str) -> list[str]:
    """The top-level modules (of the model, or of its ``model``) that are neither the language
    model nor hold it, nor one of vLLM's or torch's layers (the LM head, the logits processor)
    unless named like a tower or a projector."""
    scopes: list[tuple[str, nn.Module]] = [("", model)]
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module) and lm_path.startswith("model."):
        scopes.append(("model.", inner))
    parts = []
    for pre, scope in scopes:
        for name, child in scope.named_children():
            path = pre + name
            if _inside(lm_path, path):
                continue
            named = bool(_ENCODER_PART.search(name))  # a projector may be one plain linear
            if named or (layer_class(child) is None and not is_library(type(child))):
                parts.append(path)
    return parts


# module prefixes of library code (the parts of vLLM that are no model definitions included)
LIBRARY_PREFIXES = ("torch.", "vllm.", "transformers.")
MODEL_PACKAGES = ("vllm.model_executor.models.",)  # vLLM's own model definitions: model code


def is_library(cls: type) -> bool:
    """Library code, not a model: torch, transformers, and every part of vLLM but its model
    definitions (a plugin's model may hold vLLM's sampler or other engine modules)."""
    module = cls.__module__
    if module.startswith(MODEL_PACKAGES):
        return False
    return module.startswith(LIBRARY_PREFIXES) or module in ("builtins", "torch")


def language_model(model: nn.Module) -> nn.Module | None:
    """The module whose decoder layers are the language model's: the one ``model_parts`` names,
    else ``get_language_model()``; None for a text model (it is its own)."""
    modules = dict(model.named_modules())
    path = model_parts(model).language_model
    found = modules.get(path) if path is not None else None
    if (found is None or found is model) and getattr(model, "supports_multimodal", False):
        path = _language_model_path(model)
        found = modules.get(path) if path is not None else None
    return found if isinstance(found, nn.Module) and found is not model else None
