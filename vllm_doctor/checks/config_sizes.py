"""VD309: the model sizes of config.json, and every NaN / Infinity in it.

Read in the fast pass (no vLLM import); :func:`config_size_problems` also keeps the weights pass
and the engine stage from building a model out of absurd sizes (stages/weights.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, capped_findings, check
from vllm_doctor.checks.weights_base import SUB_CONFIGS
from vllm_doctor.facts.config_bounds import (
    VISION_CONFIGS,
    VISION_LIMITS,
    size_problem,
    vision_size_problems,
)
from vllm_doctor.facts.config_bounds import shown as _shown
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage

# VD309: the sizes a model is built from; each must be a positive whole number below a plausibility bound
SIZE_LIMITS: dict[str, int] = {
    "num_hidden_layers": 10_000,
    "hidden_size": 1 << 20,
    "num_attention_heads": 1 << 16,
    "num_key_value_heads": 1 << 16,
    "vocab_size": 1 << 24,
    "intermediate_size": 1 << 22,
    # a mixture-of-experts decoder's (where config.json sets them): the experts and the top-k routed to
    "num_local_experts": 1 << 16,
    "num_experts": 1 << 16,
    "n_routed_experts": 1 << 16,
    "num_experts_per_tok": 1 << 16,
    "moe_intermediate_size": 1 << 22,
}
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# sizes that some in-tree configs give per layer, as a list (Gemma 3n's intermediate_size, OpenELM's heads)
PER_LAYER = frozenset(("intermediate_size", "num_key_value_heads", "num_attention_heads", "moe_intermediate_size"))
MAX_PARAMETERS = 10**15  # the largest published models have a few 10**12
# a per-layer description of the layers (a hybrid's pattern, a layer-type list): its length is a layer count
LAYER_PATTERNS = ("hybrid_override_pattern", "layers_block_type", "layer_types")


def _size_problem(key: str, value: Any, limits: dict[str, int] = SIZE_LIMITS) -> str | None:
    """Why ``value`` cannot be the size ``key`` (under ``limits``), or None."""
    return size_problem(key, value, limits)


def _pattern_problems(prefix: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """A layer pattern / layer-type list that names more layers than num_hidden_layers may be: vLLM's
    hybrid models build one layer per entry, whatever num_hidden_layers says."""
    limit = SIZE_LIMITS["num_hidden_layers"]
    out = []
    for key in LAYER_PATTERNS:
        value = cfg.get(key)
        if isinstance(value, (str, list)) and len(value) > limit:
            out.append(
                {
                    "key": prefix + key,
                    "value": _shown(value),
                    "why": f"names {len(value):,} layers: over {limit:,}, vllm-doctor's plausibility limit for "
                    "num_hidden_layers",
                    "hint": f"write one entry per layer the model has (num_hidden_layers of them) in {key}",
                }
            )
    return out


def _parameter_estimate(sizes: dict[str, int]) -> int | None:
    """Roughly how many parameters a decoder with these sizes has (None without hidden_size)."""
    hidden = sizes.get("hidden_size")
    if hidden is None:
        return None
    inter = sizes.get("intermediate_size", 4 * hidden)
    layers = sizes.get("num_hidden_layers", 1)
    return layers * (4 * hidden * hidden + 3 * hidden * inter) + 2 * sizes.get("vocab_size", 0) * hidden


def config_size_problems(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The model sizes of config.json (and of its text_config / llm_config / language_config)
    that no model can be built from. Each: key (dotted), value (as config.json spells it), why."""
    scopes = [("", config)] + [(f"{name}.", config[name]) for name in SUB_CONFIGS if isinstance(config.get(name), dict)]
    out: list[dict[str, Any]] = []
    for prefix, cfg in scopes:
        out.extend(_pattern_problems(prefix, cfg))
        sizes: dict[str, int] = {}
        for key in SIZE_LIMITS:
            value = cfg.get(key)
            if value is None:  # absent, or null: the config class's default applies
                continue
            if isinstance(value, list) and value and key in PER_LAYER:
                # a size per layer (Gemma 3n's intermediate_size, OpenELM's KV heads): each item a size
                bad = [(i, why) for i, item in enumerate(value) if (why := _size_problem(key, item)) is not None]
                if not bad:
                    sizes[key] = max(value)
                for i, why in bad[:3]:
                    out.append({"key": f"{prefix}{key}[{i}]", "value": _shown(value[i]), "why": why})
                continue
            why = _size_problem(key, value)
            if why is None:
                sizes[key] = value
            else:
                out.append({"key": prefix + key, "value": _shown(value), "why": why})
        experts = next((sizes[k] for k in EXPERT_COUNT_KEYS if k in sizes), None)
        top_k = sizes.get("num_experts_per_tok")
        if experts is not None and top_k is not None and top_k > experts:
            out.append(
                {
                    "key": prefix + "num_experts_per_tok",
                    "value": _shown(top_k),
                    "why": f"routes each token to more experts than the {experts} there are",
                }
            )
        total = _parameter_estimate(sizes)
        if total is not None and total > MAX_PARAMETERS:
            out.append(
                {
                    "key": prefix.rstrip(".") or "sizes",
                    "value": ", ".join(f"{k} {v}" for k, v in sizes.items()),
                    "why": f"these sizes make a model of about {total:.1e} parameters (over {MAX_PARAMETERS:.0e})",
                }
            )
    return out + vision_size_problems(config)


# a float setting in which Infinity is as wrong as NaN: a norm's epsilon, rope's base and scaling, dropout
FLOAT_SETTING = re.compile(r"(eps|epsilon|theta|factor|dropout|pdrop|initializer_range|mscale|beta_fast|beta_slow)$")


def config_non_finite(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every NaN / Infinity / -Infinity number anywhere in config.json (Python's json reads them;
    JSON has no such values), in file order. Each: key (dotted, ``[i]`` for list items), value,
    why, severity ("error": NaN anywhere, Infinity in a float setting; "warn": Infinity elsewhere).
    The model sizes are :func:`config_size_problems`'s and ``architectures`` VD108's: not here."""
    skipped = {
        "architectures",
        *SIZE_LIMITS,
        *(f"{sub}.{key}" for sub in SUB_CONFIGS for key in SIZE_LIMITS),
        *(f"{sub}.{key}" for sub in VISION_CONFIGS for key in VISION_LIMITS),
    }
    out: list[dict[str, Any]] = []
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:  # iterative: parse_json bounds the depth, this bounds nothing else
        key, value = stack.pop()
        if key in skipped:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            name = key.rsplit(".", 1)[-1].split("[", 1)[0]
            nan = math.isnan(value)
            error = nan or bool(FLOAT_SETTING.search(name))
            if nan:
                why = "is not a number: every computation it enters gives NaN"
            elif error:
                why = f"is not a finite number: {name} must be one (the model would compute inf/NaN)"
            else:
                why = "is not a finite number; check it is meant (strict JSON readers reject config.json)"
            out.append({"key": key, "value": _shown(value), "why": why, "severity": "error" if error else "warn"})
        elif isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return out


def config_sizes_present(config: dict[str, Any]) -> bool:
    scopes = [config] + [config[name] for name in SUB_CONFIGS if isinstance(config.get(name), dict)]
    vision = [config[name] for name in VISION_CONFIGS if isinstance(config.get(name), dict)]
    return any(cfg.get(key) is not None for cfg in scopes for key in (*SIZE_LIMITS, *LAYER_PATTERNS)) or any(
        cfg.get(key) is not None for cfg in vision for key in VISION_LIMITS
    )


@check(
    "VD309",
    "config-size-invalid",
    (
        "A model size in config.json (layers, hidden size, heads, KV heads, vocabulary, MLP size) is zero, negative, "
        "not a whole number, NaN/Infinity or absurdly large; or another number in it (rope_theta, rms_norm_eps, ...) "
        "is NaN/Infinity."
    ),
    severity=Severity.ERROR,
    also=(Severity.WARN,),
    stage=Stage.STATIC,
    topic="config",
    what=(
        "num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, vocab_size and intermediate_size "
        "(in config.json and in its text_config / llm_config / language_config) must be positive whole numbers, and "
        "so must a mixture-of-experts decoder's expert count (num_local_experts / num_experts / n_routed_experts), "
        "its top-k (num_experts_per_tok, at most the expert count) and moe_intermediate_size where config.json sets "
        "them. "
        f"vllm-doctor also flags values over a plausibility limit (e.g. {SIZE_LIMITS['num_hidden_layers']:,} layers) "
        f"and sizes that multiply to more than {MAX_PARAMETERS:.0e} parameters; the model is not built (the weights "
        "pass and the engine stage are not started) when a size is wrong. Any other number of config.json that is "
        "NaN is an error, and so is Infinity in a float setting (an epsilon, rope_theta, a factor, a dropout); "
        "Infinity elsewhere is a warning. Read in the fast pass: no vLLM import."
    ),
    why=(
        "Nothing bounds these sizes up front: transformers 5.19's LlamaConfig accepts num_hidden_layers -1, "
        "vocab_size 0 and num_hidden_layers 10**18 (it rejects floats, strings and booleans, but only once vLLM "
        "builds the config; a custom config class accepts anything). The mistake surfaces while the model is built, "
        "far from config.json, or the build runs out of memory or time. vLLM 0.32 and transformers 5.19 load "
        '"rope_theta": Infinity or "rms_norm_eps": NaN without a word; the outputs are then wrong (a NaN epsilon '
        "makes every norm NaN)."
    ),
    example=(
        '"num_hidden_layers": 32.0, "vocab_size": 0, "hidden_size": NaN, "num_hidden_layers": '
        '1000000000000000000 (10**18), or "rms_norm_eps": NaN'
    ),
    fix=(
        "Write the sizes the checkpoint was trained with as plain integers (config.save_pretrained does); a NaN, a "
        "zero or a huge number usually means config.json was edited by hand or generated by a broken script."
    ),
)
def config_size_invalid(facts: Facts, emit: Emit) -> Iterable[Finding]:
    non_finite = config_non_finite(facts.config)
    if not config_sizes_present(facts.config) and not non_finite:
        yield emit.not_applicable(f"config.json sets none of {', '.join(SIZE_LIMITS)} and holds no NaN/Infinity")
        return
    problems = config_size_problems(facts.config)
    findings = [
        emit.fail(
            f"{p['key']} = {p['value']}: {p['why']}",
            f"config.json:{p['key']}",
            {"key": p["key"], "value": p["value"], "problem": p["why"], "kind": "size"},
            p.get("hint", "write the size the model was trained with as a positive integer"),
        )
        for p in problems
    ]
    for p in non_finite:
        evidence = {"key": p["key"], "value": p["value"], "problem": p["why"], "kind": "not-finite"}
        hint = "write the value the model was trained with (config.save_pretrained writes finite numbers)"
        message, subject = f"{p['key']} = {p['value']}: {p['why']}", f"config.json:{p['key']}"
        if p["severity"] == "error":
            findings.append(emit.fail(message, subject, evidence, hint))
        else:
            findings.append(emit.warn(message, subject, evidence, hint, severity=Severity.WARN))
    yield from capped_findings(findings, emit, "numbers of config.json that are wrong")
    if not findings:
        yield emit.ok("the model sizes in config.json are positive whole numbers of plausible size", "config.json")
