"""VD214-VD217: a hybrid model's state interfaces and layer pattern, an MLA port's latent, a mixer's prefix
(topic ``contract``).

A model with Mamba / linear-attention mixers keeps a fixed state per request that vLLM sizes
from the class before it builds the model; a hybrid's config says which layer is which. The
weights pass builds the model on the meta device and reads which token mixers it registered in
vLLM's forward context (its reply's ``mixers``, :class:`~vllm_doctor.facts.static.MixerRecord`) and
what its class declares (``state_interfaces``); the layer pattern is config.json's.

What vLLM 0.32 does with each mistake (examples/hybrid, tests/engine/test_hybrid_ground_truth.py):
no ``IsHybrid``: a bare ``AssertionError`` (``assert mamba_block_size is not None``) while it sets
up the KV cache; no ``get_mamba_state_shape_from_config``: ``TypeError: 'NoneType' object is not
iterable`` while it computes the page size; a pattern the model does not build: weights that
load nowhere (``There is no module or parameter named ...``) or, with dummy weights, another model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, capped_findings, check
from vllm_doctor.checks.weights_base import text_config
from vllm_doctor.facts import wire
from vllm_doctor.facts.mixers import STATE_METHODS, prefix_matches
from vllm_doctor.facts.static import AttentionReading, Facts, MixerRecord, WeightLoad
from vllm_doctor.model import Finding, Severity, Stage

# a module path's decoder layer index (checks/moe.py's; importing moe here would register its checks before
# their gates)
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")

# Nemotron-H's letters (vLLM's nemotron_h: ALL_DECODER_LAYER_TYPES): M Mamba 2, * attention, - MLP, E MoE
PATTERN_LETTERS = {"M": "state", "*": "attention", "-": None, "E": None}
LETTER_NAMES = {"M": "a Mamba 2 mixer", "*": "attention", "-": "an MLP", "E": "a mixture of experts"}
FAMILY_NAMES = {"state": "a Mamba / linear-attention mixer", "attention": "attention", "mla": "MLA attention"}


def _layer(path: str | None) -> int | None:
    match = LAYER_INDEX.search(path or "")
    return int(match.group(1)) if match else None


def _reply(facts: Facts) -> WeightLoad:
    """The weights pass's reply, an empty one where it did not run: the mixers are there whenever
    the model was built, whether or not load_weights then ran."""
    return facts.weights_reply() or WeightLoad()


def _model_class(load: WeightLoad) -> str | None:
    """The built model's class ("module.Class"), or None."""
    return load.model.class_name if load.model is not None else None


def _where(m: MixerRecord) -> str | None:
    """A mixer's place in the model, else the name it registered under."""
    return m.path or m.prefix


@check(
    "VD214",
    "hybrid-interface-missing",
    "A model with Mamba / linear-attention mixers does not declare vLLM's state interfaces.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "The weights pass builds the model on the meta device and reads the token mixers it registers. A model with "
        "a state mixer (vLLM's MambaMixer / MambaMixer2, linear attention, Gated DeltaNet, short convolution: a "
        "`MambaBase`) must declare `HasInnerState`, and `IsHybrid` when it also has attention (`IsAttentionFree` "
        "when it has none), and give the state's shapes and dtypes as class methods "
        "(`get_mamba_state_shape_from_config`, `get_mamba_state_dtype_from_config`)."
    ),
    why=(
        "vLLM sizes the state cache from the class before it builds the model. Without `IsHybrid` vLLM 0.32 stops "
        "while it sets up the KV cache with a bare `AssertionError` (`assert mamba_block_size is not None`); "
        "without the shape method, with `TypeError: 'NoneType' object is not iterable`: neither names the class."
    ),
    example="class MyHybridForCausalLM(nn.Module, HasInnerState):   # Mamba 2 and attention layers, no IsHybrid",
    fix=(
        "Declare `IsHybrid` (or `IsAttentionFree`) and `HasInnerState` from `vllm.model_executor.models.interfaces` "
        "and define the two class methods as vLLM's own Nemotron-H does (MambaStateShapeCalculator / "
        "MambaStateDtypeCalculator from `vllm.model_executor.layers.mamba.mamba_utils`)."
    ),
    references=("vllm/model_executor/models/interfaces.py:IsHybrid", "vllm/model_executor/models/nemotron_h.py"),
    requires=("weights-pass",),
)
def hybrid_interface_missing(facts: Facts, emit: Emit) -> Iterable[Finding]:
    load = _reply(facts)
    mixers, declared = load.mixers, load.state_interfaces
    if mixers is None or declared is None:
        yield emit.skip(load.mixers_error or "the weights pass did not build the model")
        return
    state = [m for m in mixers if m.family == "state"]
    if not state:
        yield emit.not_applicable("no Mamba / linear-attention mixer in the built model")
        return
    attention = [m for m in mixers if m.family in ("attention", "mla")]
    first = _where(state[0]) or "?"
    where = ", ".join(str(_where(m)) for m in state[:3]) + (f" and {len(state) - 3} more" if len(state) > 3 else "")
    missing: list[str] = []
    if not declared.has_inner_state:
        missing.append("HasInnerState")
    if attention and not declared.is_hybrid:
        missing.append("IsHybrid (it has attention too)")
    if not attention and not (declared.is_hybrid or declared.is_attention_free):
        missing.append("IsAttentionFree (or IsHybrid)")
    methods = declared.methods or {}
    missing += [f"the class method {m}" for m in STATE_METHODS if not methods.get(m)]
    evidence = {
        "state_mixers": [m.path for m in state],
        "declared": wire.write(declared),  # a finding's evidence is report.json's
        "attention_layers": len(attention),
    }
    if missing:
        yield emit.fail(
            f"the model builds {len(state)} state mixer(s) ({where}: {state[0].class_name}) but its class lacks "
            + "; ".join(missing),
            first,
            evidence,
            "declare IsHybrid / HasInnerState and define get_mamba_state_shape_from_config and "
            "get_mamba_state_dtype_from_config, as vLLM's Nemotron-H does",
        )
    else:
        kind = "IsHybrid" if attention else ("IsAttentionFree" if declared.is_attention_free else "IsHybrid")
        yield emit.ok(
            f"{len(state)} state mixer(s) beside {len(attention)} attention layer(s): the class declares "
            f"{kind}, HasInnerState and the state's shape and dtype methods",
            first,
            evidence,
        )


def pattern_of(config: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """config.json's layer pattern (the language model's): (key, one entry a layer)."""
    cfg = text_config(config)
    for key in ("hybrid_override_pattern", "layers_block_type", "layer_types"):
        value = cfg.get(key)
        if isinstance(value, str) and key == "hybrid_override_pattern":
            return key, list(value)
        if isinstance(value, list):
            return key, value
    return None


def expected_family(key: str, entry: Any) -> tuple[bool, str | None]:
    """(known, family) of one pattern entry: Nemotron-H's letters, or a layer type's name
    (``full_attention``, ``sliding_attention``, ``linear_attention``, ``mamba``, ``conv``, ...)."""
    if key == "hybrid_override_pattern":
        return (entry in PATTERN_LETTERS, PATTERN_LETTERS.get(entry))
    if not isinstance(entry, str):
        return False, None
    name = entry.lower()
    if "linear" in name or "mamba" in name or name in ("conv", "short_conv", "gdn"):
        return True, "state"
    if "attention" in name:
        return True, "attention"
    return True, None  # a kind the doctor does not tell apart ("hybrid", "mlp", ...): not compared


def pattern_problems(config: dict[str, Any]) -> list[dict[str, Any]]:
    """What is malformed in config.json's layer pattern itself: an entry of no known kind
    (``hybrid_override_pattern``'s letters), a length other than num_hidden_layers."""
    found = pattern_of(config)
    if found is None:
        return []
    key, entries = found
    out: list[dict[str, Any]] = []
    if key == "hybrid_override_pattern":
        for i, entry in enumerate(entries):
            if entry not in PATTERN_LETTERS:
                out.append(
                    {
                        "key": f"{key}[{i}]",
                        "message": f"{key}[{i}] is {entry!r}: no layer kind (M Mamba 2, * attention, - MLP, E MoE)",
                    }
                )
    layers = text_config(config).get("num_hidden_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers != len(entries):
        out.append(
            {
                "key": key,
                "message": f"{key} names {len(entries)} layer(s), num_hidden_layers is {layers}",
            }
        )
    return out[:8]


@check(
    "VD215",
    "layer-pattern-mismatch",
    "config.json's layer pattern is malformed, or the model does not build the layers it names.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "A hybrid's config says what each layer is (`hybrid_override_pattern`: M Mamba 2, * attention, - MLP, E MoE; "
        "`layers_block_type` or `layer_types`: one name a layer). Checks the pattern itself (known letters, one "
        "entry per layer) and, with the weights pass, that each layer builds the token mixer it names."
    ),
    why=(
        "A layer built as something else loads no weights of its kind (vLLM: `There is no module or parameter "
        "named ...`) or, with dummy weights, serves another model; a letter the model does not know stops its "
        "constructor with a bare KeyError."
    ),
    example='"hybrid_override_pattern": "M*X-"   # X: no layer kind',
    fix="Make the pattern name every layer once with a known kind, and build each layer as the pattern says.",
    references=("vllm/model_executor/models/nemotron_h.py:ALL_DECODER_LAYER_TYPES",),
)
def layer_pattern_mismatch(facts: Facts, emit: Emit) -> Iterable[Finding]:
    config = facts.config or {}
    found = pattern_of(config)
    if found is None:
        yield emit.not_applicable("config.json gives no layer pattern")
        return
    key, entries = found
    problems = [(p["message"], f"config.json:{p['key']}") for p in pattern_problems(config)]
    mixers = _reply(facts).mixers
    if mixers is not None:
        built: dict[int, set[str]] = {}
        for m in mixers:
            index = _layer(_where(m))
            if index is not None and m.family:
                built.setdefault(index, set()).add(m.family)
        for i, entry in enumerate(entries):
            known_kind, want = expected_family(key, entry)
            if not known_kind:
                continue
            have = built.get(i, set())
            if want is not None and want not in have and not (want == "attention" and "mla" in have):
                got = " and ".join(FAMILY_NAMES.get(f, f) for f in sorted(have)) or "no token mixer"
                problems.append(
                    (
                        f"layer {i}: {key} says {LETTER_NAMES.get(entry, repr(entry))}, the model builds {got} there",
                        f"model.layers.{i}",
                    )
                )
            elif want is None and have and key == "hybrid_override_pattern":
                problems.append(
                    (
                        f"layer {i}: {key} says {LETTER_NAMES.get(entry, repr(entry))}, the model builds "
                        f"{' and '.join(FAMILY_NAMES.get(f, f) for f in sorted(have))} there",
                        f"model.layers.{i}",
                    )
                )
    findings = [
        emit.fail(message, where, {"pattern_key": key, "pattern": entries[:64]}, "build each layer as the pattern says")
        for message, where in problems
    ]
    # one problem repeated per layer costs the report a constant (a pattern may hold 10,000 layers: VD309's bound)
    yield from capped_findings(findings, emit, f"layers where {key} and the model disagree")
    if not problems:
        compared = "and every layer builds what it names" if mixers is not None else "(the layers were not built)"
        yield emit.ok(f"{key}: {len(entries)} layer(s), each a known kind, {compared}", f"config.json:{key}")


@check(
    "VD216",
    "mla-latent-mismatch",
    "An MLA layer caches a latent of another width or rope dim than config.json's kv_lora_rank / qk_rope_head_dim, "
    "or vLLM does not read the model as MLA.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        'vLLM\'s MLA attention caches one latent "head" a token: `kv_lora_rank` values of the compressed KV and '
        "`qk_rope_head_dim` of the rotary key. The weights pass builds the model on the meta device and reads each "
        "MLA layer's two sizes; they must be config.json's (the checkpoint's `kv_a_proj_with_mqa` is "
        "`kv_lora_rank + qk_rope_head_dim` wide). vLLM must also read the model as MLA (`ModelConfig.use_mla`), "
        "which it decides from config.json's `model_type` alone: a fixed list of types (DeepSeek-V2/V3, Kimi, ...), "
        "or a convertor registered for the type in `MODEL_ARCH_CONFIG_CONVERTORS`."
    ),
    why=(
        "A port that hard-codes the sizes (DeepSeek-V2's 512 and 64 on a model with others) sizes the KV cache and "
        "the latent projections wrong: vLLM 0.32 fails to load the checkpoint (`Attempted to load weight "
        "(torch.Size([256])) into parameter (torch.Size([512]))`), or, with dummy weights, serves another model. A "
        "model type vLLM does not know for MLA builds, loads and starts, and its first request fails with "
        "`ValueError: Head dimension 32 is not supported by MLA.` (vLLM sizes the metadata by hidden_size / heads)."
    ),
    example="MLAAttention(..., kv_lora_rank=512, qk_rope_head_dim=64, ...)   # config.json: 256 and 32",
    fix=(
        "Pass `kv_lora_rank=config.kv_lora_rank` and `qk_rope_head_dim=config.qk_rope_head_dim`; for a model type of "
        "your own, register a convertor whose `is_deepseek_mla` is true in the plugin "
        "(examples/tiny_mla_plugin/tiny_mla_model/arch.py)."
    ),
    references=(
        "vllm/model_executor/layers/attention/mla_attention.py:MLAAttention",
        "vllm/transformers_utils/model_arch_config_convertor.py:is_deepseek_mla",
    ),
    requires=("weights-pass",),
)
def mla_latent_mismatch(facts: Facts, emit: Emit) -> Iterable[Finding]:
    load = _reply(facts)
    mixers = load.mixers
    if mixers is None:
        yield emit.skip(load.mixers_error or "the weights pass did not build the model")
        return
    mla = [m for m in mixers if m.kind == "mla"]
    if not mla:
        yield emit.not_applicable("no MLA layer in the built model")
        return
    cfg = text_config(facts.config or {})
    want = {k: cfg.get(k) for k in ("kv_lora_rank", "qk_rope_head_dim") if isinstance(cfg.get(k), int)}
    reading = load.attention_reading
    unread = mla_not_read_as_mla(mla, reading, _model_class(load))
    if unread is not None:
        yield emit.fail(
            unread,
            str(_where(mla[0])),
            {
                "attention_reading": wire.write(reading),
                "mla_layers": [m.path for m in mla],
            },
            "register a convertor for the model_type whose is_deepseek_mla() is true "
            "(vllm.transformers_utils.model_arch_config_convertor.MODEL_ARCH_CONFIG_CONVERTORS), as "
            "examples/tiny_mla_plugin/tiny_mla_model/arch.py does",
        )
    bad = 0
    for m in mla:
        latent = {"kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim}  # the config's keys
        wrong = {k: (latent[k], v) for k, v in want.items() if latent[k] is not None and latent[k] != v}
        if not wrong:
            continue
        bad += 1
        if bad > 8:
            continue
        text = ", ".join(f"{k} {have} (config.json: {cfg_v})" for k, (have, cfg_v) in wrong.items())
        yield emit.fail(
            f"{_where(m)}: MLA latent with {text}",
            str(_where(m)),
            {"layer": {**latent, "head_size": m.head_size}, "config": want},
            "pass kv_lora_rank and qk_rope_head_dim from config.json to the MLA layer",
        )
    if bad > 8:
        yield emit.fail(f"... and {bad - 8} more MLA layer(s) with the same mismatch", "model", {"layers": bad})
    if not bad and unread is None:
        sizes = ", ".join(f"{k} {v}" for k, v in want.items()) or "no latent sizes in config.json to compare"
        yield emit.ok(f"{len(mla)} MLA layer(s) cache config.json's latent ({sizes})", str(mla[0].path))


def mla_not_read_as_mla(
    mla: list[MixerRecord], reading: AttentionReading | None, model_class: str | None
) -> str | None:
    """Why vLLM will not run the built MLA layers as MLA, or None: vLLM read config.json's
    ``model_type`` as no MLA model (``use_mla`` false), so it sizes attention metadata by its
    ``get_head_size()`` (hidden_size / heads), not the latent. vLLM's own classes are left to vLLM
    (``VLLM_MLA_DISABLE`` makes them build no MLA layer)."""
    if reading is None or reading.use_mla is not False:
        return None
    if str(model_class or "").startswith("vllm."):
        return None
    first = mla[0]
    latent = first.head_size
    if latent is None and first.kv_lora_rank is not None:
        latent = first.kv_lora_rank + (first.qk_rope_head_dim or 0)
    sizes = f"kv_lora_rank {first.kv_lora_rank} + qk_rope_head_dim {first.qk_rope_head_dim}"
    head = reading.head_size
    sized = f"a head of {head}" if head is not None else "config.json's head size"
    said = f"; vLLM 0.32 fails the first request with 'Head dimension {head} is not supported by MLA.'"
    return (
        f"{_where(first)}: the model builds {len(mla)} MLA layer(s), but vLLM does not read model_type "
        f"{reading.model_type!r} as an MLA model (ModelConfig.use_mla is false): it sizes their attention "
        f"metadata by {sized}, not the latent's {latent} ({sizes})" + (said if head is not None else "")
    )


@check(
    "VD217",
    "mixer-prefix-mismatch",
    "A token mixer (attention, MLA, Mamba / linear attention) registered under a `prefix` that is not its place in "
    "the model, found before launch.",
    severity=Severity.WARN,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "Every token mixer registers itself in vLLM's forward context under the `prefix` its constructor was "
        "given; vLLM binds its KV cache or state, its quantization scales and its per-layer settings by that name. "
        "The weights pass builds the model on the meta device and reads each mixer's prefix beside the module path "
        "where it sits; the prefix must be that path, or a name under the module that holds it (vLLM's MLA wrapper "
        "registers `self_attn.attn` for `self_attn.mla_attn.mla_attn`). VD208 reads the same on the running engine."
    ),
    why=(
        'vLLM 0.32 runs a port whose MLA wrapper gets `f"{prefix}.attn"` with the same tokens and no warning '
        "(examples/mla/mla-wrong-prefix): nothing says the names are wrong until a quantized checkpoint's KV scales or "
        "a per-layer setting are looked up by them and miss, or two layers' names collide (`Duplicate layer name`)."
    ),
    example='self.mla_attn = MultiHeadLatentAttentionWrapper(..., prefix=f"{prefix}.attn")   # sits at .mla_attn',
    fix=(
        'Pass each mixer the module path it is assigned to: `self.mla_attn = ...(prefix=f"{prefix}.mla_attn")`, '
        'with the decoder layer built as `Layer(..., prefix=f"{prefix}.layers.{i}")`.'
    ),
    references=("vllm-project/vllm#18212", "vllm/forward_context.py"),
    requires=("weights-pass",),
)
def mixer_prefix_mismatch(facts: Facts, emit: Emit) -> Iterable[Finding]:
    load = _reply(facts)
    mixers = load.mixers
    if mixers is None:
        yield emit.skip(load.mixers_error or "the weights pass did not build the model")
        return
    if not mixers:
        yield emit.not_applicable("no token mixer registered in vLLM's forward context by the built model")
        return
    if str(_model_class(load) or "").startswith("vllm."):
        yield emit.ok(f"{len(mixers)} mixer(s) of vLLM's own model, registered by vLLM")
        return
    bad = [m for m in mixers if m.path and not prefix_matches(str(m.prefix), [str(m.path)])]
    for m in bad[:8]:
        yield emit.warn(
            f"{FAMILY_NAMES.get(str(m.family), 'a token mixer')} registered as {m.prefix!r} sits at {m.path!r}",
            str(m.path),
            {"prefix": m.prefix, "path": m.path, "class": m.class_name, "kind": m.kind},
            "pass the module's own path as prefix (thread `prefix` down from the model's constructor)",
        )
    if len(bad) > 8:
        yield emit.warn(
            f"... and {len(bad) - 8} more mixer(s) registered under another name", "model", {"layers": len(bad)}
        )
    if not bad:
        yield emit.ok(f"{len(mixers)} token mixer(s), each registered under a prefix of its own place in the model")
