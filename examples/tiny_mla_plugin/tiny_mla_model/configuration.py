"""The Hugging Face config class of the tiny MLA example model (DeepSeek-V2's attention fields)."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class TinyMlaConfig(PretrainedConfig):
    """A DeepSeek-V2-like config (dense MLP, no q LoRA) under a `model_type` that transformers
    does not know.

    The latent each layer caches a token is ``kv_lora_rank`` values of the compressed KV and
    ``qk_rope_head_dim`` of the rotary key: 512 + 64, DeepSeek-V2's, the one size vLLM's CPU MLA
    backend runs."""

    model_type = "tiny_doctor_mla"

    def __init__(
        self,
        vocab_size: int = 512,
        hidden_size: int = 128,
        intermediate_size: int = 256,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        q_lora_rank: int | None = None,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 32,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 32,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 2048,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
