"""TinyDoctorVLForConditionalGeneration: a tiny LLaVA-style vision-language model.

    image -> vision_tower (patch conv + ViT blocks) -> multi_modal_projector (MLP)
          -> one embedding per `<image>` placeholder token of the prompt
    text  -> language_model (a Llama-like decoder from vLLM's own layers) -> next token

Follows vLLM's `model_executor/models/llava.py` where it matters to vLLM:
`@MULTIMODAL_REGISTRY.register_processor(...)` ties the processor of `processing.py` to the
class; `SupportsMultiModal` makes vLLM treat it as multimodal; `embed_multimodal` turns the
processor's `pixel_values` into embeddings; `embed_input_ids` puts them on the placeholder
positions; `hf_to_vllm_mapper` maps the checkpoint layout of transformers >= 4.52 onto the
module names. The checkpoint holds `vision_tower.*`, `multi_modal_projector.*` and
`language_model.*` tensors (the older LLaVA layout, the module names themselves). The vision
tower and projector are plain PyTorch; `enforce_eager=True` runs it as plain Python.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import MultiModalEmbeddings, SupportsMultiModal
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.sequence import IntermediateTensors

from .processing import (
    IMAGE_TOKEN,
    TinyDoctorVLDummyInputsBuilder,
    TinyDoctorVLMultiModalProcessor,
    TinyDoctorVLProcessingInfo,
)

# --- the vision tower: CLIP-like names, plain PyTorch --------------------------------------


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

        out = F.scaled_dot_product_attention(
            heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        )
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
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # [B, N, D]
        return patches + self.position_embedding.weight.unsqueeze(0)


class TinyVisionTower(nn.Module):
    def __init__(self, config) -> None:
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
        return self.post_layernorm(x)  # one feature per patch: [B, num_patches, vision_hidden]


class TinyMultiModalProjector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision_hidden, text_hidden)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(text_hidden, text_hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


# --- the language model: a Llama-like decoder from vLLM's layers ---------------------------


class TinyAttention(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        tp_size = get_tensor_model_parallel_world_size()
        self.head_dim = config.head_dim
        num_heads = config.num_attention_heads // tp_size
        num_kv_heads = max(1, config.num_key_value_heads // tp_size)
        self.q_size, self.kv_size = num_heads * self.head_dim, num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=False,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim, config.hidden_size, bias=False, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = get_rope(
            self.head_dim,
            max_position=config.max_position_embeddings,
            rope_parameters=getattr(config, "rope_parameters", None),
        )
        # The prefix must be unique per layer: vLLM keys the KV cache by it.
        self.attn = Attention(
            num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=num_kv_heads,
            cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn(q, k, v))
        return output


class TinyMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=False, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(x))
        return x


class TinyDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.self_attn = TinyAttention(vllm_config, prefix=f"{prefix}.self_attn")
        self.mlp = TinyMLP(config.hidden_size, config.intermediate_size, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class TinyTextModel(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            TinyDecoderLayer(vllm_config, prefix=f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
        hidden_states, residual = inputs_embeds, None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class TinyLanguageModel(nn.Module):
    """`language_model`: `.model` (the decoder) and `.lm_head`, as in a LLaVA checkpoint."""

    # checkpoint names (HF Llama: q/k/v, gate/up separate) -> the fused parameters
    stacked_params_mapping: tuple[tuple[str, str, str | int], ...] = (
        # (param_name, checkpoint_name, shard_id)
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    )

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.model = TinyTextModel(vllm_config, prefix=f"{prefix}.model")
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=f"{prefix}.lm_head")
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Names here are relative to `language_model.` (AutoWeightsLoader strips it)."""
        params_dict = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            for param_name, weight_name, shard_id in self.stacked_params_mapping:
                if weight_name in name:
                    name = name.replace(weight_name, param_name)
                    param = params_dict[name]
                    param.weight_loader(param, tensor, shard_id)
                    break
            else:
                param = params_dict[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded


# --- the vision-language model --------------------------------------------------------------


@MULTIMODAL_REGISTRY.register_processor(
    TinyDoctorVLMultiModalProcessor,
    info=TinyDoctorVLProcessingInfo,
    dummy_inputs=TinyDoctorVLDummyInputsBuilder,
)
class TinyDoctorVLForConditionalGeneration(nn.Module, SupportsMultiModal):
    # transformers >= 4.52 saves LLaVA checkpoints under model.*; map them onto the modules
    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={
            "model.language_model.": "language_model.model.",
            "model.vision_tower.": "vision_tower.",
            "model.multi_modal_projector.": "multi_modal_projector.",
            "lm_head.": "language_model.lm_head.",
        }
    )

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        if modality.startswith("image"):
            return IMAGE_TOKEN
        raise ValueError("Only image modality is supported")

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.vision_tower = TinyVisionTower(config)
        self.multi_modal_projector = TinyMultiModalProjector(config.vision_hidden_size, config.hidden_size)
        self.language_model = TinyLanguageModel(
            vllm_config, prefix=f"{prefix}.language_model" if prefix else "language_model"
        )

    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings:
        """The processor's `pixel_values` [num_images, 3, H, W] -> one [num_patches, hidden]
        tensor per image, in prompt order."""
        pixel_values = kwargs.get("pixel_values")
        if pixel_values is None:
            return []
        if isinstance(pixel_values, (list, tuple)):
            pixel_values = torch.stack(list(pixel_values))
        assert isinstance(pixel_values, torch.Tensor)
        dtype = self.vision_tower.embeddings.patch_embedding.weight.dtype
        features = self.vision_tower(pixel_values.to(dtype))
        return list(self.multi_modal_projector(features).unbind(0))

    def embed_input_ids(
        self,
        input_ids: torch.Tensor,
        multimodal_embeddings: MultiModalEmbeddings | None = None,
        *,
        is_multimodal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token embeddings, with the image embeddings on the placeholder positions
        (`is_multimodal`: vLLM's mask of the positions the processor reserved)."""
        inputs_embeds = self.language_model.model.embed_tokens(input_ids)
        if multimodal_embeddings is None or len(multimodal_embeddings) == 0:
            return inputs_embeds
        assert is_multimodal is not None
        image_embeds = torch.cat(list(multimodal_embeddings)).to(inputs_embeds.dtype)
        inputs_embeds[is_multimodal] = image_embeds
        return inputs_embeds

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            assert input_ids is not None
            inputs_embeds = self.embed_input_ids(input_ids)
        return self.language_model.model(positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.language_model.logits_processor(self.language_model.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)
