"""vLLM plugin entry point of the tiny MoE example model (idempotent, run in every process)."""

from __future__ import annotations


def register() -> None:
    """Make the `tiny_doctor_moe` config and `TinyMoeForCausalLM` known to transformers and vLLM."""
    from transformers import AutoConfig

    from .configuration import TinyMoeConfig

    AutoConfig.register("tiny_doctor_moe", TinyMoeConfig, exist_ok=True)

    from vllm import ModelRegistry

    ModelRegistry.register_model("TinyMoeForCausalLM", "tiny_moe_model.model:TinyMoeForCausalLM")
