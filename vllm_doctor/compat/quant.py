"""Worker-side: which modules of the loaded model run a quantization method, and with what weights.

Runs inside a vLLM worker (``doctor_quant``) and builds :class:`~vllm_doctor.facts.quant.QuantFacts`.
vLLM gives every layer that can be quantized (its ``LinearBase`` layers, the LM head, embeddings,
fused experts) a ``quant_method``: the config's method for the layers it quantizes,
``UnquantizedLinearMethod`` (``UnquantizedEmbeddingMethod``, ...) for the others. compressed-tensors
also sets the layer's ``scheme`` (``CompressedTensorsW8A8Int8``...). After loading, vLLM's CPU
kernels may take the weight out of the module (oneDNN keeps it in its own handle and sets the
parameter to None): its bytes are then estimated from the layer's shape and the scheme's bits.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from vllm_doctor.compat import roles
from vllm_doctor.compat import worker as wv
from vllm_doctor.facts.quant import QuantFacts, QuantLayer

MAX_LAYERS = 4096
# parameter names that hold a layer's weight (the rest are scales, zero points, biases)
_WEIGHT_NAMES = re.compile(r"^(?:.*_)?(?:weight|weight_packed|qweight)$")
# the weight's storage type by scheme family, where the kernel took the weight out of the module
_FAMILY_DTYPE = (("Fp8", "torch.float8_e4m3fn"), ("FP8", "torch.float8_e4m3fn"), ("Int8", "torch.int8"))


_QUANTIZABLE = ("lm_head", "linear", "embedding", "experts")


def _kind(module: nn.Module) -> str | None:
    """A layer vLLM gives a ``quant_method`` (its linear layers, LM head, embeddings, fused
    experts), by :func:`vllm_doctor.compat.roles.layer_class`; None for any other module."""
    layer = roles.layer_class(module)
    return layer.kind if layer is not None and layer.vllm and layer.kind in _QUANTIZABLE else None


def _bits(scheme: Any, method_name: str) -> float | None:
    """Bits per weight element the scheme stores (``num_bits`` of WNA16 schemes, the weight
    quantization args of others; 8 for the W8 and FP8 families)."""
    for holder in (scheme, getattr(scheme, "weight_quant", None)):
        bits = getattr(holder, "num_bits", None)
        if isinstance(bits, int) and not isinstance(bits, bool):
            return float(bits)
    label = type(scheme).__name__ if scheme is not None else method_name
    if re.search(r"W8|Fp8|FP8|Int8", label):
        return 8.0
    return None


def _layer(name: str, module: nn.Module, kind: str, packed: dict[str, list[str]]) -> QuantLayer:
    method = getattr(module, "quant_method", None)
    method_name = type(method).__name__ if method is not None else "None"
    scheme = getattr(module, "scheme", None)
    scheme_name = type(scheme).__name__ if scheme is not None else None
    weights = [(n, p) for n, p in module.named_parameters(recurse=False) if _WEIGHT_NAMES.match(n)]
    others = [p for n, p in module.named_parameters(recurse=False) if not _WEIGHT_NAMES.match(n)]
    held = [p for _, p in weights if p.numel() > 0]
    quantized = not method_name.startswith("Unquantized") and method is not None
    bits = _bits(scheme, method_name) if quantized else None
    dtype: str | None = str(held[0].dtype) if held else None
    nbytes: int | None = sum(p.numel() * p.element_size() for p in held) if held else None
    in_kernel = False
    if not held:  # the kernel took the weight (CPU oneDNN): estimate it from the layer's shape
        n_in = getattr(module, "input_size_per_partition", None)
        n_out = getattr(module, "output_size_per_partition", None)
        params_dtype = getattr(module, "params_dtype", None)
        if bits is None and isinstance(params_dtype, torch.dtype) and not quantized:
            bits = 8.0 * torch.empty(0, dtype=params_dtype).element_size()
            dtype = str(params_dtype)
        if isinstance(n_in, int) and isinstance(n_out, int) and bits is not None:
            nbytes, in_kernel = int(n_in * n_out * bits / 8), True
            if dtype is None:
                dtype = next((d for family, d in _FAMILY_DTYPE if family in (scheme_name or method_name)), None)
                dtype = dtype or f"int{bits:g}"
    elif quantized and bits is None and held:
        bits = 8.0 * held[0].element_size()
    leaf = name.rpartition(".")[2]
    return QuantLayer(
        name=name,
        module_class=type(module).__name__,
        kind=kind,
        method=method_name,
        scheme=scheme_name,
        quantized=quantized,
        weight_dtype=dtype,
        weight_bits=bits,
        weight_bytes=nbytes,
        weight_in_kernel=in_kernel,
        other_bytes=sum(p.numel() * p.element_size() for p in others if p.device.type != "meta"),
        shards=list(packed.get(leaf, [])),
    )


def _ignore_list(config: Any) -> list[str]:
    """The modules the quantization config leaves unquantized, under whichever name it keeps them."""
    for attr in ("ignore", "ignored_layers", "modules_to_not_convert"):
        value = getattr(config, attr, None)
        if isinstance(value, (list, tuple)):
            return [str(v) for v in value]
    return []


def quantization_record(worker: Any) -> QuantFacts:
    model = wv.model(worker)
    config = wv.sub_config(worker, "quant_config")
    model_config = wv.sub_config(worker, "model_config")
    model_dtype = getattr(model_config, "dtype", None)
    method: str | None = None
    if config is not None:
        try:
            method = str(config.get_name())
        except Exception:  # an odd config: its class name says enough
            method = type(config).__name__
    layers: list[QuantLayer] = []
    if model is not None and config is not None:  # an unquantized model: nothing to list
        packed = getattr(model, "packed_modules_mapping", None)
        packed = {str(k): [str(x) for x in v] for k, v in packed.items()} if isinstance(packed, dict) else {}
        for name, module in model.named_modules():
            if len(layers) >= MAX_LAYERS:
                break
            kind = _kind(module)
            if kind is not None and getattr(module, "quant_method", None) is not None:
                layers.append(_layer(name, module, kind, packed))
    return QuantFacts(
        method=method,
        config_class=type(config).__name__ if config is not None else None,
        ignore=_ignore_list(config) if config is not None else [],
        model_dtype=str(model_dtype) if model_dtype is not None else None,
        layers=layers,
    )


def quantization(worker: Any) -> dict[str, Any]:
    """``doctor_quant``: the quantization config and each module's quantization method."""
    return quantization_record(worker).to_json()
