"""What the weights pass reads of a quantized model's built layers: each layer's quantization
method as vLLM picked it, and the parameters vLLM fills itself when the checkpoint has none.

Runs in the weights pass's child (compat/weights.py) on the model built on the meta device;
returns plain data only. vLLM is asked, not second-guessed:

- a layer's ``quant_method`` is what ``quant_config.get_quant_method(layer, prefix)`` returned
  when the layer was built: vLLM's ``UnquantizedLinearMethod`` (or another ``Unquantized*``
  method) for a layer built without ``quant_config`` or one the config's ``ignore`` list skips,
  the method's own class otherwise; a plain ``torch.nn.Linear`` has none;
- the attention layer's ``q_scale``/``k_scale``/``v_scale`` (and ``prob_scale``) belong to a
  ``BaseKVCacheMethod``: vLLM creates them at -1 and its ``process_weights_after_loading``
  puts 1.0 where the checkpoint had none (KV-cache and query scales of checkpoints that carry
  no calibrated ones);
- GPTQ quantizes a layer only when its prefix contains one of ``modules_in_block_to_quantize``
  (``is_layer_gptq_quantized``; vLLM's ``maybe_update_config`` fills it from the checkpoint's
  names): read as ``by_name``;
- checkpoint tensors the method's own checkpoint mapper drops (``get_checkpoint_weight_mapper``,
  vLLM >= 0.32: GPTQ's ``g_idx``, activation-order metadata its kernels do not use): vLLM's
  ``AutoWeightsLoader`` never hands them to a layer, deliberately.
"""

from __future__ import annotations

from typing import Any


def _class(name: str, module_path: str) -> type | None:
    try:
        module = __import__(module_path, fromlist=[name])
    except Exception:
        return None
    found = getattr(module, name, None)
    return found if isinstance(found, type) else None


def _is_unquantized(method: Any, unquantized: tuple[type, ...]) -> bool:
    """vLLM's methods for a layer it does not quantize (linear, embedding, fused MoE)."""
    if unquantized and isinstance(method, unquantized):
        return True
    return any(c.__name__.startswith("Unquantized") for c in type(method).__mro__)


def dropped_by_method(quant_config: Any, names: list[str]) -> list[str]:
    """The checkpoint names the quantization method's checkpoint mapper maps to None."""
    get = getattr(quant_config, "get_checkpoint_weight_mapper", None)
    if not callable(get):
        return []
    try:
        mapper = get()
    except Exception:
        return []
    rename = getattr(mapper, "map_name", None) or getattr(mapper, "_map_name", None)
    if not callable(rename):
        return []
    out = []
    for name in names:
        try:
            if rename(name) is None:
                out.append(name)
        except Exception:
            continue
    return out


def quant_facts(
    model: Any, model_config: Any, quant_config: Any = None, names: list[str] | None = None
) -> dict[str, Any]:
    """``method``: vLLM's quantization method name for the model (None: unquantized);
    ``modules``: per module that owns parameters and is a vLLM quantizable layer or a plain
    ``nn.Linear``, its quant method's class, the compressed-tensors scheme, whether vLLM
    quantizes it and its own parameters; ``defaulted``: parameter -> why vLLM fills it itself;
    ``dropped``: the checkpoint ``names`` the method's checkpoint mapper discards."""
    import torch

    method = getattr(model_config, "quantization", None)
    kv_method = _class("BaseKVCacheMethod", "vllm.model_executor.layers.quantization.kv_cache")
    unquantized = tuple(
        c
        for c in (
            _class("UnquantizedLinearMethod", "vllm.model_executor.layers.linear"),
            _class("UnquantizedEmbeddingMethod", "vllm.model_executor.layers.vocab_parallel_embedding"),
        )
        if c is not None
    )
    modules: dict[str, dict[str, Any]] = {}
    defaulted: dict[str, str] = {}
    for mname, module in model.named_modules():
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if not own:
            continue
        qm = getattr(module, "quant_method", None)
        plain_linear = isinstance(module, torch.nn.Linear)
        if qm is None and not plain_linear:
            continue
        kv = kv_method is not None and qm is not None and isinstance(qm, kv_method)
        if kv:
            for pname in own:
                defaulted[f"{mname}.{pname}" if mname else pname] = (
                    f"{type(qm).__name__} (a KV-cache quantization method): vLLM uses 1.0 when the checkpoint "
                    "has no calibrated scale"
                )
        scheme = getattr(module, "scheme", None)
        modules[mname] = {
            "class": type(module).__name__,
            "quant_method": type(qm).__name__ if qm is not None else None,
            "scheme": type(scheme).__name__ if scheme is not None else None,
            "plain_linear": plain_linear and qm is None,
            "kv_cache": kv,
            "quantized": qm is not None and not kv and not _is_unquantized(qm, unquantized),
            "params": own,
        }
    return {
        "method": method if isinstance(method, str) else None,
        "modules": modules,
        "defaulted": defaulted,
        "dropped": dropped_by_method(quant_config, names or []) if quant_config is not None else [],
        "by_name": quantized_by_name(quant_config),
    }


def quantized_by_name(quant_config: Any) -> list[str] | None:
    """The module names a method quantizes by name (GPTQ's ``modules_in_block_to_quantize``,
    which vLLM fills from the checkpoint's non-float tensors when the config has none), or None
    when the method does not decide by name."""
    names = getattr(quant_config, "modules_in_block_to_quantize", None)
    if not isinstance(names, list | tuple):
        return None
    flat: list[str] = []
    for item in names:
        if isinstance(item, list | tuple):
            flat.extend(str(n) for n in item)
        else:
            flat.append(str(item))
    return flat
