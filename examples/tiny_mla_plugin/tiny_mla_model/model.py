"""A tiny DeepSeek-V2-style multi-head latent attention (MLA) model for vLLM, its attention
written the way vLLM's own ``DeepseekV2MLAAttention`` is.

Each layer's attention projects the hidden state down to a latent of ``kv_lora_rank`` values
plus a rotary key of ``qk_rope_head_dim`` (``kv_a_proj_with_mqa``), and hands the projections to
vLLM's ``MultiHeadLatentAttentionWrapper``, whose ``MLAAttention`` caches that latent, one
"head" of ``kv_lora_rank + qk_rope_head_dim`` a token, and up-projects it with ``kv_b_proj``. The
MLP is dense (SiLU-gated). What vLLM needs of an MLA port, and what the doctor checks:

- the latent width and rope dim are config.json's ``kv_lora_rank`` / ``qk_rope_head_dim``:
  vLLM sizes the latent cache from what the layer is given, and the checkpoint's
  ``kv_a_proj_with_mqa`` is ``kv_lora_rank + qk_rope_head_dim`` wide;
- the wrapper's ``prefix`` is the attention module's place in the model: the wrapper registers
  its ``MLAAttention`` as ``{prefix}.attn`` in vLLM's forward context (the name vLLM binds its
  cache by), as vLLM's DeepSeek-V2 does.

The checkpoint uses DeepSeek-V2-Lite's tensor names (``self_attn.q_proj``,
``self_attn.kv_a_proj_with_mqa``, ``self_attn.kv_a_layernorm``, ``self_attn.kv_b_proj``,
``self_attn.o_proj``, ``mlp.gate_proj`` / ``up_proj`` / ``down_proj``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mla import MLAModules, MultiHeadLatentAttentionWrapper
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.utils import maybe_prefix


class TinyMlaAttention(nn.Module):
    """DeepSeek-V2-Lite's attention (no q LoRA): q from the hidden state, K and V from a cached
    latent through vLLM's MLA wrapper."""

    def __init__(self, config: Any, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.num_heads = config.num_attention_heads
        self.num_local_heads = self.num_heads // tp
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        hidden = config.hidden_size
        quant_config = vllm_config.quant_config

        self.q_proj = ColumnParallelLinear(
            hidden, self.num_heads * qk_head_dim, bias=False, quant_config=quant_config, prefix=f"{prefix}.q_proj"
        )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden,
            self.kv_lora_rank + self.qk_rope_head_dim,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.kv_a_proj_with_mqa",
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank,
            self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.kv_b_proj",
        )
        self.o_proj = RowParallelLinear(
            self.num_heads * self.v_head_dim, hidden, bias=False, quant_config=quant_config, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = get_rope(
            self.qk_rope_head_dim,
            max_position=config.max_position_embeddings,
            rope_parameters=getattr(config, "rope_parameters", None),
            is_neox_style=False,
        )
        modules = MLAModules(
            kv_a_layernorm=self.kv_a_layernorm,
            kv_b_proj=self.kv_b_proj,
            rotary_emb=self.rotary_emb,
            o_proj=self.o_proj,
            fused_qkv_a_proj=None,
            kv_a_proj_with_mqa=self.kv_a_proj_with_mqa,
            q_a_layernorm=None,
            q_b_proj=None,
            q_proj=self.q_proj,
            indexer=None,
            is_sparse=False,
            topk_indices_buffer=None,
        )
        # registers its MLAAttention as f"{prefix}.attn": vLLM binds the latent cache by that name
        self.mla_attn = MultiHeadLatentAttentionWrapper(
            hidden,
            self.num_local_heads,
            qk_head_dim**-0.5,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
            None,
            self.kv_lora_rank,
            modules,
            vllm_config.cache_config,
            quant_config,
            prefix=prefix,
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.mla_attn(positions, hidden_states)


class TinyMlaMLP(nn.Module):
    """A dense SiLU-gated MLP (gate and up stacked in one projection)."""

    def __init__(self, config: Any, prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=False, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


class TinyMlaDecoderLayer(nn.Module):
    def __init__(self, config: Any, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        self.self_attn = TinyMlaAttention(config, vllm_config, prefix=f"{prefix}.self_attn")
        self.mlp = TinyMlaMLP(config, prefix=f"{prefix}.mlp")
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


# the dynamic dimensions given: under `from __future__ import annotations` the annotations are
# strings, from which vLLM's decorator infers nothing
@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0})
class TinyMlaModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            TinyMlaDecoderLayer(config, vllm_config, prefix=f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class TinyMlaForCausalLM(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = TinyMlaModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load DeepSeek-V2-Lite-named tensors; gate and up fill the stacked ``gate_up_proj``."""
        stacked = [(".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            for param_name, weight_name, shard in stacked:
                if weight_name in name:
                    name = name.replace(weight_name, param_name)
                    params[name].weight_loader(params[name], tensor, shard)
                    break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded
