"""A tiny Mamba 2 / attention hybrid for vLLM, written the way vLLM's own Nemotron-H is.

Each layer is what ``config.hybrid_override_pattern`` says: ``M`` vLLM's ``MambaMixer2``, ``*``
vLLM's ``Attention`` (grouped-query, no rotary: Nemotron-H's), ``-`` a ReLU² MLP. What vLLM needs
of a hybrid, and what the doctor checks:

- the class declares ``IsHybrid`` (it has both a KV cache and a Mamba state) and
  ``HasInnerState``, and gives the state's shapes and dtypes as class methods
  (``get_mamba_state_shape_from_config``, ``get_mamba_state_dtype_from_config``) and how to copy
  it (``get_mamba_state_copy_func``): vLLM sizes the state cache from them before it builds
  the model;
- each mixer's ``prefix`` is its place in the model (vLLM binds its cache by that name);
- the layers built are the pattern's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateCopyFuncCalculator,
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix


class TinyHybridMamba(nn.Module):
    """An ``M`` layer: a norm and vLLM's Mamba 2 mixer."""

    def __init__(self, config: Any, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mixer = MambaMixer2(
            hidden_size=config.hidden_size,
            ssm_state_size=config.ssm_state_size,
            conv_kernel_size=config.conv_kernel,
            intermediate_size=config.mamba_num_heads * config.mamba_head_dim,
            use_conv_bias=True,
            use_bias=False,
            n_groups=config.n_groups,
            num_heads=config.mamba_num_heads,
            head_dim=config.mamba_head_dim,
            rms_norm_eps=config.layer_norm_epsilon,
            activation="silu",
            model_config=vllm_config.model_config,
            cache_config=vllm_config.cache_config,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.mixer",
        )

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.mixer(self.norm(hidden_states))


class TinyHybridAttention(nn.Module):
    """A ``*`` layer: a norm and grouped-query attention through vLLM's ``Attention``."""

    def __init__(self, config: Any, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.num_heads = config.num_attention_heads // tp
        self.num_kv_heads = max(1, config.num_key_value_heads // tp)
        self.head_dim = config.head_dim
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
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
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(self.norm(hidden_states))
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        out, _ = self.o_proj(self.attn(q, k, v))
        return out


class TinyHybridMLP(nn.Module):
    """A ``-`` layer: a norm and a ReLU² MLP (Nemotron-H's)."""

    def __init__(self, config: Any, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.up_proj = ColumnParallelLinear(
            config.hidden_size, config.intermediate_size, bias=False, prefix=f"{prefix}.up_proj"
        )
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=False, prefix=f"{prefix}.down_proj"
        )

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        up, _ = self.up_proj(self.norm(hidden_states))
        out, _ = self.down_proj(torch.square(torch.relu(up)))
        return out


LAYERS = {"M": TinyHybridMamba, "*": TinyHybridAttention, "-": TinyHybridMLP}


# the dynamic dimensions given: under `from __future__ import annotations` the annotations are
# strings, from which vLLM's decorator infers nothing
@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0})
class TinyHybridModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LAYERS[kind](config, vllm_config, prefix=f"{prefix}.layers.{i}")
            for i, kind in enumerate(config.hybrid_override_pattern)
        )
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        for layer in self.layers:
            hidden_states = hidden_states + layer(hidden_states, positions)
        return self.norm_f(hidden_states)


class TinyHybridForCausalLM(nn.Module, HasInnerState, IsHybrid):
    # checkpoints store Mamba's A as log(-A), as Nemotron-H's do
    hf_to_vllm_mapper = WeightsMapper(orig_to_new_substr={".A_log": ".A"})

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype, torch.dtype]:
        return MambaStateDtypeCalculator.mamba2_state_dtype(
            vllm_config.model_config.dtype,
            vllm_config.cache_config.mamba_cache_dtype,
            vllm_config.cache_config.mamba_ssm_cache_dtype,
        )

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig) -> tuple[tuple[int, int], tuple[int, int, int]]:
        config = vllm_config.model_config.hf_config
        return MambaStateShapeCalculator.mamba2_state_shape(
            intermediate_size=config.mamba_num_heads * config.mamba_head_dim,
            tp_world_size=vllm_config.parallel_config.tensor_parallel_size,
            n_groups=config.n_groups,
            num_heads=config.mamba_num_heads,
            head_dim=config.mamba_head_dim,
            state_size=config.ssm_state_size,
            conv_kernel=config.conv_kernel,
        )

    @classmethod
    def get_mamba_state_copy_func(cls) -> Any:
        return MambaStateCopyFuncCalculator.mamba2_state_copy_func()

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = TinyHybridModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
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
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
