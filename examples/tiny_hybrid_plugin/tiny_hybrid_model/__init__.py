"""vLLM plugin entry point of the tiny hybrid example model (idempotent, run in every process)."""

from __future__ import annotations


def register() -> None:
    """Make the `tiny_doctor_hybrid` config and `TinyHybridForCausalLM` known to transformers and vLLM."""
    from transformers import AutoConfig

    from .configuration import TinyHybridConfig

    AutoConfig.register("tiny_doctor_hybrid", TinyHybridConfig, exist_ok=True)

    from vllm import ModelRegistry

    ModelRegistry.register_model("TinyHybridForCausalLM", "tiny_hybrid_model.model:TinyHybridForCausalLM")
