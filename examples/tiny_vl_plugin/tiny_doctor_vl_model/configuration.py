"""The Hugging Face config class of the tiny vision-language example model."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class TinyDoctorVLConfig(PretrainedConfig):
    """LLaVA-like: a Llama-like decoder (the text fields, flat as in a text model's config), a
    tiny ViT (the `vision_*` fields) and the id of the `<image>` placeholder token.

    Flat rather than LLaVA's `text_config` / `vision_config` sub-configs: one class, and
    `get_text_config()` is the config itself."""

    model_type = "tiny_doctor_vl"

    def __init__(
        self,
        vocab_size: int = 512,
        hidden_size: int = 128,
        intermediate_size: int = 256,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int = 32,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 2048,
        tie_word_embeddings: bool = False,
        image_token_index: int = 3,
        vision_image_size: int = 32,
        vision_patch_size: int = 8,
        vision_hidden_size: int = 64,
        vision_intermediate_size: int = 128,
        vision_num_hidden_layers: int = 1,
        vision_num_attention_heads: int = 2,
        vision_layer_norm_eps: float = 1e-5,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.image_token_index = image_token_index
        self.vision_image_size = vision_image_size
        self.vision_patch_size = vision_patch_size
        self.vision_hidden_size = vision_hidden_size
        self.vision_intermediate_size = vision_intermediate_size
        self.vision_num_hidden_layers = vision_num_hidden_layers
        self.vision_num_attention_heads = vision_num_attention_heads
        self.vision_layer_norm_eps = vision_layer_norm_eps
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
