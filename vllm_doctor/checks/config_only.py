"""What ``check --fast`` tells from config.json alone for checks that otherwise need the import pass.

The full check asks vLLM: VD111 loads config.json the way ``vllm serve`` does, VD112 asks the config
it loaded where the vision tower's settings are, VD211 builds the multimodal processor's dummy
inputs, VD301 builds the model and follows ``load_weights``. Some of their findings are plain
from config.json and the tables read from vLLM's and transformers' source; ``--fast`` (no vLLM
import) gives those under the same codes (:func:`~vllm_doctor.checks.base.from_config`), each
saying what vLLM does with it (vLLM 0.32, CPU build, transformers 5). The full check never runs
these: vLLM's own answer replaces them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, from_config, shown
from vllm_doctor.checks.weights_base import text_config
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding

FAST = "check --fast: read from config.json, vLLM not imported"
TOKEN_ID_FIELDS = ("image_token_index", "image_token_id")
TOKEN_ID_LIMIT = 2**32  # the tokenizers library holds a token id in 32 bits
# vLLM's in-tree MoE classes -> config.json's expert count (their transformers config class fills a
# default when it is missing: Mixtral's 8, Qwen2-MoE's 60, DeepSeek-V2's None, ...)
MOE_EXPERT_FIELDS: dict[str, str] = {
    "MixtralForCausalLM": "num_local_experts",
    "PhiMoEForCausalLM": "num_local_experts",
    "GraniteMoeForCausalLM": "num_local_experts",
    "GptOssForCausalLM": "num_local_experts",
    "MiniMaxText01ForCausalLM": "num_local_experts",
    "Qwen2MoeForCausalLM": "num_experts",
    "Qwen3MoeForCausalLM": "num_experts",
    "OlmoeForCausalLM": "num_experts",
    "DeepseekV2ForCausalLM": "n_routed_experts",
    "DeepseekV3ForCausalLM": "n_routed_experts",
    "Glm4MoeForCausalLM": "n_routed_experts",
    "Ernie4_5_MoeForCausalLM": "moe_num_experts",
}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


@from_config("VD111")
def config_rejected_from_config(facts: Facts, emit: Emit) -> Iterable[Finding]:
    """A ``quantization_config`` vLLM cannot read, an image token id that is not an integer."""
    config = facts.config
    quant = config.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        kind = _type_name(quant)
        yield emit.fail(
            f"config.json's quantization_config is a {kind}, not an object: vLLM refuses config.json as it loads it "
            f"(`AttributeError: '{kind}' object has no attribute 'to_dict'`)",
            "config.json:quantization_config",
            {"value": shown(quant), "from": FAST},
            'write the quantization_config object the quantizing tool wrote ({"quant_method": ..., ...}), or '
            "leave it out for an unquantized checkpoint",
        )
    elif isinstance(quant, dict):
        yield from _unknown_quant_method(facts, quant, emit)
    if facts.model_type is None or facts.transformers_model_types is None:
        return
    if facts.model_type not in facts.transformers_model_types:
        return  # a config class of the model's own may take any value: the import pass decides
    for field in TOKEN_ID_FIELDS:
        value = config.get(field)
        if isinstance(value, float | str):
            yield emit.fail(
                f"config.json's {field} is {shown(value)}, not an integer: transformers' {facts.model_type} config "
                f"class refuses it as vLLM loads config.json (`Field '{field}' expected int, got {_type_name(value)}`)",
                f"config.json:{field}",
                {"value": shown(value), "from": FAST},
                f"set {field} to the tokenizer's id of the image token",
            )


def _unknown_quant_method(facts: Facts, quant: dict[str, Any], emit: Emit) -> Iterable[Finding]:
    method = quant.get("quant_method")
    known = facts.quantization_methods
    if not isinstance(method, str) or not method or known is None or facts.plugin_quantization_methods is None:
        return  # no name, or the names vLLM and the plugins know are not all read: the import pass decides
    names = {m.lower() for m in [*known, *facts.plugin_quantization_methods]}
    if method.lower() in names:
        return
    yield emit.fail(
        f"config.json's quantization_config names quant_method {method!r}, which vLLM does not know: vLLM refuses "
        f"config.json (`Unknown quantization method: {method}`)",
        "config.json:quantization_config.quant_method",
        {"quant_method": method, "known": sorted(names), "from": FAST},
        "write the method of the tool that quantized the checkpoint (one of vLLM's, or one a plugin registers with "
        "register_quantization_config)",
    )


@from_config("VD112")
def vision_config_missing_from_config(facts: Facts, emit: Emit) -> Iterable[Finding]:
    """transformers' config class declares a ``vision_config`` that config.json leaves out."""
    subs = facts.hf_sub_configs
    if not subs or "vision_config" not in subs or isinstance(facts.config.get("vision_config"), dict):
        return
    yield emit.fail(
        f"config.json has no vision_config: transformers' {facts.model_type} config class builds a default one, "
        "and vLLM builds that vision tower, not the checkpoint's",
        "config.json",
        {"source": "vision_config", "model_type": facts.model_type, "from": FAST},
        "put the checkpoint's vision settings in config.json (its vision_config)",
    )


@from_config("VD211")
def token_id_out_of_range_from_config(facts: Facts, emit: Emit) -> Iterable[Finding]:
    """An image token id no tokenizer holds: vLLM's dummy inputs fail at engine start."""
    for field in TOKEN_ID_FIELDS:
        value = facts.config.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or 0 <= value < TOKEN_ID_LIMIT:
            continue
        side = "small" if value < 0 else "large"
        yield emit.fail(
            f"config.json's {field} is {value}, not a token id: vLLM fails at engine start, building its dummy "
            f"inputs (the tokenizer: `OverflowError: number too {side} to fit in target type`)",
            f"config.json:{field}",
            {"value": value, "from": FAST},
            f"set {field} to the tokenizer's id of the image token",
        )


@from_config("VD301")
def experts_not_filled_from_config(facts: Facts, emit: Emit) -> Iterable[Finding]:
    """vLLM's own MoE class on a config.json without its expert count and a checkpoint without experts."""
    archs = facts.architectures
    arch = archs[0] if archs else None
    field = MOE_EXPERT_FIELDS.get(arch or "")
    builtin = (facts.builtin_archs or {}).get(arch or "")
    if arch is None or field is None or builtin is None or (facts.registry or {}).get(arch) != builtin:
        return  # not vLLM's own MoE class (a plugin's replaces it: the weights pass decides)
    if field in text_config(facts.config) or field in facts.config:
        return
    checkpoint = facts.checkpoint
    if checkpoint is None or not checkpoint.complete or not checkpoint.tensors:
        return
    if any("expert" in t.name for t in checkpoint.tensors):
        return
    yield emit.fail(
        f"config.json names vLLM's MoE class {arch} but has no {field}: its config class fills in a default "
        f"expert count, vLLM builds that many experts in every MoE layer, and no checkpoint tensor fills them "
        f"(the checkpoint's {len(checkpoint.tensors)} tensors hold no expert)",
        f"config.json:{field}",
        {"architecture": arch, "field": field, "from": FAST},
        f"give config.json the checkpoint's {field}, or name the class the checkpoint was written for in "
        "`architectures`",
    )
