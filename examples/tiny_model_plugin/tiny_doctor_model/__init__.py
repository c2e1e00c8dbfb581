"""vLLM plugin entry point of the tiny example model.

vLLM calls `register()` in every process it starts (and a process may call it twice), so
it does only idempotent work. The model is registered as a lazy `"module:Class"` string:
vLLM inspects the class in a subprocess and imports the module only where it builds it.
"""

from __future__ import annotations


def register() -> None:
    """Make the `tiny_doctor` config and `TinyDoctorForCausalLM` known to transformers and vLLM."""
    from transformers import AutoConfig

    from .configuration import TinyDoctorConfig

    AutoConfig.register("tiny_doctor", TinyDoctorConfig, exist_ok=True)

    from vllm import ModelRegistry

    # Registering the same name again replaces the entry with an identical one.
    ModelRegistry.register_model(
        "TinyDoctorForCausalLM",
        "tiny_doctor_model.model:TinyDoctorForCausalLM",
    )
