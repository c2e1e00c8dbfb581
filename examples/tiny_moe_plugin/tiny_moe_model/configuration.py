"""The Hugging Face config class of the tiny MoE example model (Mixtral's fields)."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class TinyMoeConfig(PretrainedConfig):
    """A Mixtral-like config under a `model_type` that transformers does not know."""

    model_type = "tiny_doctor_moe"

    def __init__(
        self,
        vocab_size: int = 512,
        hidden_size: int = 128,
        intermediate_size: int = 128,  # of each expert
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int = 32,
        num_local_experts: int = 4,
        num_experts_per_tok: int = 2,
        rms_norm_eps: float = 1e-5,
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
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.num_local_experts = num_local_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
