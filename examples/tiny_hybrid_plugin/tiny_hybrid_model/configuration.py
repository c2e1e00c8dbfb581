"""The Hugging Face config class of the tiny hybrid example model (Nemotron-H's fields)."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class TinyHybridConfig(PretrainedConfig):
    """A Nemotron-H-like config under a `model_type` that transformers does not know.

    ``hybrid_override_pattern`` says what each layer is: ``M`` a Mamba 2 mixer, ``*`` attention,
    ``-`` an MLP (one character a layer, ``num_hidden_layers`` of them)."""

    model_type = "tiny_doctor_hybrid"

    def __init__(
        self,
        vocab_size: int = 512,
        hidden_size: int = 128,
        hybrid_override_pattern: str = "M*M-",
        num_hidden_layers: int | None = None,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int = 32,
        intermediate_size: int = 256,
        mamba_num_heads: int = 8,
        mamba_head_dim: int = 32,
        ssm_state_size: int = 16,
        n_groups: int = 1,
        conv_kernel: int = 4,
        expand: int = 2,
        chunk_size: int = 64,
        layer_norm_epsilon: float = 1e-5,
        max_position_embeddings: int = 2048,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.hybrid_override_pattern = hybrid_override_pattern
        self.num_hidden_layers = num_hidden_layers if num_hidden_layers is not None else len(hybrid_override_pattern)
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.intermediate_size = intermediate_size
        self.mamba_num_heads = mamba_num_heads
        self.mamba_head_dim = mamba_head_dim
        self.ssm_state_size = ssm_state_size
        self.n_groups = n_groups
        self.conv_kernel = conv_kernel
        self.expand = expand
        self.chunk_size = chunk_size
        self.layer_norm_epsilon = layer_norm_epsilon
        self.max_position_embeddings = max_position_embeddings
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
