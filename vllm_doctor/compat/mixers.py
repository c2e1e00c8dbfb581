"""Which layers of a vLLM model mix tokens, and what kind each is, asked of vLLM: the one answer
the doctor's KV facts, profiler, roofline and checks share (the kinds: :mod:`vllm_doctor.facts.mixers`).

vLLM declares every layer that holds per-request state (a KV cache, a Mamba / linear-attention
state) in the forward context (``static_forward_context``): each is an ``AttentionLayerBase``
whose ``get_kv_cache_spec(vllm_config)`` says what it caches; its class says the kind where the
spec cannot be asked for.

:func:`mixer_calls` says which calls of a layer vLLM's graph-splitting ops make at run time (the
only Python that runs between the pieces of a compiled forward): a standard attention layer's
backend implementation (``do_kv_cache_update``, ``forward``), an MLA layer's ``forward_impl``, a
Mamba 2 mixer's ``conv_ssm_forward``, ... found by what the layer's own classes define.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm_doctor.facts.mixers import FAMILY, MAMBA_TYPES, STATE_METHODS, kind_of_spec, mamba_type_name

__all__ = ["FAMILY", "MixerCall", "attention_reading", "layer_kind", "layer_spec", "mixer_calls"]

# the layer methods vLLM's graph-splitting ops call on the layer they look up in the forward
# context (mamba_mixer: forward_impl; mamba_mixer2: conv_ssm_forward; qwen_gdn_attention_core:
# _forward_core; linear_attention: _forward; short_conv: forward_cuda / forward_native;
# unified_mla_attention_with_output: forward_impl), wrapped where the layer's own class defines them
LAYER_CALLS = ("forward_impl", "conv_ssm_forward", "_forward_core", "_forward_core_rocm", "_forward")
SHORT_CONV_CALLS = ("forward_cuda", "forward_native")
IMPL_CALLS = ("do_kv_cache_update", "forward")


def layer_spec(layer: Any, vllm_config: Any) -> Any:
    """What the layer asks vLLM to cache (its own ``get_kv_cache_spec``), None where it cannot say."""
    get_spec = getattr(layer, "get_kv_cache_spec", None)
    if not callable(get_spec) or vllm_config is None:
        return None
    try:
        return get_spec(vllm_config)
    except Exception:
        return None


def layer_kind(layer: Any, spec: Any) -> str | None:
    """The doctor's kind of a forward-context layer: from its spec, else from its class (an MLA
    layer whose spec could not be asked for is still MLA)."""
    if spec is not None:
        kind = kind_of_spec(type(spec).__name__, mamba_type_name(getattr(spec, "mamba_type", None)))
        if kind is not None:
            return kind
    names = [c.__name__ for c in type(layer).__mro__]
    if any("MLA" in n for n in names):
        return "mla"
    if any(n == "MambaBase" for n in names):
        return MAMBA_TYPES.get(mamba_type_name(getattr(layer, "mamba_type", None)) or "", "state")
    if getattr(layer, "impl", None) is not None:
        return "attention"
    return None


@dataclass(frozen=True)
class MixerCall:
    """The object and methods a graph-splitting op calls for one forward-context layer."""

    name: str  # the layer's name in the forward context
    obj: Any  # the layer, or its backend implementation
    attrs: tuple[str, ...]  # in the order a forward calls them
    kind: str | None  # :func:`layer_kind` without a spec (the class's answer)
    cls: str  # the class name shown in the per-layer tables


def _own_methods(layer: Any, names: Iterable[str]) -> tuple[str, ...]:
    """The names among ``names`` that a class of the layer's own defines (a mixer class, not
    torch's ``nn.Module`` or vLLM's ``CustomOp`` bases that every layer shares)."""
    own = [
        c
        for c in type(layer).__mro__
        if c.__module__.split(".")[0] not in ("torch", "builtins", "abc")
        and c.__name__ not in ("CustomOp", "PluggableLayer", "AttentionLayerBase")
    ]
    return tuple(n for n in names if any(n in c.__dict__ for c in own))


def mixer_calls(layers: dict[str, Any]) -> list[MixerCall]:
    """For each layer of a ``static_forward_context`` / ``no_compile_layers`` dict that mixes tokens,
    the calls vLLM's ops make on it at run time. Objects without an instance ``__dict__`` cannot be
    wrapped and are left out, and so are vLLM's fused-MoE layers (in the context for their own op)."""
    from vllm_doctor.compat.common import is_fused_moe

    out: list[MixerCall] = []
    for name, layer in layers.items():
        if is_fused_moe(layer):
            continue
        kind = layer_kind(layer, None)
        impl = getattr(layer, "impl", None)
        own = _own_methods(layer, LAYER_CALLS)
        if kind == "short_conv":
            own = own or _own_methods(layer, SHORT_CONV_CALLS)
        if kind != "attention" and own and hasattr(layer, "__dict__"):
            out.append(MixerCall(str(name), layer, own, kind, type(layer).__name__))
            continue
        calls = tuple(a for a in IMPL_CALLS if callable(getattr(impl, a, None))) if impl is not None else ()
        if calls and hasattr(impl, "__dict__"):
            out.append(MixerCall(str(name), impl, calls, kind, type(impl).__name__))
    return out


def module_paths(model: Any) -> dict[int, str]:
    """Each module of the model (by id) -> its path, the first where it sits twice."""
    where: dict[int, str] = {}
    for name, module in model.named_modules():
        where.setdefault(id(module), name)
    return where


def mixer_paths(model: Any, layers: dict[str, Any]) -> dict[str, str]:
    """Where each token mixer of the forward context sits in the model (its module path, the
    first where it sits twice) -> its family (:data:`FAMILY`: attention, mla, state). The
    profiler times the topmost module of the decoder layer that holds it as that kind (eager)."""
    where = module_paths(model)
    out: dict[str, str] = {}
    for call in mixer_calls(layers):
        layer = layers.get(call.name)
        path = where.get(id(layer))
        if path:
            out[path] = FAMILY.get(call.kind or "attention", "attention")
    return out


_INTERFACE_MODULES = ("vllm.model_executor.models.interfaces", "vllm.model_executor.models.interfaces_base")


def built_mixers(model: Any, layers: dict[str, Any]) -> list[dict[str, Any]]:
    """The token mixers a built model registered in vLLM's forward context: the name it registered
    under (``prefix``), where it sits (``path``), its kind by class (no spec: the weights pass
    builds on the meta device, before any cache is sized) and its family."""
    from vllm_doctor.compat.common import is_fused_moe

    where = module_paths(model)
    out = []
    for prefix, layer in layers.items():
        if is_fused_moe(layer):
            continue
        kind = layer_kind(layer, None)
        # the sizes it caches by (an MLA layer: its latent width and rope dim)
        sizes = {a: v for a in MIXER_SIZES if isinstance(v := getattr(layer, a, None), int) and not isinstance(v, bool)}
        out.append(
            {
                "prefix": str(prefix),
                "path": where.get(id(layer)),
                "kind": kind,
                "family": FAMILY.get(kind or "", None),
                "class": type(layer).__name__,
                **sizes,
            }
        )
    return out


MIXER_SIZES = ("num_kv_heads", "head_size", "kv_lora_rank", "qk_rope_head_dim")


def attention_reading(model_config: Any) -> dict[str, Any]:
    """How vLLM reads config.json's attention: whether it takes the model for an MLA model
    (``ModelConfig.use_mla``: vLLM 0.32 decides it from ``model_type``, a fixed list of types or a
    convertor registered for the type) and the head size it sizes attention metadata by
    (``get_head_size``: the latent's ``kv_lora_rank + qk_rope_head_dim`` for MLA). An answer vLLM
    cannot give is left out."""
    out: dict[str, Any] = {}
    hf = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    if isinstance(model_type := getattr(hf, "model_type", None), str):
        out["model_type"] = model_type
    try:
        use_mla = model_config.use_mla
        if isinstance(use_mla, bool):
            out["use_mla"] = use_mla
    except Exception:
        pass
    try:
        head_size = model_config.get_head_size()
        if isinstance(head_size, int) and not isinstance(head_size, bool):
            out["head_size"] = head_size
    except Exception:
        pass
    return out


def state_interfaces(model_cls: type) -> dict[str, Any]:
    """What the class declares of vLLM's state interfaces: ``IsHybrid``, ``HasInnerState``,
    ``IsAttentionFree`` (their class flags), and which of :data:`STATE_METHODS` a class of the
    model's own defines (vLLM's interface classes give a default that returns nothing)."""
    own = [c for c in model_cls.__mro__ if c.__module__ not in _INTERFACE_MODULES and c is not object]
    return {
        "is_hybrid": getattr(model_cls, "is_hybrid", False) is True,
        "has_inner_state": getattr(model_cls, "has_inner_state", False) is True,
        "is_attention_free": getattr(model_cls, "is_attention_free", False) is True,
        "methods": {m: any(m in c.__dict__ for c in own) for m in STATE_METHODS},
    }
