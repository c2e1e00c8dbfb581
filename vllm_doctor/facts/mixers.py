"""The kinds of token mixer the doctor tells apart, by vLLM's KV-cache spec (stdlib only: the
worker and the doctor's side both read it). :mod:`vllm_doctor.compat.mixers` asks vLLM which
kind a layer is; the KV facts, the profiler, the roofline and the checks read the answer here.

============  ==================================================================================
kind          vLLM's spec
============  ==================================================================================
attention     ``FullAttentionSpec`` (attention sinks included: gpt-oss)
sliding       ``SlidingWindowSpec`` (Gemma 2/3, gpt-oss, Mistral with a window)
chunked       ``ChunkedLocalAttentionSpec`` (Llama 4's local layers)
cross         ``CrossAttentionSpec`` (encoder-decoder models)
encoder       ``EncoderOnlyAttentionSpec`` (bidirectional attention, no cache kept)
mla           ``MLAAttentionSpec``: one latent "head" of ``kv_lora_rank + qk_rope_head_dim``
mamba         ``MambaSpec`` of a Mamba 1 / Mamba 2 mixer: a conv and an SSM state per request
linear        ``MambaSpec`` of a linear-attention mixer (MiniMax)
gdn           ``MambaSpec`` of a Gated DeltaNet mixer (Qwen3-Next)
short_conv    ``MambaSpec`` of a short convolution (LFM2)
state         another ``MambaSpec`` (a state kept per request, not a growing cache)
============  ==================================================================================

:data:`FAMILY` folds them into what the per-layer tables call a kind: ``attention`` (a KV cache
that grows with the context), ``mla`` (the latent cache) and ``state`` (a fixed state per
request: state-space and linear mixers).
"""

from __future__ import annotations

from typing import Any

# doctor kind -> per-layer table kind
FAMILY: dict[str, str] = {
    "attention": "attention",
    "sliding": "attention",
    "chunked": "attention",
    "cross": "attention",
    "encoder": "attention",
    "mla": "mla",
    "mamba": "state",
    "linear": "state",
    "gdn": "state",
    "short_conv": "state",
    "state": "state",
}
STATE_KINDS = frozenset(k for k, f in FAMILY.items() if f == "state")
# the standard attention kinds: a layer of these has num_kv_heads x head_size from config.json
ATTENTION_KINDS = frozenset(k for k, f in FAMILY.items() if f == "attention")

_SPEC_KINDS = (
    ("MLAAttentionSpec", "mla"),
    ("SlidingWindow", "sliding"),
    ("ChunkedLocal", "chunked"),
    ("CrossAttention", "cross"),
    ("EncoderOnly", "encoder"),
    ("Mamba", "state"),
    ("FullAttention", "attention"),
    ("Attention", "attention"),
)
MAMBA_TYPES = {
    "mamba1": "mamba",
    "mamba2": "mamba",
    "mamba": "mamba",
    "short_conv": "short_conv",
    "linear": "linear",
    "linear_attention": "linear",
    "gdn_attn": "gdn",
    "gdn_attention": "gdn",
    "gdn": "gdn",
}


def mamba_type_name(value: Any) -> str | None:
    """A Mamba spec's ``mamba_type`` as a lower-case name: the enum member's name (vLLM 0.32:
    ``MambaAttentionBackendEnum.MAMBA2`` -> "mamba2") or the string older vLLM keeps."""
    if value is None:
        return None
    name = getattr(value, "name", None)
    return str(name if isinstance(name, str) else value).lower()


def kind_of_spec(spec_type: str | None, mamba_type: str | None = None) -> str | None:
    """The doctor's kind of a KV-cache spec by its class name (and a Mamba spec's type)."""
    if not spec_type:
        return None
    for needle, kind in _SPEC_KINDS:
        if needle in spec_type:
            if kind == "state":
                return MAMBA_TYPES.get(mamba_type or "", "state")
            return kind
    return None


# the class methods vLLM sizes a Mamba / linear-attention state cache from, before it builds the model
STATE_METHODS = ("get_mamba_state_shape_from_config", "get_mamba_state_dtype_from_config")


def prefix_matches(prefix: str, paths: list[str]) -> bool:
    """Is ``prefix`` the layer's place in the model: its module path, or a name under the module
    that holds it? vLLM's own wrappers register the inner layer under the wrapper's name
    (DeepSeek's MLA: ``self_attn.attn`` for ``self_attn.mla_attn.mla_attn``): the prefix's parent
    is then an ancestor of the layer. A prefix whose parent is no ancestor (``layers.0.attn`` for
    ``model.layers.0.self_attn.attn``, or another layer's index) binds the layer by a wrong name."""
    if prefix in paths:
        return True
    parent = prefix.rpartition(".")[0]
    return bool(parent) and any(p.startswith(parent + ".") for p in paths)
