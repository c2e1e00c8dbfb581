"""A worker's KV cache (``doctor_kv``): the record both ends of the wire share.

Built inside the worker by :func:`vllm_doctor.compat.worker_facts.kv_cache` (which sends
:meth:`KvCache.to_wire`), read on the doctor's side once per reply with :meth:`KvCache.from_wire`
(see :mod:`vllm_doctor.facts.wire` for what a decoder tolerates). VD501, VD502, VD504 and VD208
read it, and the report's ``facts["engine"]["kv_cache"]``. Stdlib only: the worker imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts.wire import (
    VERSION_KEY,
    int_list,
    mapping,
    opt_bool,
    opt_float,
    opt_int,
    opt_str,
    records,
    str_list,
    version,
    without_none,
)

WIRE_VERSION = 1


@dataclass(frozen=True)
class KvSpec:
    """vLLM's KV-cache spec of one group, as far as this vLLM exposes it (None: not exposed)."""

    type: str | None = None  # the spec's class: "FullAttentionSpec", "SlidingWindowSpec", "MambaSpec", ...
    block_size: int | None = None
    num_kv_heads: int | None = None
    head_size: int | None = None
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    dtype: str | None = None
    page_size_bytes: int | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> KvSpec:
        return cls(
            type=opt_str(data.get("type")),
            block_size=opt_int(data.get("block_size")),
            num_kv_heads=opt_int(data.get("num_kv_heads")),
            head_size=opt_int(data.get("head_size")),
            head_size_v=opt_int(data.get("head_size_v")),
            sliding_window=opt_int(data.get("sliding_window")),
            attention_chunk_size=opt_int(data.get("attention_chunk_size")),
            dtype=opt_str(data.get("dtype")),
            page_size_bytes=opt_int(data.get("page_size_bytes")),
        )

    def to_wire(self) -> dict[str, Any]:
        """Only what vLLM exposed (the report's ``kv_cache.groups`` show it as it is)."""
        return without_none(
            {
                "type": self.type,
                "block_size": self.block_size,
                "num_kv_heads": self.num_kv_heads,
                "head_size": self.head_size,
                "head_size_v": self.head_size_v,
                "sliding_window": self.sliding_window,
                "attention_chunk_size": self.attention_chunk_size,
                "dtype": self.dtype,
                "page_size_bytes": self.page_size_bytes,
            }
        )


@dataclass(frozen=True)
class KvGroup:
    """One KV-cache group: the attention layers that share a spec (and the block pool)."""

    layer_names: list[str] = field(default_factory=list)
    spec: KvSpec = field(default_factory=KvSpec)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> KvGroup:
        return cls(str_list(data.get("layer_names")), KvSpec.from_wire(mapping(data.get("spec"))))

    def to_wire(self) -> dict[str, Any]:
        return {"layer_names": list(self.layer_names), "spec": self.spec.to_wire()}


@dataclass(frozen=True)
class KvTensor:
    """One KV tensor the worker holds (a view; ``storage`` numbers the storage it lives in)."""

    shape: list[int] = field(default_factory=list)
    dtype: str | None = None
    device: str | None = None
    view_bytes: int | None = None
    storage: int | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> KvTensor:
        return cls(
            shape=int_list(data.get("shape")),
            dtype=opt_str(data.get("dtype")),
            device=opt_str(data.get("device")),
            view_bytes=opt_int(data.get("view_bytes")),
            storage=opt_int(data.get("storage")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "view_bytes": self.view_bytes,
            "storage": self.storage,
        }


@dataclass(frozen=True)
class PlannedTensor:
    """One KV tensor vLLM planned (its KVCacheConfig), and the layers that share it."""

    size: int = 0
    layers: list[str] = field(default_factory=list)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PlannedTensor:
        return cls(opt_int(data.get("size")) or 0, str_list(data.get("layers")))

    def to_wire(self) -> dict[str, Any]:
        return {"size": self.size, "layers": list(self.layers)}


@dataclass(frozen=True)
class AttentionLayer:
    """An attention layer as vLLM's forward context registered it."""

    prefix: str = ""  # the name it was registered under
    layer_name: str | None = None
    layer_class: str | None = None  # wire key "class"
    impl: str | None = None
    backend: str | None = None
    num_kv_heads: int | None = None
    num_heads: int | None = None
    head_size: int | None = None
    kv_cache_dtype: str | None = None
    module_paths: list[str] = field(default_factory=list)  # where the layer object sits in the model
    kv_cache_shape: list[int] | None = None
    kv_sharing_target: str | None = None  # reads this other layer's cache (by design)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> AttentionLayer:
        shape = data.get("kv_cache_shape")
        return cls(
            prefix=opt_str(data.get("prefix")) or "",
            layer_name=opt_str(data.get("layer_name")),
            layer_class=opt_str(data.get("class")),
            impl=opt_str(data.get("impl")),
            backend=opt_str(data.get("backend")),
            num_kv_heads=opt_int(data.get("num_kv_heads")),
            num_heads=opt_int(data.get("num_heads")),
            head_size=opt_int(data.get("head_size")),
            kv_cache_dtype=opt_str(data.get("kv_cache_dtype")),
            module_paths=str_list(data.get("module_paths")),
            kv_cache_shape=int_list(shape) if isinstance(shape, list) else None,
            kv_sharing_target=opt_str(data.get("kv_sharing_target")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "layer_name": self.layer_name,
            "class": self.layer_class,
            "impl": self.impl,
            "backend": self.backend,
            "num_kv_heads": self.num_kv_heads,
            "num_heads": self.num_heads,
            "head_size": self.head_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "module_paths": list(self.module_paths),
            "kv_cache_shape": list(self.kv_cache_shape) if self.kv_cache_shape is not None else None,
            "kv_sharing_target": self.kv_sharing_target,
        }


@dataclass(frozen=True)
class HfShape:
    """The sizes config.json gives (the text config of a multimodal one), and vLLM's head size
    for it: the attention's (VD504) and the rest of a decoder's (the roofline's byte count)."""

    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    model_type: str | None = None
    vllm_head_size: int | None = None  # ModelConfig.get_head_size()
    intermediate_size: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None
    # a mixture of experts (num_local_experts, n_routed_experts or num_experts above 1)
    moe: bool | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> HfShape:
        return cls(
            num_hidden_layers=opt_int(data.get("num_hidden_layers")),
            num_attention_heads=opt_int(data.get("num_attention_heads")),
            num_key_value_heads=opt_int(data.get("num_key_value_heads")),
            head_dim=opt_int(data.get("head_dim")),
            hidden_size=opt_int(data.get("hidden_size")),
            model_type=opt_str(data.get("model_type")),
            vllm_head_size=opt_int(data.get("vllm_head_size")),
            intermediate_size=opt_int(data.get("intermediate_size")),
            vocab_size=opt_int(data.get("vocab_size")),
            tie_word_embeddings=opt_bool(data.get("tie_word_embeddings")),
            moe=opt_bool(data.get("moe")),
        )

    def to_wire(self) -> dict[str, Any]:
        """Only what the config has."""
        return without_none(
            {
                "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "hidden_size": self.hidden_size,
                "model_type": self.model_type,
                "vllm_head_size": self.vllm_head_size,
                "intermediate_size": self.intermediate_size,
                "vocab_size": self.vocab_size,
                "tie_word_embeddings": self.tie_word_embeddings,
                "moe": self.moe,
            }
        )


@dataclass(frozen=True)
class CacheConfig:
    """vLLM's cache config, as the engine was configured."""

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CacheConfig:
        return cls(
            block_size=opt_int(data.get("block_size")),
            num_gpu_blocks=opt_int(data.get("num_gpu_blocks")),
            cache_dtype=opt_str(data.get("cache_dtype")),
            kv_cache_memory_bytes=opt_int(data.get("kv_cache_memory_bytes")),
            gpu_memory_utilization=opt_float(data.get("gpu_memory_utilization")),
            enable_prefix_caching=opt_bool(data.get("enable_prefix_caching")),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "cache_dtype": self.cache_dtype,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_prefix_caching": self.enable_prefix_caching,
        }


@dataclass(frozen=True)
class KvCache:
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
    wire_version: int = WIRE_VERSION

    @property
    def block_size(self) -> int | None:
        """The first group's block size, else the cache config's."""
        for group in self.groups:
            if group.spec.block_size:
                return group.spec.block_size
        return self.cache_config.block_size or None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> KvCache:
        data = mapping(data)
        return cls(
            num_tensors=opt_int(data.get("num_tensors")),
            layers=records(data.get("layers"), KvTensor.from_wire),
            num_storages=opt_int(data.get("num_storages")),
            storage_bytes=opt_int(data.get("storage_bytes")),
            view_bytes=opt_int(data.get("view_bytes")),
            torch_cuda_allocated_bytes=opt_int(data.get("torch_cuda_allocated_bytes")),
            num_blocks=opt_int(data.get("num_blocks")),
            planned_tensors=records(data.get("planned_tensors"), PlannedTensor.from_wire),
            planned_bytes=opt_int(data.get("planned_bytes")),
            layout=opt_str(data.get("layout")),
            groups=records(data.get("groups"), KvGroup.from_wire),
            cache_config=CacheConfig.from_wire(mapping(data.get("cache_config"))),
            max_model_len=opt_int(data.get("max_model_len")),
            max_num_seqs=opt_int(data.get("max_num_seqs")),
            max_num_batched_tokens=opt_int(data.get("max_num_batched_tokens")),
            tensor_parallel_size=opt_int(data.get("tensor_parallel_size")) or 1,
            hf_config=HfShape.from_wire(mapping(data.get("hf_config"))),
            attention_layers=records(data.get("attention_layers"), AttentionLayer.from_wire),
            wire_version=version(data),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            VERSION_KEY: WIRE_VERSION,
            "num_tensors": self.num_tensors,
            "layers": [t.to_wire() for t in self.layers],
            "num_storages": self.num_storages,
            "storage_bytes": self.storage_bytes,
            "view_bytes": self.view_bytes,
            "torch_cuda_allocated_bytes": self.torch_cuda_allocated_bytes,
            "num_blocks": self.num_blocks,
            "planned_tensors": [p.to_wire() for p in self.planned_tensors],
            "planned_bytes": self.planned_bytes,
            "layout": self.layout,
            "groups": [g.to_wire() for g in self.groups],
            "cache_config": self.cache_config.to_wire(),
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "tensor_parallel_size": self.tensor_parallel_size,
            "hf_config": self.hf_config.to_wire(),
            "attention_layers": [a.to_wire() for a in self.attention_layers],
        }
