"""Which in-tree vLLM architecture is a custom model's *twin*: the same tensors in the same shapes.

Pure matching over plain data: the checkpoint's tensor names and shapes (from the safetensors
headers, :mod:`vllm_doctor.probes.safetensors_header`) and config.json as a dict. No vLLM, no
torch. ``profile --twin`` then builds the twin from the same sizes (:func:`twin_config`) and runs
both on the same workload (:mod:`vllm_doctor.stages.twin`).

The layouts are data (:data:`ARCHITECTURES`): each in-tree architecture's Hugging Face tensor
names per decoder layer, with each shape written in the config's sizes (``q`` = heads x head
dim, ``kv`` = KV heads x head dim, ...). A port matches an architecture

* **by name** when its checkpoint holds exactly that architecture's tensors, in the shapes the
  sizes give: vLLM's own loader reads the same files, so both runs load the same weights;
* **by structure** when the names differ (a port's own module names) but every decoder layer
  holds the same multiset of shapes, q/k/v or gate/up possibly stored fused: both runs then load
  ``load_format=dummy`` (random weights: the same speed, not the same outputs).

The custom model may use its own ``model_type`` and config class: the sizes are read under the
usual names and their common aliases (:data:`SIZE_KEYS`). Where no architecture fits, the result
says why in one line, from the closest one's first disagreement.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

# ---- the layouts ---------------------------------------------------------------------------------

# the symbols a shape is written in, in words (for messages)
SYMBOLS = {
    "h": "hidden_size",
    "i": "intermediate_size",
    "q": "num_attention_heads x head_dim",
    "kv": "num_key_value_heads x head_dim",
    "d": "head_dim",
    "v": "vocab_size",
    "e": "num_experts",
    "m": "moe_intermediate_size",
    "s": "shared_expert_intermediate_size",
    "1": "1",
}


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor of a layout: its Hugging Face name (inside ``model.layers.N.`` for a
    layer's; ``{e}`` stands for each expert), its shape in :data:`SYMBOLS`, the module role it
    plays (for messages) and the group a port may store it fused with along dim 0 (q/k/v as one
    ``qkv_proj``, gate/up as one ``gate_up_proj``)."""

    name: str
    shape: tuple[str, ...]
    role: str
    fuse: str | None = None


@dataclass(frozen=True)
class ArchSpec:
    """An in-tree architecture's checkpoint layout and how its twin's config.json is written."""

    architecture: str
    model_type: str
    layer: tuple[TensorSpec, ...]
    # found by --twin auto; False: a layout another entry already has (chosen only when forced)
    auto: bool = True
    needs: tuple[str, ...] = ()  # sizes beyond the dense ones (MoE: num_experts, ...)
    config: Mapping[str, Any] = field(default_factory=dict)  # fixed keys of the twin's config.json
    copy: tuple[str, ...] = ()  # config keys copied from the port's config when it has them
    # config values the architecture supports: a port config that sets another cannot be its twin
    supports: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    note: str = ""
    # the twin config's keys for the expert count and the expert MLP size (None: intermediate_size)
    expert_keys: tuple[str, str | None] = ("num_experts", "moe_intermediate_size")


GLOBAL = (
    TensorSpec("model.embed_tokens.weight", ("v", "h"), "embedding"),
    TensorSpec("model.norm.weight", ("h",), "final norm"),
)
LM_HEAD = TensorSpec("lm_head.weight", ("v", "h"), "LM head")
LAYER_PREFIX = "model.layers.{n}."

_ATTN = (
    TensorSpec("self_attn.q_proj.weight", ("q", "h"), "q projection", "qkv"),
    TensorSpec("self_attn.k_proj.weight", ("kv", "h"), "k projection", "qkv"),
    TensorSpec("self_attn.v_proj.weight", ("kv", "h"), "v projection", "qkv"),
    TensorSpec("self_attn.o_proj.weight", ("h", "q"), "output projection"),
)
_QKV_BIAS = (
    TensorSpec("self_attn.q_proj.bias", ("q",), "q bias", "qkv_bias"),
    TensorSpec("self_attn.k_proj.bias", ("kv",), "k bias", "qkv_bias"),
    TensorSpec("self_attn.v_proj.bias", ("kv",), "v bias", "qkv_bias"),
)
_QK_NORM = (
    TensorSpec("self_attn.q_norm.weight", ("d",), "q norm"),
    TensorSpec("self_attn.k_norm.weight", ("d",), "k norm"),
)
_MLP = (
    TensorSpec("mlp.gate_proj.weight", ("i", "h"), "gate projection", "gate_up"),
    TensorSpec("mlp.up_proj.weight", ("i", "h"), "up projection", "gate_up"),
    TensorSpec("mlp.down_proj.weight", ("h", "i"), "down projection"),
)
_MOE = (
    TensorSpec("mlp.gate.weight", ("e", "h"), "router"),
    TensorSpec("mlp.experts.{e}.gate_proj.weight", ("m", "h"), "expert gate projection", "gate_up"),
    TensorSpec("mlp.experts.{e}.up_proj.weight", ("m", "h"), "expert up projection", "gate_up"),
    TensorSpec("mlp.experts.{e}.down_proj.weight", ("h", "m"), "expert down projection"),
)
# Mixtral's experts: the expert MLP is intermediate_size, w1 the gate, w3 the up, w2 the down projection
_MIXTRAL_MOE = (
    TensorSpec("block_sparse_moe.gate.weight", ("e", "h"), "router"),
    TensorSpec("block_sparse_moe.experts.{e}.w1.weight", ("i", "h"), "expert gate projection (w1)", "gate_up"),
    TensorSpec("block_sparse_moe.experts.{e}.w3.weight", ("i", "h"), "expert up projection (w3)", "gate_up"),
    TensorSpec("block_sparse_moe.experts.{e}.w2.weight", ("h", "i"), "expert down projection (w2)"),
)
# Qwen2-MoE's: the routed experts as Qwen3-MoE's, plus one shared expert and its sigmoid gate
_QWEN2_MOE = (
    *_MOE,
    TensorSpec("mlp.shared_expert.gate_proj.weight", ("s", "h"), "shared expert gate projection", "shared_gate_up"),
    TensorSpec("mlp.shared_expert.up_proj.weight", ("s", "h"), "shared expert up projection", "shared_gate_up"),
    TensorSpec("mlp.shared_expert.down_proj.weight", ("h", "s"), "shared expert down projection"),
    TensorSpec("mlp.shared_expert_gate.weight", ("1", "h"), "shared expert gate"),
)
_NORMS = (
    TensorSpec("input_layernorm.weight", ("h",), "input norm"),
    TensorSpec("post_attention_layernorm.weight", ("h",), "post-attention norm"),
)
SILU = {"hidden_act": ("silu",)}

# Order matters for --twin auto: the first entry that fits wins.
ARCHITECTURES: tuple[ArchSpec, ...] = (
    ArchSpec(
        "LlamaForCausalLM",
        "llama",
        _ATTN + _MLP + _NORMS,
        config={"attention_bias": False, "mlp_bias": False},
        supports=SILU,
    ),
    ArchSpec("Qwen2ForCausalLM", "qwen2", _ATTN + _QKV_BIAS + _MLP + _NORMS, supports=SILU),
    ArchSpec(
        "Qwen3ForCausalLM", "qwen3", _ATTN + _QK_NORM + _MLP + _NORMS, config={"attention_bias": False}, supports=SILU
    ),
    ArchSpec(
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        _ATTN + _QK_NORM + _MOE + _NORMS,
        needs=("e", "m"),
        config={"attention_bias": False, "decoder_sparse_step": 1, "mlp_only_layers": []},
        copy=("num_experts_per_tok", "norm_topk_prob"),
        supports=SILU,
    ),
    ArchSpec(
        "Qwen2MoeForCausalLM",
        "qwen2_moe",
        _ATTN + _QKV_BIAS + _QWEN2_MOE + _NORMS,
        needs=("e", "m", "s"),
        config={"decoder_sparse_step": 1, "mlp_only_layers": []},
        copy=("num_experts_per_tok", "norm_topk_prob"),
        supports=SILU,
    ),
    ArchSpec(
        "MixtralForCausalLM",
        "mixtral",
        _ATTN + _MIXTRAL_MOE + _NORMS,
        needs=("e",),
        copy=("num_experts_per_tok", "sliding_window"),
        supports=SILU,
        expert_keys=("num_local_experts", None),
    ),
    ArchSpec(
        "MistralForCausalLM",
        "mistral",
        _ATTN + _MLP + _NORMS,
        auto=False,
        copy=("sliding_window",),
        supports=SILU,
        note="the same checkpoint layout as LlamaForCausalLM: chosen only when forced",
    ),
)
BY_NAME = {a.architecture: a for a in ARCHITECTURES}

# vLLM's loaders skip these (rotary caches some checkpoints store): they are nobody's weights
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")

# ---- the sizes -------------------------------------------------------------------------------------

# a size under its usual name first, then the aliases other config classes use
SIZE_KEYS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim", "model_dim"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "mlp_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "head_dim": ("head_dim", "head_size", "kv_channels"),
    "vocab_size": ("vocab_size", "n_vocab", "padded_vocab_size"),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "moe_intermediate_size": ("moe_intermediate_size", "expert_intermediate_size", "moe_ffn_dim"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
}
EPS_KEYS = ("rms_norm_eps", "norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rms_eps")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
# copied into the twin's config.json when the port's has them: rotary, token ids, dtype, quantization
COMMON_COPY = (
    "rope_theta",
    "rope_parameters",
    "rope_scaling",
    "partial_rotary_factor",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "dtype",
    "torch_dtype",
    "quantization_config",
    "hidden_act",
)


@dataclass(frozen=True)
class Sizes:
    """The sizes a layout's shapes are written in, and the config key each came from."""

    hidden: int
    intermediate: int | None
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie: bool
    experts: int | None = None
    moe_intermediate: int | None = None
    shared_intermediate: int | None = None  # Qwen2-MoE's shared expert
    eps: float | None = None
    max_positions: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    def dims(self) -> dict[str, int | None]:
        return {
            "h": self.hidden,
            "i": self.intermediate,
            "q": self.heads * self.head_dim,
            "kv": self.kv_heads * self.head_dim,
            "d": self.head_dim,
            "v": self.vocab,
            "e": self.experts,
            "m": self.moe_intermediate,
            "s": self.shared_intermediate,
            "1": 1,
        }


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decoder's part of a config (``text_config`` of a multimodal one, else the config)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) and "hidden_size" not in config else config


def _size(config: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[int | None, str | None]:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, key
    return None, None


def read_sizes(config: Mapping[str, Any], has_lm_head: bool) -> tuple[Sizes | None, str | None]:
    """The dense sizes from config.json (aliases included); (None, why) when one is missing."""
    cfg = _text_config(config)
    got: dict[str, int | None] = {}
    sources: dict[str, str] = {}
    for name, keys in SIZE_KEYS.items():
        got[name], key = _size(cfg, keys)
        if key is not None:
            sources[name] = key
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if got[name] is None:
            aliases = SIZE_KEYS[name]
            return None, f"config.json gives no {aliases[0]} (nor {', '.join(aliases[1:])})"
    hidden, heads = int(got["hidden_size"] or 0), int(got["num_attention_heads"] or 0)
    head_dim = got["head_dim"] or (hidden // heads if hidden % heads == 0 else None)
    if head_dim is None:
        return None, f"config.json gives no head_dim and hidden_size {hidden} is not a multiple of {heads} heads"
    eps = next((float(cfg[k]) for k in EPS_KEYS if isinstance(cfg.get(k), int | float)), None)
    positions, _ = _size(cfg, POSITION_KEYS)
    tie = cfg.get("tie_word_embeddings")
    if not isinstance(tie, bool):
        tie = config.get("tie_word_embeddings") if isinstance(config.get("tie_word_embeddings"), bool) else None
    sizes = Sizes(
        hidden=hidden,
        intermediate=got["intermediate_size"],
        layers=int(got["num_hidden_layers"] or 0),
        heads=heads,
        kv_heads=got["num_key_value_heads"] or heads,
        head_dim=head_dim,
        vocab=int(got["vocab_size"] or 0),
        tie=(not has_lm_head) if tie is None else tie,
        experts=got["num_experts"],
        moe_intermediate=got["moe_intermediate_size"],
        shared_intermediate=got["shared_expert_intermediate_size"],
        eps=eps,
        max_positions=positions,
        sources=sources,
    )
    return sizes, None


# ---- the result ----------------------------------------------------------------------------------


@dataclass
class TwinMatch:
    """The twin found: which architecture, how (``auto`` / ``forced``), whose weights (``same``:
    the port's files under vLLM's loader; ``dummy``: random weights on both runs) and the sizes."""

    architecture: str
    model_type: str
    how: str
    weights: str
    sizes: Sizes
    notes: list[str] = field(default_factory=list)
    # a multimodal checkpoint: the prefix its language model sat under (the twin is the decoder's)
    decoder_prefix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "weights": self.weights,
            "notes": list(self.notes),
            "decoder_prefix": self.decoder_prefix,
        }


@dataclass
class NoTwin:
    """No architecture fits: ``reason`` in one line; ``bad_input``: ``--twin ARCH`` named an
    architecture the doctor has no layout for, or one that does not fit (the user's input)."""

    reason: str
    bad_input: bool = False
    tried: dict[str, str] = field(default_factory=dict)  # architecture -> its first disagreement


# ---- matching ------------------------------------------------------------------------------------

_LAYER = re.compile(r"^(?P<stack>(?:.*\.)?(?:layers|layer|h|blocks|block|decoder_layers))\.(?P<n>\d+)\.(?P<rest>.+)$")
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _spec_shape_text(spec: TensorSpec, dims: Mapping[str, int | None]) -> str:
    return "[" + ", ".join(f"{SYMBOLS[s]} = {dims.get(s)}" for s in spec.shape) + "]"


def _eval(shape: tuple[str, ...], dims: Mapping[str, int | None]) -> tuple[int, ...] | None:
    out = []
    for s in shape:
        v = dims.get(s)
        if v is None:
            return None
        out.append(int(v))
    return tuple(out)


def _layer_specs(spec: ArchSpec, sizes: Sizes) -> list[tuple[str, TensorSpec, str | None]]:
    """(name inside a layer, spec, expert key) of every tensor one layer holds, experts expanded."""
    out: list[tuple[str, TensorSpec, str | None]] = []
    for t in spec.layer:
        if "{e}" in t.name:
            out.extend((t.name.replace("{e}", str(e)), t, str(e)) for e in range(sizes.experts or 0))
        else:
            out.append((t.name, t, None))
    return out


def expected_tensors(spec: ArchSpec, sizes: Sizes) -> dict[str, tuple[TensorSpec, tuple[int, ...] | None]]:
    """Every tensor name the architecture's checkpoint holds at these sizes, with its shape."""
    dims = sizes.dims()
    out: dict[str, tuple[TensorSpec, tuple[int, ...] | None]] = {}
    for t in GLOBAL + (() if sizes.tie else (LM_HEAD,)):
        out[t.name] = (t, _eval(t.shape, dims))
    layer = _layer_specs(spec, sizes)
    for n in range(sizes.layers):
        prefix = LAYER_PREFIX.format(n=n)
        for name, t, _ in layer:
            out[prefix + name] = (t, _eval(t.shape, dims))
    return out


def _collapse(name: str) -> str:
    """``model.layers.0.mlp.experts.3.w1.weight`` -> ``model.layers.0.mlp.experts.*`` (the first
    index after the layer's, cut there): a group of extra tensors in one phrase."""
    m = _LAYER.match(name)
    head, rest = (f"{m['stack']}.{m['n']}.", m["rest"]) if m else ("", name)
    inner = _INDEX.search("." + rest)
    if inner is None:
        return head + rest
    return head + rest[: max(0, inner.start() - 1)] + ".*"


def compare_names(spec: ArchSpec, sizes: Sizes, tensors: Mapping[str, Sequence[int]]) -> tuple[list[str], float]:
    """Disagreements of the checkpoint with ``spec``'s names and shapes (first ones first), and
    the share of the architecture's names the checkpoint has."""
    expected = expected_tensors(spec, sizes)
    dims = sizes.dims()
    problems: list[str] = []
    wrong = [
        f"{name} is {_shape_text(tensors[name])}; {spec.architecture} needs {_spec_shape_text(t, dims)}"
        for name, (t, shape) in expected.items()
        if name in tensors and shape is not None and tuple(tensors[name]) != shape
    ]
    missing = [name for name in expected if name not in tensors]
    extra = [name for name in tensors if name not in expected]
    problems.extend(wrong)
    if extra:
        groups = list(dict.fromkeys(_collapse(n) for n in _first_layer_first(extra)))
        more = f" (and {len(groups) - 1} more)" if len(groups) > 1 else ""
        problems.append(f"{groups[0]} has no counterpart in {spec.architecture}{more}")
    if missing:
        t = expected[missing[0]][0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        problems.append(f"{spec.architecture} needs {missing[0]} ({t.role}); the checkpoint has none{more}")
    found = sum(1 for name in expected if name in tensors)
    return problems, found / max(1, len(expected))


def _first_layer_first(names: list[str]) -> list[str]:
    def key(name: str) -> tuple[int, str]:
        m = _LAYER.match(name)
        return (int(m["n"]) if m else -1, name)

    return sorted(names, key=key)


def _split_layers(
    tensors: Mapping[str, Sequence[int]],
) -> tuple[dict[int, dict[str, tuple[int, ...]]], dict[str, tuple[int, ...]]]:
    """The checkpoint's decoder layers (the largest ``<stack>.N.`` group) and everything else."""
    stacks: dict[str, dict[int, dict[str, tuple[int, ...]]]] = {}
    for name, shape in tensors.items():
        m = _LAYER.match(name)
        if m:
            stacks.setdefault(m["stack"], {}).setdefault(int(m["n"]), {})[m["rest"]] = tuple(shape)
    stack = max(stacks, key=lambda s: sum(len(v) for v in stacks[s].values()), default=None)
    layers = stacks.get(stack, {}) if stack is not None else {}
    prefix = f"{stack}." if stack is not None else None
    rest = {n: tuple(s) for n, s in tensors.items() if prefix is None or not n.startswith(prefix)}
    return layers, rest


def _layer_variants(spec: ArchSpec, sizes: Sizes) -> list[Counter[tuple[int, ...]]]:
    """The multisets of shapes one layer of ``spec`` may hold: each fuse group stored apart or
    concatenated along dim 0 (per expert for the experts' gate/up)."""
    dims = sizes.dims()
    layer = _layer_specs(spec, sizes)
    groups = sorted({t.fuse for _, t, _ in layer if t.fuse})
    variants = []
    for fused in product((False, True), repeat=len(groups)):
        on = {g for g, f in zip(groups, fused, strict=True) if f}
        shapes: Counter[tuple[int, ...]] = Counter()
        merged: dict[tuple[str, str | None], list[int]] = {}
        for _, t, expert in layer:
            shape = _eval(t.shape, dims)
            if shape is None:
                return []
            if t.fuse in on:
                key = (t.fuse or "", expert)
                if key in merged:
                    merged[key][0] += shape[0]
                else:
                    merged[key] = list(shape)
            else:
                shapes[shape] += 1
        for shape_list in merged.values():
            shapes[tuple(shape_list)] += 1
        variants.append(shapes)
    return variants


def _shapes_text(shapes: Counter[tuple[int, ...]]) -> str:
    parts = [_shape_text(s) + (f" x {n}" if n > 1 else "") for s, n in sorted(shapes.items())]
    return ", ".join(parts[:4]) + (f" and {len(parts) - 4} more" if len(parts) > 4 else "")


def compare_structure(spec: ArchSpec, sizes: Sizes, tensors: Mapping[str, Sequence[int]]) -> str | None:
    """Does every decoder layer hold ``spec``'s shapes (whatever their names)? None when it does,
    else the first disagreement."""
    layers, rest = _split_layers(tensors)
    if not layers:
        return "the checkpoint has no decoder layers (no tensor named like <...>.layers.N.<...>)"
    if sorted(layers) != list(range(sizes.layers)):
        return (
            f"the checkpoint has decoder layers {min(layers)}..{max(layers)} ({len(layers)}); config.json's "
            f"{sizes.sources.get('num_hidden_layers', 'num_hidden_layers')} says {sizes.layers}"
        )
    variants = _layer_variants(spec, sizes)
    if not variants:
        missing = [SYMBOLS[s] for s in spec.needs if sizes.dims().get(s) is None]
        return f"{spec.architecture} needs {', '.join(missing) or 'a size'} in config.json"
    for n in sorted(layers):
        held = Counter(layers[n].values())
        if held in variants:
            continue
        best = min(variants, key=lambda v: sum(((held - v) + (v - held)).values()))
        extra, lacking = held - best, best - held
        parts = []
        if extra:
            parts.append(f"holds {_shapes_text(extra)} that {spec.architecture} has no place for")
        if lacking:
            parts.append(f"lacks {_shapes_text(lacking)} that {spec.architecture} needs")
        return f"decoder layer {n} " + " and ".join(parts)
    dims = sizes.dims()
    want: Counter[tuple[int, ...]] = Counter()
    for t in GLOBAL + (() if sizes.tie else (LM_HEAD,)):
        shape = _eval(t.shape, dims)
        if shape is not None:
            want[shape] += 1
    held = Counter(rest.values())
    if held != want:
        extra, lacking = held - want, want - held
        parts = []
        if extra:
            parts.append(f"holds {_shapes_text(extra)} that {spec.architecture} has no place for")
        if lacking:
            parts.append(
                f"lacks {_shapes_text(lacking)} (embedding, final norm, LM head) that {spec.architecture} needs"
            )
        return "outside the decoder layers the checkpoint " + " and ".join(parts)
    return None


def _config_problem(
    spec: ArchSpec, sizes: Sizes, config: Mapping[str, Any], tensors: Mapping[str, Sequence[int]]
) -> str | None:
    cfg = _text_config(config)
    for key, allowed in spec.supports.items():
        if key in cfg and cfg[key] not in allowed:
            return f"config.json's {key} is {cfg[key]!r}; {spec.architecture} supports {', '.join(map(repr, allowed))}"
    dims = sizes.dims()
    absent = [SYMBOLS[s] for s in spec.needs if dims.get(s) is None]
    if absent:  # a mixture of experts for a dense config: say what the checkpoint holds instead
        by_name, _ = compare_names(spec, sizes, tensors)
        held = f"; {by_name[0]}" if by_name else ""
        return f"{spec.architecture} needs {' and '.join(absent)} in config.json, which has none{held}"
    if spec.layer and any("i" in t.shape for t in spec.layer) and sizes.intermediate is None:
        aliases = SIZE_KEYS["intermediate_size"]
        return f"config.json gives no {aliases[0]} (nor {', '.join(aliases[1:])})"
    return None


def match_architecture(
    spec: ArchSpec, sizes: Sizes, config: Mapping[str, Any], tensors: Mapping[str, Sequence[int]], how: str
) -> TwinMatch | str:
    """``spec`` as the twin of this checkpoint, or its first disagreement (one line)."""
    problem = _config_problem(spec, sizes, config, tensors)
    if problem is not None:
        return problem
    by_name, found = compare_names(spec, sizes, tensors)
    if not by_name:
        return TwinMatch(spec.architecture, spec.model_type, how, "same", sizes)
    structural = compare_structure(spec, sizes, tensors)
    if structural is None:
        example = next(iter(n for n in tensors if n not in expected_tensors(spec, sizes)), "")
        note = (
            f"the tensor names differ from {spec.architecture}'s ({example!r} is not one of its names): "
            "both runs load random weights (load_format=dummy); the speed compares, the outputs do not"
        )
        return TwinMatch(spec.architecture, spec.model_type, how, "dummy", sizes, [note])
    # the readable reason: by name where the checkpoint mostly has this architecture's names
    return by_name[0] if found >= 0.5 else structural


_LAYER_GROUP = re.compile(r"^(.*?)layers\.\d+\.")
_ENCODER_GROUP = re.compile(r"vision|visual|image|audio|video|projector|encoder")


def decoder_part(tensors: Mapping[str, Sequence[int]]) -> tuple[dict[str, Sequence[int]], str | None]:
    """A multimodal checkpoint's language model under a text model's names, and the prefix it
    sat under; (the tensors, None) for a text checkpoint. The language model is the prefix
    before ``layers.N.`` that most tensors share, of those not named like an encoder's (a vision
    tower's ``vision_tower.encoder.layers.N.``): ``language_model.model.`` (the layout
    transformers wrote before 4.52: ``language_model.`` is a causal LM) or
    ``model.language_model.`` (after: the decoder itself, the LM head at the root)."""
    groups: dict[str, int] = {}
    for name in tensors:
        m = _LAYER_GROUP.match(name)
        if m is not None:
            groups[m.group(1)] = groups.get(m.group(1), 0) + 1
    decoders = {g: n for g, n in groups.items() if not _ENCODER_GROUP.search(g)}  # not a vision/audio encoder's
    if not decoders:
        return dict(tensors), None
    group = max(decoders, key=lambda g: decoders[g])
    if group in ("model.", "transformer.", ""):
        return dict(tensors), None
    out: dict[str, Sequence[int]] = {}
    if group.endswith(".model."):  # a causal LM under a prefix (language_model.model.): strip the prefix
        root = group[: -len("model.")]
        for name, shape in tensors.items():
            if name.startswith(root):
                out[name[len(root) :]] = shape
        return out, root
    for name, shape in tensors.items():  # the decoder under a prefix, its head at the root
        if name.startswith(group):
            out["model." + name[len(group) :]] = shape
        elif name == LM_HEAD.name:
            out[name] = shape
    return out, group


# a quantized checkpoint's tensors beside each weight (compressed-tensors, fp8, GPTQ-style packing)
QUANT_AUX_SUFFIXES = (
    ".weight_scale",
    ".weight_zero_point",
    ".weight_g_idx",
    ".weight_shape",
    ".weight_global_scale",
    ".input_scale",
    ".input_zero_point",
    ".input_global_scale",
    ".output_scale",
)


def unquantized_layout(
    tensors: Mapping[str, Sequence[int]], config: Mapping[str, Any]
) -> tuple[dict[str, Sequence[int]], str | None]:
    """A quantized checkpoint's tensors as the unquantized model's layout (what the architectures
    are matched by): scales, zero points and shapes left out, a packed weight (``weight_packed``,
    int32 holding 32 / bits values per element) at its unpacked shape; and the quantization method
    (None, the tensors as they are, for a checkpoint without ``quantization_config``)."""
    qc = _text_config(config).get("quantization_config") or config.get("quantization_config")
    if not isinstance(qc, Mapping):
        return dict(tensors), None
    bits = 4
    for group in (qc.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int) and weights["num_bits"] > 0:
            bits = weights["num_bits"]
            break
    out: dict[str, Sequence[int]] = {}
    for name, shape in tensors.items():
        if name.endswith(QUANT_AUX_SUFFIXES):
            continue
        if name.endswith(".weight_packed") and len(shape) == 2:
            out[name.removesuffix("_packed")] = [shape[0], shape[1] * (32 // bits)]
        else:
            out[name] = shape
    return out, str(qc.get("quant_method") or "quantized")


def find_twin(
    tensors: Mapping[str, Sequence[int]], config: Mapping[str, Any], forced: str | None = None
) -> TwinMatch | NoTwin:
    """The in-tree architecture with this checkpoint's layout (``forced``: only that one).

    ``tensors``: checkpoint tensor name -> shape; ``config``: config.json. Architectures are
    tried in :data:`ARCHITECTURES` order (``auto`` entries only unless forced)."""
    tensors = {n: list(s) for n, s in tensors.items() if not n.endswith(IGNORED_SUFFIXES)}
    tensors, quantized = unquantized_layout(tensors, config)
    if forced is not None and forced not in BY_NAME:
        known = ", ".join(BY_NAME)
        return NoTwin(f"--twin {forced}: the doctor has no checkpoint layout for it (it knows {known})", bad_input=True)
    if not tensors:
        empty = (
            "no in-tree twin: the checkpoint has no readable safetensors tensors "
            "(the doctor matches by tensor names and shapes)"
        )
        return NoTwin(empty, bad_input=forced is not None)
    decoder, prefix = decoder_part(tensors)
    if prefix is not None:  # a multimodal checkpoint: the twin is its decoder's
        tensors = decoder
        if not tensors:
            return NoTwin(
                "no in-tree twin: the checkpoint's language model holds no tensors", bad_input=forced is not None
            )
    sizes, why = read_sizes(config, has_lm_head=LM_HEAD.name in tensors)
    if sizes is None:
        return NoTwin(f"no in-tree twin: {why}", bad_input=forced is not None)
    got = _find(tensors, config, sizes, forced)
    if quantized is not None and isinstance(got, TwinMatch):
        got.notes.append(
            f"a quantized checkpoint ({quantized}): the twin gets the same quantization_config, so both runs "
            "quantize the same layers the same way"
        )
    if prefix is not None and isinstance(got, TwinMatch):
        got.decoder_prefix = prefix
        got.weights = "dummy"  # the port's names are not the twin's: neither run loads the checkpoint
        got.notes.append(
            f"a multimodal checkpoint: the twin is its language model's ({prefix}* as {got.architecture}); the "
            "vision tower and projector have no twin here; both runs get text prompts (no images) and random "
            "weights (load_format=dummy): the A/B compares the decoders"
        )
    return got


def _find(
    tensors: Mapping[str, Sequence[int]], config: Mapping[str, Any], sizes: Sizes, forced: str | None
) -> TwinMatch | NoTwin:
    candidates = [BY_NAME[forced]] if forced else [a for a in ARCHITECTURES if a.auto]
    tried: dict[str, str] = {}
    for spec in candidates:
        got = match_architecture(spec, sizes, config, tensors, "forced" if forced else "auto")
        if isinstance(got, TwinMatch):
            if spec.note:
                got.notes.append(spec.note)
            own = [a for a in (config.get("architectures") or []) if isinstance(a, str)]
            if spec.architecture in own:
                got.notes.append(f"the model is {spec.architecture} itself: the A/B compares it with its own build")
            return got
        tried[spec.architecture] = got
    if forced:
        return NoTwin(f"--twin {forced} does not fit this checkpoint: {tried[forced]}", bad_input=True, tried=tried)
    closest = _closest(candidates, sizes, tensors, tried)
    names = ", ".join(tried)
    return NoTwin(
        f"no in-tree twin: the tensor layout matches none of {names} ({closest}: {tried[closest]})", tried=tried
    )


def _closest(
    candidates: list[ArchSpec], sizes: Sizes, tensors: Mapping[str, Sequence[int]], tried: Mapping[str, str]
) -> str:
    """The architecture whose names the checkpoint shares most (the first on a tie)."""

    def share(spec: ArchSpec) -> float:
        expected = expected_tensors(spec, sizes)
        have = sum(1 for n in expected if n in tensors)
        return have / max(1, len(set(expected) | set(tensors)))

    return max((c for c in candidates if c.architecture in tried), key=share).architecture


def twin_config(match: TwinMatch, config: Mapping[str, Any]) -> dict[str, Any]:
    """The twin's config.json: its ``architectures`` and ``model_type``, the port's sizes under
    the architecture's names, and the port's rotary, token-id, dtype and quantization settings."""
    spec, s = BY_NAME[match.architecture], match.sizes
    cfg = _text_config(config)
    out: dict[str, Any] = {
        "architectures": [spec.architecture],
        "model_type": spec.model_type,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "vocab_size": s.vocab,
        "tie_word_embeddings": s.tie,
    }
    if s.intermediate is not None:
        out["intermediate_size"] = s.intermediate
    if "e" in spec.needs:
        experts_key, mlp_key = spec.expert_keys
        out[experts_key] = s.experts
        if mlp_key is not None:
            out[mlp_key] = s.moe_intermediate
    if "s" in spec.needs:
        out["shared_expert_intermediate_size"] = s.shared_intermediate
    if s.eps is not None:
        out["rms_norm_eps"] = s.eps
    if s.max_positions is not None:
        out["max_position_embeddings"] = s.max_positions
    for key in COMMON_COPY + spec.copy:
        if key in cfg:
            out[key] = cfg[key]
        elif key in config:
            out[key] = config[key]
    out.update(spec.config)
    return out
