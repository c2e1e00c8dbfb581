"""vllm_doctor.compat.roles against this vLLM's own classes and declarations: each layer class
the profiler, the lint and the quantization facts meet says what it is, and vLLM's in-tree
vision-language models' ``get_mm_mapping()`` names their parts (read on their module layout)."""

from __future__ import annotations

import importlib
import types

import pytest
from torch import nn

from vllm_doctor.compat import roles
from vllm_doctor.compat.quant import _kind as quant_kind

LAYERS = [
    ("vllm.model_executor.layers.linear", "QKVParallelLinear", "linear"),
    ("vllm.model_executor.layers.linear", "RowParallelLinear", "linear"),
    ("vllm.model_executor.layers.linear", "ReplicatedLinear", "linear"),
    ("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding", "embedding"),
    ("vllm.model_executor.layers.vocab_parallel_embedding", "ParallelLMHead", "lm_head"),
    ("vllm.model_executor.layers.logits_processor", "LogitsProcessor", "logits"),
    ("vllm.model_executor.layers.layernorm", "RMSNorm", "norm"),
    ("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding", "rotary"),
    ("vllm.model_executor.layers.attention.attention", "Attention", "attention"),
    ("vllm.model_executor.layers.attention.mla_attention", "MLAAttention", "mla"),
    ("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2", "state"),
    ("vllm.model_executor.layers.mamba.short_conv", "ShortConv", "state"),
]


def _bare(module: str, name: str) -> nn.Module:
    """An instance of vLLM's class without its constructor (which needs a vLLM config and a
    distributed group): what it is depends on its classes only."""
    cls = getattr(importlib.import_module(module), name)
    return cls.__new__(cls)


@pytest.mark.parametrize(("module", "name", "kind"), LAYERS, ids=[n for _, n, _ in LAYERS])
def test_each_of_vllms_layer_classes_says_what_it_is(module: str, name: str, kind: str) -> None:
    assert roles.layer_class(_bare(module, name)) == roles.LayerClass(kind, True)


def test_vllms_fused_experts_are_experts_to_the_profiler_and_the_quantization_facts() -> None:
    import vllm.model_executor.layers.fused_moe as fused_moe

    # RoutedExperts since 0.31, FusedMoE before (0.26 on the GPU): whichever this vLLM has
    cls = getattr(fused_moe, "RoutedExperts", None) or fused_moe.FusedMoE
    experts = cls.__new__(cls)
    assert roles.layer_class(experts) == roles.LayerClass("experts", True)
    assert quant_kind(experts) == "experts"
    assert quant_kind(_bare("vllm.model_executor.layers.vocab_parallel_embedding", "ParallelLMHead")) == "lm_head"
    assert quant_kind(nn.Linear(2, 2)) is None  # vLLM gives a plain torch layer no quant_method


class _Tree(nn.Module):
    def __init__(self, layout: dict[str, object]) -> None:
        super().__init__()
        for name, sub in layout.items():
            self.add_module(name, _Tree(sub) if isinstance(sub, dict) else nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("model", "layout", "towers", "connectors"),
    [
        (
            "vllm.model_executor.models.llava:LlavaForConditionalGeneration",
            {"vision_tower": {"vision_model": {}}, "multi_modal_projector": {"linear_1": 0}, "language_model": {}},
            ("vision_tower",),
            ("multi_modal_projector",),
        ),
        (
            "vllm.model_executor.models.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration",
            {"visual": {"blocks": {}, "merger": {"mlp": 0}}, "language_model": {"model": {}}},
            ("visual",),
            ("visual.merger",),
        ),
    ],
)
def test_vllms_own_declaration_names_the_parts(
    model: str, layout: dict[str, object], towers: tuple[str, ...], connectors: tuple[str, ...]
) -> None:
    """The model's own ``get_mm_mapping`` (vLLM's, bound to a tree of its module layout)."""
    module, name = model.split(":")
    cls = getattr(importlib.import_module(module), name)
    tree = _Tree(layout)
    tree.supports_multimodal = True  # type: ignore[assignment]
    tree.get_mm_mapping = types.MethodType(cls.get_mm_mapping, tree)  # type: ignore[assignment]
    parts = roles.model_parts(tree)
    assert parts.source == "get_mm_mapping"
    assert parts.language_model == "language_model"
    assert parts.towers == towers and parts.connectors == connectors
    # every part once: a connector inside its tower (Qwen2.5-VL's merger) is in the tower's time
    assert parts.encoder == towers + tuple(c for c in connectors if not c.startswith(towers[0] + "."))
