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
from dataclasses import replace
from typing import Any

from torch import nn

from vllm_doctor.compat import roles
from vllm_doctor.compat.common import qualname
from vllm_doctor.compat.perf_source import scan_class
from vllm_doctor.facts.perf import ModelClass, PerfAnatomy, Projection, SourceFinding

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


def classify(module: nn.Module) -> str | None:
    """ "vllm-linear", "plain-linear", "vllm-embedding" (the LM head too), "plain-embedding",
    "attention" or None: :func:`vllm_doctor.compat.roles.layer_class` in the lint's words."""
    layer = roles.layer_class(module)
    if layer is None:
        return None
    if layer.kind in ("attention", "mla", "state"):  # a token mixer: holds a KV cache or a state
        return "attention"
    side = "vllm" if layer.vllm else "plain"
    if layer.kind == "linear":
        return f"{side}-linear"
    if layer.kind in ("embedding", "lm_head"):
        return f"{side}-embedding"
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
    """A multimodal model's encoder parts (towers, then connectors): :func:`vllm_doctor.compat.roles.model_parts`.
    Empty for a text model."""
    return roles.model_parts(model).encoder


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


def perf_anatomy(
    model: nn.Module, hf_config: Any, dtype: Any, source: str, mixers: dict[str, str] | None = None
) -> PerfAnatomy:
    """Walk ``model`` once: projections (each with the kind its time counts under,
    :func:`vllm_doctor.compat.roles.kinds_by_path`; ``mixers``: where the token mixers sit and
    their families), embeddings, attention layers, compiled classes, and the forward path of
    each model class."""
    hidden = _int(getattr(hf_config, "hidden_size", None))
    big = max(1, (hidden or 0) // 4)  # a projection of at least a quarter of the hidden size
    projections: list[Projection] = []
    attention: list[str] = []
    compiled: list[str] = []
    classes: dict[type, list[str]] = {}
    large_attrs: dict[type, set[str]] = {}
    containers: dict[type, set[str]] = {}
    kinds: dict[int, str | None] = {}  # id(module) -> its kind: each module classified once
    roles_of = roles.kinds_by_path(model, mixers)

    def kind_of(module: nn.Module) -> str | None:
        if id(module) not in kinds:
            kinds[id(module)] = classify(module)
        return kinds[id(module)]

    for name, module in model.named_modules():
        kind = kind_of(module)
        if kind == "attention":
            attention.append(name)
        elif kind is not None:
            rows, cols = _sizes(module, kind)
            projections.append(
                Projection(name, qualname(module), kind, rows, cols, _weight_dtype(module), roles_of.get(name))
            )
        if getattr(module, "do_not_compile", None) is not None:  # set by @support_torch_compile's __init__
            compiled.append(name)
        cls = type(module)
        if kind is None and not roles.is_library(cls) and not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            owner = _defining_class(cls)
            if not roles.is_library(owner):
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
