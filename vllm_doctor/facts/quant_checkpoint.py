"""Is this checkpoint quantized, and how: config.json's ``quantization_config`` against the
tensors themselves (headers only: names and dtypes). Shared by the quantization checks
(checks/quantization.py, VD314-VD316); plain data, no vLLM.

A tensor's format, from its name and dtype:

- ``gptq-awq``: ``qweight`` (int32, eight 4-bit values packed per element; with ``qzeros``,
  ``scales``, ``g_idx``): GPTQ's and AWQ's names;
- ``int4-packed``: compressed-tensors' ``weight_packed`` (pack-quantized);
- ``int8``: an int8 ``weight``;
- ``fp8``: a float8 ``weight``.

What the config says it holds, from ``quant_method`` (and compressed-tensors' config groups).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts.user_regex import bounded_match, unbounded_patterns

FP8_DTYPES = frozenset({"F8_E4M3", "F8_E5M2"})
INT_DTYPES = frozenset({"I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64"})
GPTQ_AWQ_LEAVES = ("qweight", "qzeros", "scales", "g_idx")
# a quantized layer's weight under each method's name (its other parameters are scales, zero points, ...)
WEIGHT_LEAVES = frozenset({"weight", "weight_packed", "qweight"})
FORMAT_WORDS = {
    "gptq-awq": "GPTQ/AWQ-packed 4-bit weights (qweight, qzeros, scales, g_idx)",
    "int4-packed": "packed int4 weights (weight_packed)",
    "int8": "int8 weights",
    "fp8": "float8 weights",
}
GPTQ_AWQ_METHODS = frozenset(
    {"gptq", "awq", "auto_gptq", "auto_awq", "gptq_marlin", "awq_marlin", "moe_wna16", "gptq_bitblas", "awq_triton"}
)


def tensor_format(name: str, dtype: str) -> str | None:
    """The quantized format a checkpoint tensor's name and dtype show (None: not a quantized weight)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "qweight":
        return "gptq-awq"
    if leaf == "weight_packed":
        return "int4-packed"
    if leaf == "weight" and dtype == "I8":
        return "int8"
    if leaf == "weight" and dtype in FP8_DTYPES:
        return "fp8"
    return None


def is_scale(name: str) -> bool:
    """A quantization scale's name (``weight_scale``, ``input_scale``, ``weight_scale_inv``, GPTQ's ``scales``)."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf == "scales" or leaf.endswith("_scale") or "_scale_" in leaf


def expected_formats(qconfig: dict[str, Any]) -> set[str] | None:
    """The weight formats a quantization config says the checkpoint holds (None: not known here)."""
    method = str(qconfig.get("quant_method", "")).lower()
    if method in GPTQ_AWQ_METHODS:
        return {"gptq-awq"}
    if method in ("fp8", "fbgemm_fp8"):
        return {"fp8"}
    if method != "compressed-tensors":
        return None
    groups = qconfig.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    out: set[str] = set()
    for group in groups.values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            return None
        kind, bits = weights.get("type"), weights.get("num_bits")
        if kind == "float" and bits == 8:
            out.add("fp8")
        elif kind == "int" and bits == 8:
            out.add("int8")
        elif kind == "int" and bits == 4:
            out.add("int4-packed")
        else:
            return None
    return out


@dataclass(frozen=True)
class CheckpointQuant:
    """What config.json and the tensors say about the checkpoint's quantization."""

    method: str | None  # config.json's quantization_config.quant_method (None: no config)
    expected: set[str] | None  # the weight formats the config says it holds (None: unknown)
    formats: dict[str, list[str]] = field(default_factory=dict)  # format -> the tensors in it
    scales: list[str] = field(default_factory=list)
    # the config's list of layers left unquantized: compressed-tensors' ``ignore``, fp8's
    # ``ignored_layers``, the transformers-style ``modules_to_not_convert``
    ignore: list[str] = field(default_factory=list)
    # the config's regular expressions vllm-doctor does not run (user_regex.unbounded_patterns)
    unbounded: list[dict[str, str]] = field(default_factory=list)

    @property
    def quantized(self) -> bool:
        """Quantized by config AND by its tensors (quantized weights or scales)."""
        return self.method is not None and bool(self.formats or self.scales)

    def ignored(self, module: str) -> str | None:
        """The ignore-list entry that names ``module`` (exact, or ``re:`` as compressed-tensors; a
        pattern over vllm-doctor's bound is not run: :mod:`vllm_doctor.facts.user_regex`)."""
        for entry in self.ignore:
            if entry.startswith("re:"):
                if bounded_match(entry[3:], module):
                    return entry
            elif entry == module or module.endswith("." + entry) or entry.endswith("." + module):
                return entry
        return None


IGNORE_KEYS = ("ignore", "ignored_layers", "modules_to_not_convert")


def quantization_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's ``quantization_config`` (or its text_config's / llm_config's /
    language_config's), when it is an object."""
    qconfig = config.get("quantization_config")
    if isinstance(qconfig, dict):
        return qconfig
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and isinstance(sub.get("quantization_config"), dict):
            return sub["quantization_config"]
    return None


def ignore_list(qconfig: dict[str, Any]) -> list[str]:
    """Every entry of the config's lists of layers left unquantized, under each method's key
    (vLLM's fp8 reads ``ignored_layers``, compressed-tensors ``ignore``)."""
    out: list[str] = []
    for key in IGNORE_KEYS:
        value = qconfig.get(key)
        if isinstance(value, list):
            out.extend(str(i) for i in value if i is not None)
    return out


def checkpoint_quant(config: dict[str, Any], tensors: Iterable[tuple[str, str]]) -> CheckpointQuant:
    """config.json and the checkpoint's (name, dtype) pairs -> :class:`CheckpointQuant`."""
    qconfig = quantization_config(config)
    formats: dict[str, list[str]] = {}
    scales: list[str] = []
    for name, dtype in tensors:
        fmt = tensor_format(name, dtype)
        if fmt is not None:
            formats.setdefault(fmt, []).append(name)
        elif is_scale(name):
            scales.append(name)
    if not isinstance(qconfig, dict):
        return CheckpointQuant(None, None, formats, scales)
    method = qconfig.get("quant_method")
    return CheckpointQuant(
        str(method) if method else None,
        expected_formats(qconfig),
        formats,
        scales,
        ignore_list(qconfig),
        unbounded_patterns(qconfig),
    )
