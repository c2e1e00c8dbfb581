"""The VD3xx checks' shared gates and helpers: what the checkpoint and the weights pass gave.

The fast pass reads config.json and the safetensors headers (no tensor data) into
``facts.checkpoint``; the weights pass builds the model on the meta device in a fresh process and
drives its real ``load_weights`` with meta tensors of the checkpoint's names, shapes and dtypes
(compat/weights.py) into ``facts.weight_load``. The checks, by topic: :mod:`.weight_loading`
(VD301-VD304), :mod:`.parallel_sizes` (VD305), :mod:`.checkpoint_files` (VD306-VD308),
:mod:`.config_sizes` (VD309), :mod:`.model_build` (VD310).
"""

from __future__ import annotations

from typing import Any

from vllm_doctor.checks.base import Emit, gate, known
from vllm_doctor.facts.static import BuiltModel, Facts
from vllm_doctor.model import Finding

# the language model's part of a multimodal config.json
SUB_CONFIGS = ("text_config", "llm_config", "language_config")


@gate("checkpoint-files")
def _checkpoint_read(facts: Facts, emit: Emit) -> Finding | None:
    """The fast pass read a safetensors checkpoint (its files may still be broken)."""
    ck = facts.checkpoint
    if ck is None:
        return emit.skip("the checkpoint was not read")
    if ck.format == "none":
        return emit.not_applicable("no checkpoint files (*.safetensors, *.bin, *.pt) in the model directory")
    if ck.format != "safetensors":
        return emit.skip(f"the checkpoint is {ck.format} (pickle); vllm-doctor reads safetensors headers only")
    return None


@gate("checkpoint")
def _checkpoint_tensors(facts: Facts, emit: Emit) -> Finding | None:
    """As ``checkpoint-files``, and at least one file could be read."""
    instead = _checkpoint_read(facts, emit)
    if instead is None and not known(facts.checkpoint).tensors:
        return emit.skip("no checkpoint file could be read (see VD306/VD308)")
    return instead


@gate("weights-pass", after_import=True)
def _weights_pass_over(facts: Facts, emit: Emit) -> None:
    """Nothing to skip for: the check uses the weights pass's result where there is one."""
    return None


@gate("weights-load", after_import=True)
def _weights_loaded(facts: Facts, emit: Emit) -> Finding | None:
    """The weights pass built the model on the meta device and drove its load_weights."""
    if facts.usable_weights() is None:
        reason = facts.weight_load_error or "the weights pass did not run"
        return emit.skip(f"the model could not be built and loaded on the meta device: {reason}")
    return None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: config.json itself, or its `text_config` / `llm_config`."""
    for key in SUB_CONFIGS:
        sub = config.get(key)
        if isinstance(sub, dict) and "num_attention_heads" in sub:
            return sub
    return config


def built(facts: Facts) -> BuiltModel | None:
    """The model the weights pass built (its record), even when load_weights then failed; None
    without a weights pass or where vLLM's config could not be built."""
    reply = facts.weights_reply()
    return reply.model if reply is not None else None
