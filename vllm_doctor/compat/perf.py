"""The performance anatomy of a built model (VD6xx), read off its module tree.

Runs where the model exists, on any device (the meta device of the weights pass, the engine
worker's real one): one walk of ``named_modules()`` and, for each model class on it, one read of
its module's source (:mod:`vllm_doctor.compat.perf_source`). Which vLLM classes count as
projections, embeddings and attention layers is detected by capability: vLLM's own base classes
when they import, else by name along the MRO. Nothing here changes the model.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from vllm_doctor.compat.common import qualname
from vllm_doctor.compat.perf_source import scan_class
from vllm_doctor.facts.perf import ModelClass, PerfAnatomy, Projection, SourceFinding

# module prefixes of library code: the lint reads model classes, not the layers they are built of
LIBRARY_PREFIXES = (
    "torch.",
    "vllm.model_executor.layers.",
    "vllm.attention.",
    "vllm.distributed.",
    "vllm.compilation.",
    "vllm.lora.",
    "transformers.",
)
# vLLM's own model definitions: read like a plugin's (the in-tree no-false-positive test)
MODEL_PACKAGES = ("vllm.model_executor.models.",)
MAX_CLASSES = 200  # model classes whose source is read (a model has a handful)


def _vllm_base(*candidates: tuple[str, str]) -> tuple[type, ...]:
    """The vLLM classes among ``(module, name)`` candidates that this vLLM has (none imported
    fresh: only modules the model's build already loaded)."""
    found = []
    for module, name in candidates:
        mod = sys.modules.get(module)
        cls = getattr(mod, name, None) if mod is not None else None
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def _mro_names(cls: type) -> set[str]:
    return {c.__name__ for c in cls.__mro__}


def _is_vllm(cls: type) -> bool:
    return cls.__module__.startswith("vllm.")


@dataclass(frozen=True)
class VllmBases:
    """vLLM's base classes of linear, embedding and attention layers, as this vLLM has them."""

    linear: tuple[type, ...]
    embedding: tuple[type, ...]
    attention: tuple[type, ...]

    @classmethod
    def of_this_vllm(cls) -> VllmBases:
        return cls(
            linear=_vllm_base(("vllm.model_executor.layers.linear", "LinearBase")),
            embedding=_vllm_base(("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding")),
            attention=_vllm_base(
                ("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
                ("vllm.attention.layer", "AttentionLayerBase"),
            ),
        )


def classify(module: nn.Module, bases: VllmBases | None = None) -> str | None:
    """ "vllm-linear", "plain-linear", "vllm-embedding", "plain-embedding", "attention" or None."""
    bases = bases or VllmBases.of_this_vllm()
    cls = type(module)
    names = _mro_names(cls)
    if (bases.attention and isinstance(module, bases.attention)) or "AttentionLayerBase" in names:
        return "attention"
    if (bases.linear and isinstance(module, bases.linear)) or ("LinearBase" in names and _is_vllm(cls)):
        return "vllm-linear"
    if (bases.embedding and isinstance(module, bases.embedding)) or (
        "VocabParallelEmbedding" in names and _is_vllm(cls)
    ):
        return "vllm-embedding"
    if isinstance(module, nn.Linear):
        return "plain-linear"
    if isinstance(module, nn.Embedding):
        return "plain-embedding"
    return None


def _sizes(module: nn.Module, kind: str) -> tuple[int | None, int | None]:
    if kind == "plain-linear":
        return _int(getattr(module, "in_features", None)), _int(getattr(module, "out_features", None))
    if kind == "plain-embedding":
        return _int(getattr(module, "num_embeddings", None)), _int(getattr(module, "embedding_dim", None))
    if kind == "vllm-embedding":
        rows = getattr(module, "org_vocab_size", None) or getattr(module, "num_embeddings", None)
        return _int(rows), _int(getattr(module, "embedding_dim", None))
    return _int(getattr(module, "input_size", None)), _int(getattr(module, "output_size", None))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _weight_dtype(module: nn.Module) -> str | None:
    weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    return str(weight.dtype).replace("torch.", "") if weight is not None else None


def _is_library(cls: type) -> bool:
    """Library code, not a model: torch, transformers, and every part of vLLM but its model
    definitions (a plugin's model may hold vLLM's sampler or other engine modules)."""
    module = cls.__module__
    if module.startswith("vllm.") and not module.startswith(MODEL_PACKAGES):
        return True
    return module.startswith(LIBRARY_PREFIXES) or module in ("builtins", "torch")


def _containers(module: nn.Module) -> set[str]:
    return {
        name
        for name, child in module._modules.items()
        if isinstance(child, (nn.ModuleList, nn.ModuleDict, nn.Sequential))
    }


def _defining_class(cls: type) -> type:
    """The class along the MRO that defines ``forward`` (a subclass may inherit it)."""
    for base in cls.__mro__:
        if "forward" in vars(base):
            return base
    return cls


def encoder_modules(model: nn.Module) -> tuple[str, ...]:
    """A multimodal model's encoder parts, asked of the model: the top-level modules (of the
    model, or of its ``model``) that are neither its language model
    (``SupportsMultiModal.get_language_model``) nor hold it, nor a single vLLM layer or library
    module (the LM head, the logits processor); where the model cannot name its language model,
    its children named like a tower or projector (:func:`vllm_doctor.compat.worker.encoder_prefixes`).
    Empty for a text model."""
    from vllm_doctor.compat import worker as wv

    lm = wv.language_model(model)
    lm_path = None if lm is None else next((n for n, m in model.named_modules() if m is lm), None)
    if lm_path is None:
        return wv.encoder_prefixes(model)
    scopes: list[tuple[str, nn.Module]] = [("", model)]
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module) and lm_path.startswith("model."):
        scopes.append(("model.", inner))
    parts = []
    for pre, scope in scopes:
        for name, child in scope.named_children():
            path = pre + name
            if path == lm_path or lm_path.startswith(path + "."):
                continue
            if classify(child) is None and not _is_library(type(child)):
                parts.append(path)
    return tuple(parts)


def encoder_attention_layer() -> str | None:
    """The attention layer vLLM's own multimodal encoders (CLIP, SigLIP) use: non-causal, over
    each item's tokens, no KV cache (``MMEncoderAttention``; older vLLM: ``MultiHeadAttention``).
    Read from the modules the model's build loaded; None where this vLLM has neither."""
    for module, name in (
        ("vllm.model_executor.layers.attention", "MMEncoderAttention"),
        ("vllm.attention.layer", "MultiHeadAttention"),
    ):
        if _vllm_base((module, name)):
            return f"{module}.{name}"
    return None


def perf_anatomy(model: nn.Module, hf_config: Any, dtype: Any, source: str) -> PerfAnatomy:
    """Walk ``model`` once: projections, embeddings, attention layers, compiled classes, and the
    forward path of each model class."""
    hidden = _int(getattr(hf_config, "hidden_size", None))
    big = max(1, (hidden or 0) // 4)  # a projection of at least a quarter of the hidden size
    projections: list[Projection] = []
    attention: list[str] = []
    compiled: list[str] = []
    classes: dict[type, list[str]] = {}
    large_attrs: dict[type, set[str]] = {}
    containers: dict[type, set[str]] = {}
    bases = VllmBases.of_this_vllm()
    kinds: dict[int, str | None] = {}  # id(module) -> its kind: each module classified once

    def kind_of(module: nn.Module) -> str | None:
        if id(module) not in kinds:
            kinds[id(module)] = classify(module, bases)
        return kinds[id(module)]

    for name, module in model.named_modules():
        kind = kind_of(module)
        if kind == "attention":
            attention.append(name)
        elif kind is not None:
            rows, cols = _sizes(module, kind)
            projections.append(Projection(name, qualname(module), kind, rows, cols, _weight_dtype(module)))
        if getattr(module, "do_not_compile", None) is not None:  # set by @support_torch_compile's __init__
            compiled.append(name)
        cls = type(module)
        if kind is None and not _is_library(cls) and not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            owner = _defining_class(cls)
            if not _is_library(owner):
                classes.setdefault(owner, []).append(name)
                containers.setdefault(owner, set()).update(_containers(module))
                for child_name, child in module._modules.items():
                    ckind = kind_of(child) if child is not None else None
                    if ckind and ckind.endswith("-linear"):
                        rows, cols = _sizes(child, ckind)
                        if (rows or 0) >= big and (cols or 0) >= big:
                            large_attrs.setdefault(owner, set()).add(child_name)
    encoders = encoder_modules(model)

    def inside(path: str) -> bool:
        return any(path == p or path.startswith(p + ".") for p in encoders)

    model_classes: list[ModelClass] = []
    findings: list[SourceFinding] = []
    for owner, names in list(classes.items())[:MAX_CLASSES]:
        file: str | None = None
        error: str | None = None
        try:
            file = inspect.getsourcefile(owner)
            mod = sys.modules.get(owner.__module__)
            text = inspect.getsource(mod) if mod is not None else None
        except (OSError, TypeError) as exc:
            text, error = None, f"{type(exc).__name__}: {exc}"
        if text is not None:
            found = scan_class(
                text,
                owner.__name__,
                filename=file or "",
                containers=containers.get(owner, set()),
                projections=large_attrs.get(owner, set()),
            )
            findings.extend(replace(f, cls=qualname(owner)) for f in found)  # the class's full name
        in_encoder = bool(encoders) and all(inside(n) for n in names)
        model_classes.append(ModelClass(qualname(owner), file, len(names), names[0], error, in_encoder))
    return PerfAnatomy(
        root_class=qualname(model),
        dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
        hidden_size=hidden,
        vocab_size=_int(getattr(hf_config, "vocab_size", None)),
        num_hidden_layers=_int(getattr(hf_config, "num_hidden_layers", None)),
        source=source,
        projections=tuple(projections),
        attention_layers=tuple(attention),
        compiled_modules=tuple(compiled),
        model_classes=tuple(model_classes),
        source_findings=tuple(findings),
        encoder_modules=encoders,
        encoder_attention=encoder_attention_layer() if encoders else None,
    )
