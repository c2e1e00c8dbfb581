"""Telling vLLM that a model_type of our own uses MLA.

vLLM decides whether a model uses multi-head latent attention from config.json's ``model_type``
alone: ``ModelConfig.use_mla`` is true only for the model types its convertor lists (DeepSeek-V2/V3,
Kimi, GLM-4 MoE Lite, ...; vLLM 0.32: ``ModelArchConfigConvertorBase.is_deepseek_mla``). For any
other model type vLLM sizes the attention metadata from ``hidden_size / num_attention_heads`` (32
here) instead of the latent's ``kv_lora_rank + qk_rope_head_dim`` (576), and the first request fails
with ``ValueError: Head dimension 32 is not supported by MLA.``; nor does it set the MLA-only
options (on CPU: block size 16, no chunked prefill). vLLM looks a model type's convertor up in
``MODEL_ARCH_CONFIG_CONVERTORS``: a plugin registers one whose ``is_deepseek_mla`` says yes.
"""

from __future__ import annotations

from vllm.transformers_utils.model_arch_config_convertor import (
    MODEL_ARCH_CONFIG_CONVERTORS,
    ModelArchConfigConvertorBase,
)


class MlaArchConfigConvertor(ModelArchConfigConvertorBase):
    """vLLM's default reading of a config, except that a config with ``kv_lora_rank`` is MLA (its
    head size then the latent's ``kv_lora_rank + qk_rope_head_dim``, one KV head)."""

    def is_deepseek_mla(self) -> bool:
        return getattr(self.hf_text_config, "kv_lora_rank", None) is not None


def register_mla_model_type(model_type: str) -> None:
    """Make vLLM read ``model_type`` as an MLA model (idempotent)."""
    MODEL_ARCH_CONFIG_CONVERTORS.setdefault(model_type, MlaArchConfigConvertor)
