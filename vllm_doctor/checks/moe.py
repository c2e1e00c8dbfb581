"""VD311-VD312: a mixture-of-experts model's experts against its checkpoint (the weights pass).

vLLM's fused-MoE layer holds every expert of a layer in one parameter per projection
(``w13_weight``: gate and up, ``w2_weight``: down) and loads it one checkpoint tensor at a time
through ``weight_loader(param, tensor, name, shard_id=..., expert_id=...)``, the call the model's
expert params mapping makes (``fused_moe_make_expert_params_mapping``, or the model's own
table). The weights pass records every such call: which checkpoint tensor went to which shard of
which expert. Element counts alone (VD301) cannot say which expert is missing, and a mapping that
swaps gate and up writes every element and leaves VD301 nothing to find.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, capped_findings, check, known
from vllm_doctor.facts.static import Facts, ParamLoad
from vllm_doctor.model import Finding, Severity, Stage

# the shards each fused-MoE projection is loaded with (vLLM's names: w1 gate, w3 up, w2 down)
SHARDS_OF = {"w13": ("w1", "w3"), "w2": ("w2",)}
# a checkpoint's expert tensor: its expert id and projection, in HF Mixtral (w1/w2/w3) and
# Qwen/DeepSeek (gate_proj/up_proj/down_proj) conventions
EXPERT_TENSOR = re.compile(r"experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.")
CONVENTION = {"w1": "w1", "gate_proj": "w1", "w3": "w3", "up_proj": "w3", "w2": "w2", "down_proj": "w2"}
ROLE = {"w1": "gate", "w3": "up", "w2": "down"}
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")
REFS = ("vllm/model_executor/layers/fused_moe/layer.py:FusedMoE.weight_loader",)


def _projection(param: str) -> str | None:
    """``w13`` or ``w2`` for a fused-MoE weight or its scales (``w13_weight``, ``w2_weight_scale``)."""
    leaf = param.rsplit(".", 1)[-1]
    for key in SHARDS_OF:
        if leaf.startswith(key + "_"):
            return key
    return None


def _moe_params(facts: Facts) -> dict[str, ParamLoad]:
    got = known(facts.usable_weights())
    return {n: p for n, p in got.params.items() if p.num_experts}


@check(
    "VD311",
    "moe-experts-not-loaded",
    "Experts of a fused-MoE layer that no checkpoint tensor fills, named by layer and expert.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "Each expert of a fused-MoE layer must get its gate (w1), up (w3) and down (w2) projection from the "
        "checkpoint through the expert params mapping. vllm-doctor records every call of the fused-MoE weight "
        "loader (expert id, shard id, checkpoint tensor) while it drives your `load_weights` on the meta device."
    ),
    why=(
        "vLLM counts every parameter of a layer with a quantization method, the fused experts included, as loaded: "
        "an expert the checkpoint lacks runs on uninitialised memory with no error or warning, and the tokens drift "
        "from the first request that routes to it (zeros, NaN or garbage from run to run)."
    ),
    example="checkpoint without model.layers.1.block_sparse_moe.experts.3.{w1,w2,w3}.weight",
    fix=(
        "re-export the checkpoint with every expert, or make the expert params mapping produce the checkpoint's "
        "names (num_experts from the config; ckpt_gate_proj_name / ckpt_down_proj_name / ckpt_up_proj_name as the "
        "checkpoint spells them)"
    ),
    references=REFS,
    requires=("checkpoint", "weights-load"),
)
def moe_experts_not_loaded(facts: Facts, emit: Emit) -> Iterable[Finding]:
    params = _moe_params(facts)
    if not params:
        yield emit.not_applicable("no fused-MoE layer (vLLM's FusedMoE) in the model")
        return
    # (layer, expert) -> shards never loaded, with the parameters they belong to
    missing: dict[tuple[int | None, int], list[str]] = {}
    checked = 0
    for name, p in params.items():
        projection = _projection(name)
        if projection is None:
            continue
        checked += 1
        loaded = {(e, s) for e, s, _ in p.expert_loads}
        for expert in range(p.num_experts or 0):
            for shard in SHARDS_OF[projection]:
                if (expert, shard) not in loaded:
                    found = LAYER_INDEX.search(name)
                    missing.setdefault((int(found.group(1)) if found else None, expert), []).append(shard)
    if not missing:
        yield emit.ok(f"every expert of {checked} fused-MoE parameter(s) is loaded (w1, w3, w2 per expert)")
        return
    experts = sum(p.num_experts or 0 for n, p in params.items() if _projection(n) == "w2")
    findings = []
    for (layer, expert), shards in sorted(missing.items(), key=lambda kv: (kv[0][0] or -1, kv[0][1])):
        where = f"layer {layer}, expert {expert}" if layer is not None else f"expert {expert}"
        order = [s for s in ("w1", "w3", "w2") if s in shards]
        findings.append(
            emit.fail(
                f"{where}: {', '.join(f'{s} ({ROLE[s]})' for s in order)} never loaded: vLLM runs that expert on "
                "uninitialised memory without a word",
                where,
                {"layer": layer, "expert": expert, "shards_missing": order},
                "add the expert's tensors to the checkpoint, or fix the expert params mapping's names",
            )
        )
    yield from capped_findings(findings, emit, f"experts never loaded (of {experts} in all)", total=len(findings))


@check(
    "VD312",
    "moe-expert-mapping-swapped",
    "The expert params mapping loads an expert tensor into another projection or expert than its name says.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "A checkpoint names each expert tensor by expert id and projection: `experts.{e}.w1` / `gate_proj` (gate), "
        "`w3` / `up_proj` (up), `w2` / `down_proj` (down). The fused-MoE weight loader must receive it with the same "
        "expert id and the shard id of that projection (`w1`, `w3`, `w2`)."
    ),
    why=(
        "Gate and up have the same shape, so a mapping that swaps them (or shifts expert ids) writes every element "
        "and loads without an error: vLLM runs silently and every token after the first MoE layer differs."
    ),
    example='("experts.w13_", f"experts.{e}.w1.", e, "w3")  # gate\'s tensor loaded as the up shard',
    fix=(
        "build the mapping with vLLM's helper, `fused_moe_make_expert_params_mapping(ckpt_gate_proj_name='w1', "
        "ckpt_down_proj_name='w2', ckpt_up_proj_name='w3', num_experts=...)` (gate_proj/down_proj/up_proj for "
        "Qwen-style checkpoints)"
    ),
    references=REFS,
    requires=("checkpoint", "weights-load"),
)
def moe_expert_mapping_swapped(facts: Facts, emit: Emit) -> Iterable[Finding]:
    params = _moe_params(facts)
    if not params:
        yield emit.not_applicable("no fused-MoE layer (vLLM's FusedMoE) in the model")
        return
    # (what the name says, what the loader got) -> the calls so
    wrong: dict[tuple[str, str], list[tuple[str, int, Any, int]]] = {}
    seen = 0
    for p in params.values():
        for expert, shard, tensor in p.expert_loads:
            match = EXPERT_TENSOR.search(str(tensor or ""))
            if match is None:
                continue
            seen += 1
            says_expert, says_shard = int(match.group(1)), CONVENTION[match.group(2)]
            if (says_expert, says_shard) != (expert, shard):
                key = (match.group(2), f"{shard}" if says_expert == expert else f"{shard} of expert {expert}")
                wrong.setdefault(key, []).append((str(tensor), says_expert, shard, expert))
    if not seen:
        yield emit.skip("no expert tensor named experts.<id>.<w1|w2|w3|gate_proj|up_proj|down_proj> was loaded")
        return
    if not wrong:
        yield emit.ok(f"{seen} expert tensor(s) loaded into the shard and expert their names say")
        return
    for (says, got), calls in sorted(wrong.items()):
        tensor, says_expert, shard, expert = calls[0]
        yield emit.fail(
            f"checkpoint tensors named experts.<e>.{says} ({ROLE[CONVENTION[says]]}) are loaded as shard {got} "
            f"({ROLE.get(str(shard), '?')}), {len(calls)} tensor(s), e.g. {tensor} -> expert {expert}, shard {shard}: "
            "vLLM loads them without an error and computes something else",
            tensor,
            {"named": says, "loaded_as": shard, "tensors": len(calls), "example": tensor, "expert": expert},
            f"map experts.<e>.{says} to shard {CONVENTION[says]} of expert <e> (fused_moe_make_expert_params_mapping)",
        )
