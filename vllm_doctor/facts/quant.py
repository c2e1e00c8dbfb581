"""Which layers of a worker's model run quantized (``doctor_quant``): the record both ends of the wire share.

Built inside the worker by :func:`vllm_doctor.compat.quant.quantization` (which sends
:meth:`QuantFacts.to_json`), read on the doctor's side with :meth:`QuantFacts.of`
(lenient: :mod:`vllm_doctor.facts.wire`). The profile's quantization summary, the roofline's
weight bytes and VD407 read it. Stdlib only: the worker imports this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import wire

WIRE_VERSION = 1


@dataclass(frozen=True)
class QuantLayer(wire.Record):
    """One module with a vLLM quantization method (a linear layer, the LM head, an embedding,
    fused experts): which method it runs, and what its weight is."""

    name: str = ""  # module path, "model.layers.0.self_attn.qkv_proj"
    module_class: str | None = None  # "QKVParallelLinear"
    kind: str | None = None  # "linear" | "lm_head" | "embedding" | "experts"
    method: str | None = None  # the quant method's class: "CompressedTensorsLinearMethod", "UnquantizedLinearMethod"
    scheme: str | None = None  # compressed-tensors: the layer's scheme class ("CompressedTensorsW8A8Int8")
    quantized: bool = False  # the method is not one of vLLM's Unquantized*Method
    weight_dtype: str | None = None  # "torch.int8"; where the kernel holds the weight: what the scheme stores
    weight_bits: float | None = None  # bits per weight element (int4 packed: 4)
    weight_bytes: int | None = None  # the weight's bytes (kernel-held: in x out x bits / 8)
    weight_in_kernel: bool = False  # the CPU kernel took the weight (oneDNN): its bytes are the estimate above
    other_bytes: int = 0  # the module's other parameters: scales, zero points, bias
    shards: list[str] = field(default_factory=list)  # a fused layer's checkpoint names (packed_modules_mapping)

    @property
    def storage(self) -> str | None:
        """What one weight element is: ``int8``, ``float8_e4m3fn``, ``int4 packed in int32``."""
        dtype = (self.weight_dtype or "").removeprefix("torch.")
        if not dtype:
            return None
        found = re.search(r"\d+", dtype)
        element_bits = int(found.group()) if found else None
        bits = self.weight_bits
        if bits is not None and element_bits is not None and bits < element_bits:
            return f"int{bits:g} packed in {dtype}"
        return dtype

    @property
    def method_text(self) -> str:
        """``compressed-tensors W8A8Int8`` style: the scheme where there is one, else the method."""
        if self.scheme:
            return self.scheme.removeprefix("CompressedTensors")
        return (self.method or "?").removesuffix("Method")


@dataclass(frozen=True)
class QuantFacts(wire.Record):
    """``doctor_quant``: the model's quantization config as vLLM built it, and every module
    with a quantization method."""

    method: str | None = None  # the config's name ("compressed-tensors", "fp8"); None: not quantized
    config_class: str | None = None  # "CompressedTensorsConfig"
    ignore: list[str] = field(default_factory=list)  # the config's list of modules left unquantized
    model_dtype: str | None = None
    layers: list[QuantLayer] = field(default_factory=list)
    wire_version: int = WIRE_VERSION

    def to_json(self) -> dict[str, Any]:
        return wire.versioned(self, WIRE_VERSION)

    @property
    def linear(self) -> list[QuantLayer]:
        return [x for x in self.layers if x.kind == "linear"]

    def ignored(self, layer: QuantLayer) -> bool:
        """The config's ignore list names the layer (its path, its leaf, a ``re:`` pattern, or every
        checkpoint shard of a fused layer): the layer is meant to stay unquantized."""
        names = [layer.name]
        if layer.shards:
            parent = layer.name.rpartition(".")[0]
            names = [f"{parent}.{s}" if parent else s for s in layer.shards]
        return all(any(_matches(entry, n) for entry in self.ignore) for n in names)

    def kernel_held_bytes(self) -> int:
        """Bytes of quantized weights that vLLM's CPU kernels took out of their modules (oneDNN keeps
        them in its own handle): no parameter of the model counts them."""
        return sum(x.weight_bytes or 0 for x in self.layers if x.quantized and x.weight_in_kernel)

    def unexpected_unquantized(self) -> list[QuantLayer]:
        """Linear layers that run unquantized in a quantized model, and that the config does not ignore."""
        if not self.method or not any(x.quantized for x in self.layers):
            return []
        return [x for x in self.linear if not x.quantized and not self.ignored(x)]


def _matches(entry: str, name: str) -> bool:
    """compressed-tensors' ignore matching: ``re:PATTERN`` (a regex on the module path), else the
    path itself or its tail (``lm_head`` names ``lm_head`` and ``model.lm_head``)."""
    if entry.startswith("re:"):  # run only within vllm-doctor's bound
        from vllm_doctor.facts.user_regex import bounded_match  # here: a worker importing this record does not need it

        return bool(bounded_match(entry[3:], name))
    return name == entry or name.endswith("." + entry)
