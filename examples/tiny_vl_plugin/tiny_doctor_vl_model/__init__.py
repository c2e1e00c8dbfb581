"""vLLM plugin entry point of the tiny vision-language example model.

vLLM calls `register()` in every process it starts, so it does only idempotent work. The
model is registered as a lazy `"module:Class"` string: vLLM inspects the class in a subprocess
and imports the module (with its multimodal processor, registered by a class decorator) only
where it needs it.
"""

from __future__ import annotations


def register() -> None:
    """Make the `tiny_doctor_vl` config and `TinyDoctorVLForConditionalGeneration` known."""
    from transformers import AutoConfig

    from .configuration import TinyDoctorVLConfig

    AutoConfig.register("tiny_doctor_vl", TinyDoctorVLConfig, exist_ok=True)

    from vllm import ModelRegistry

    ModelRegistry.register_model(
        "TinyDoctorVLForConditionalGeneration",
        "tiny_doctor_vl_model.model:TinyDoctorVLForConditionalGeneration",
    )
