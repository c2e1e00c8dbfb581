"""vLLM plugin entry point of the tiny MLA example model (idempotent, run in every process)."""

from __future__ import annotations


def register() -> None:
    """Make the `tiny_doctor_mla` config and `TinyMlaForCausalLM` known to transformers and vLLM,
    and tell vLLM that this model_type uses MLA (:mod:`.arch`)."""
    from transformers import AutoConfig

    from .configuration import TinyMlaConfig

    AutoConfig.register("tiny_doctor_mla", TinyMlaConfig, exist_ok=True)

    from vllm import ModelRegistry

    from .arch import register_mla_model_type

    register_mla_model_type("tiny_doctor_mla")
    ModelRegistry.register_model("TinyMlaForCausalLM", "tiny_mla_model.model:TinyMlaForCausalLM")
