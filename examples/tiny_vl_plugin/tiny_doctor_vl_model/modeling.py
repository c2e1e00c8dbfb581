"""The Hugging Face (transformers) modelling class of the tiny vision-language example: the
*reference implementation* a parity check compares the vLLM class of `model.py` with.

    vllm_doctor.compare_with_reference(model_dir, images=1,
        hf_class="tiny_doctor_vl_model.modeling:TinyDoctorVLForConditionalGeneration")

Importable without vLLM (torch and transformers only). The tensor names are the checkpoint's
(examples/make_multimodal.py writes them): `vision_tower.*` and `multi_modal_projector.*` (the
same plain-PyTorch modules as `model.py`) and `language_model.*`, a transformers
`LlamaForCausalLM` (`language_model.model.layers.N...`, `language_model.lm_head`). The forward
computes what the vLLM class computes: the projected image features replace the token
embeddings at the `<image>` positions (`config.image_token_index`, one per patch), then the
decoder runs on those embeddings. It keeps no KV cache: every call is a full forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration import TinyDoctorVLConfig


class TinyVisionAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, hidden))


class TinyVisionEncoderLayer(nn.Module):
    def __init__(self, hidden: int, inter: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps)
        self.self_attn = TinyVisionAttention(hidden, num_heads)
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = nn.Sequential()
        self.mlp.fc1 = nn.Linear(hidden, inter)
        self.mlp.act = nn.GELU()
        self.mlp.fc2 = nn.Linear(inter, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class TinyVisionEmbeddings(nn.Module):
    def __init__(self, hidden: int, image_size: int, patch_size: int) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, hidden, kernel_size=patch_size, stride=patch_size, bias=False)
        self.position_embedding = nn.Embedding((image_size // patch_size) ** 2, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight.unsqueeze(0)


class TinyVisionTower(nn.Module):
    def __init__(self, config: TinyDoctorVLConfig) -> None:
        super().__init__()
        hidden = config.vision_hidden_size
        self.embeddings = TinyVisionEmbeddings(hidden, config.vision_image_size, config.vision_patch_size)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            TinyVisionEncoderLayer(
                hidden,
                config.vision_intermediate_size,
                config.vision_num_attention_heads,
                config.vision_layer_norm_eps,
            )
            for _ in range(config.vision_num_hidden_layers)
        )
        self.post_layernorm = nn.LayerNorm(hidden, eps=config.vision_layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class TinyMultiModalProjector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision_hidden, text_hidden)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(text_hidden, text_hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


def text_config(config: TinyDoctorVLConfig) -> LlamaConfig:
    """The decoder's fields as a LlamaConfig (the flat config holds them at the top level)."""
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )


class TinyDoctorVLForConditionalGeneration(PreTrainedModel):
    config_class = TinyDoctorVLConfig
    base_model_prefix = ""

    def __init__(self, config: TinyDoctorVLConfig) -> None:
        super().__init__(config)
        self.vision_tower = TinyVisionTower(config)
        self.multi_modal_projector = TinyMultiModalProjector(config.vision_hidden_size, config.hidden_size)
        self.language_model = LlamaForCausalLM(text_config(config))
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[num_images, 3, H, W] -> [num_images, num_patches, hidden]: tower, then projector."""
        dtype = self.vision_tower.embeddings.patch_embedding.weight.dtype
        return self.multi_modal_projector(self.vision_tower(pixel_values.to(dtype)))

    def forward(
        self,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutput:
        """``input_ids`` [batch, seq] with one `<image>` token per patch of each image (the
        expanded prompt, as vLLM's processor makes it); ``pixel_values`` [num_images, 3, H, W]
        in prompt order. Other keywords (``use_cache``, ...) are ignored: no KV cache."""
        embeds = self.language_model.get_input_embeddings()(input_ids)
        if pixel_values is not None and len(pixel_values):
            features = self.get_image_features(pixel_values)
            mask = input_ids == self.config.image_token_index
            flat = features.reshape(-1, features.shape[-1]).to(embeds.dtype)
            if int(mask.sum()) != flat.shape[0]:
                raise ValueError(
                    f"{int(mask.sum())} image tokens in input_ids, {flat.shape[0]} image features "
                    f"({len(pixel_values)} image(s))"
                )
            embeds = embeds.masked_scatter(mask.unsqueeze(-1).expand_as(embeds), flat)
        out = self.language_model(inputs_embeds=embeds, use_cache=False)
        return CausalLMOutput(logits=out.logits)
