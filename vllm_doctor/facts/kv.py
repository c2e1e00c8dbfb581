"""A worker's KV cache (``doctor_kv``): the record both ends of the wire share.

Built inside the worker by :func:`vllm_doctor.compat.worker_facts.kv_cache` (which sends
:meth:`KvCache.to_json`), read on the doctor's side once per reply with :meth:`KvCache.of`
(see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates). VD501, VD502, VD504 and VD208
read it, and the report's ``facts["engine"]["kv_cache"]``. Stdlib only: the worker imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm_doctor.facts import wire

WIRE_VERSION = 1


@dataclass(frozen=True)
class KvSpec(wire.Record):
    """vLLM's KV-cache spec of one group, as far as this vLLM exposes it (None: not exposed)."""

    # written with only what vLLM exposed (the report's ``kv_cache.groups`` show it as it is)
    WIRE_SPARSE: ClassVar[bool] = True

    type: str | None = None  # the spec's class: "FullAttentionSpec", "SlidingWindowSpec", "MambaSpec", ...
    block_size: int | None = None
    num_kv_heads: int | None = None
    head_size: int | None = None
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    dtype: str | None = None
    page_size_bytes: int | None = None
    # the doctor's kind (vllm_doctor.compat.mixers: attention, sliding, chunked, mla, mamba, gdn, ...)
    kind: str | None = None
    # a Mamba / linear-attention spec: the mixer's type, its states' shapes and dtypes per
    # request, vLLM's mamba cache mode; any spec: the page without vLLM's padding (the padding
    # is page_size_bytes less it, on every block of every layer of the group)
    mamba_type: str | None = None
    shapes: list[list[int]] = field(default_factory=list, metadata=wire.rules(whole=True, omit_default=True))
    dtypes: list[str] = field(default_factory=list, metadata=wire.rules(omit_default=True))
    mamba_cache_mode: str | None = None
    unpadded_page_bytes: int | None = None

    @property
    def padding_bytes(self) -> int:
        """Bytes vLLM added to each page of this spec (to give every group one page size)."""
        if self.page_size_bytes is None or self.unpadded_page_bytes is None:
            return 0
        return max(0, self.page_size_bytes - self.unpadded_page_bytes)


@dataclass(frozen=True)
class KvGroup(wire.Record):
    """One KV-cache group: the attention layers that share a spec (and the block pool)."""

    layer_names: list[str] = field(default_factory=list)
    spec: KvSpec = field(default_factory=KvSpec)


@dataclass(frozen=True)
class KvTensor(wire.Record):
    """One KV tensor the worker holds (a view; ``storage`` numbers the storage it lives in)."""

    shape: list[int] = field(default_factory=list, metadata=wire.rules(whole=True))
    dtype: str | None = None
    device: str | None = None
    view_bytes: int | None = None
    storage: int | None = None


@dataclass(frozen=True)
class PlannedTensor(wire.Record):
    """One KV tensor vLLM planned (its KVCacheConfig), and the layers that share it."""

    size: int = 0
    layers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AttentionLayer(wire.Record):
    """An attention layer as vLLM's forward context registered it."""

    prefix: str = ""  # the name it was registered under
    layer_name: str | None = None
    layer_class: str | None = field(default=None, metadata=wire.rules(key="class"))
    impl: str | None = None
    backend: str | None = None
    num_kv_heads: int | None = None
    num_heads: int | None = None
    head_size: int | None = None
    kv_cache_dtype: str | None = None
    module_paths: list[str] = field(default_factory=list)  # where the layer object sits in the model
    kv_cache_shape: list[int] | None = field(default=None, metadata=wire.rules(whole=True))
    kv_sharing_target: str | None = None  # reads this other layer's cache (by design)
    # what the layer itself asks vLLM to cache (its get_kv_cache_spec) and the kind that makes it
    kind: str | None = None
    spec: KvSpec | None = field(default=None, metadata=wire.rules(empty_none=True))
    sinks: bool = field(default=False, metadata=wire.rules(omit_default=True))  # attention sinks (gpt-oss)


@dataclass(frozen=True)
class HfShape(wire.Record):
    """The sizes config.json gives (the text config of a multimodal one), and vLLM's head size
    for it: the attention's (VD504) and the rest of a decoder's (the roofline's byte count)."""

    WIRE_SPARSE: ClassVar[bool] = True  # written with only what the config has

    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    model_type: str | None = None
    vllm_head_size: int | None = None  # ModelConfig.get_head_size()
    vllm_num_kv_heads: int | None = None  # ModelConfig.get_num_kv_heads(parallel_config): per rank
    use_mla: bool | None = None  # ModelConfig.use_mla: vLLM runs the attention as MLA
    kv_lora_rank: int | None = None  # MLA's latent width
    qk_rope_head_dim: int | None = None  # MLA's rotary part, cached beside the latent
    intermediate_size: int | None = None  # the MLP size; one per layer (Gemma 3n): their mean
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None
    # a mixture of experts (num_local_experts, n_routed_experts or num_experts above 1)
    moe: bool | None = None
    # its sizes (the routed roofline): routed experts per layer, experts per token, one expert's
    # MLP size (moe_intermediate_size, else intermediate_size), the shared experts' MLP size
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None


@dataclass(frozen=True)
class CacheConfig(wire.Record):
    """vLLM's cache config, as the engine was configured."""

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None


@dataclass(frozen=True)
class KvCache(wire.Record):
    """``doctor_kv``: the KV tensors (shared storage counted once), vLLM's plan, the groups and
    their specs, the limits the engine runs with, and the attention layers."""

    num_tensors: int | None = None
    layers: list[KvTensor] = field(default_factory=list)
    num_storages: int | None = None
    storage_bytes: int | None = None  # each storage once
    view_bytes: int | None = None  # every view, shared storage counted again
    torch_cuda_allocated_bytes: int | None = None
    # from vLLM's KVCacheConfig (None / empty where this vLLM does not expose one)
    num_blocks: int | None = None
    planned_tensors: list[PlannedTensor] = field(default_factory=list)
    planned_bytes: int | None = None
    layout: str | None = None
    groups: list[KvGroup] = field(default_factory=list)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    hf_config: HfShape = field(default_factory=HfShape)
    attention_layers: list[AttentionLayer] = field(default_factory=list)
    # vLLM's own capacity (its "KV cache size: N tokens, Maximum concurrency for M tokens per
    # request: Cx" line): get_kv_cache_capacity / get_max_concurrency_for_kv_cache_config asked
    # in the worker with its KV-cache config, or the engine's cache_config where it stored them
    capacity_tokens: int | None = None
    max_concurrency: float | None = None
    # vLLM allocates one backing buffer that every group's tensors alias (vLLM 0.32): the plan's
    # bytes are that buffer's, once; False: each planned tensor is its own allocation (older vLLM)
    planned_aliased: bool | None = None
    wire_version: int = WIRE_VERSION

    @property
    def block_size(self) -> int | None:
        """The first group's block size, else the cache config's."""
        for group in self.groups:
            if group.spec.block_size:
                return group.spec.block_size
        return self.cache_config.block_size or None

    def to_json(self) -> dict[str, Any]:
        return wire.versioned(self, WIRE_VERSION)
