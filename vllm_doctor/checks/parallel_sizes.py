"""VD305: can config.json's sizes be split over the tensor- and pipeline-parallel sizes asked for?

Pure arithmetic on config.json, in the fast pass: vLLM splits attention heads, KV heads, the
MLP's intermediate features and the padded vocabulary over tensor-parallel ranks, and the decoder
layers over pipeline stages.

A mixture of experts (vLLM's FusedMoE, vllm/model_executor/layers/fused_moe): with tensor
parallelism only, every rank holds a slice of every expert (``FusedMoEConfig`` asserts
``intermediate_size % tp_size == 0``; the experts are not divided, whatever their number); with
``--enable-expert-parallel`` the experts are divided over the ranks and not sliced
(``determine_expert_map``: ``num_experts // ep_size`` each, the first ``num_experts % ep_size``
ranks one more), so an uneven split runs with a load imbalance. A shared expert is a dense MLP,
split by tensor parallelism either way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.config_sizes import EXPERT_COUNT_KEYS
from vllm_doctor.checks.weights_base import text_config
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage


def _int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def moe_sizes(config: dict[str, Any]) -> tuple[str, int, str, int | None] | None:
    """A mixture of experts' (expert-count key, experts, expert MLP size key, its size); None for a dense model.
    Mixtral's experts use ``intermediate_size``, Qwen-MoE's and DeepSeek's ``moe_intermediate_size``."""
    cfg = text_config(config)
    for key in EXPERT_COUNT_KEYS:
        experts = _int(cfg, key)
        if experts is not None and experts > 1:
            inter_key = "moe_intermediate_size" if _int(cfg, "moe_intermediate_size") else "intermediate_size"
            return key, experts, inter_key, _int(cfg, inter_key)
    return None


def _group_size(config: dict[str, Any]) -> int | None:
    """The weight group size of a compressed-tensors WNA16 (weight-only, group strategy) checkpoint."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "compressed-tensors":
        return None
    groups = quant.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        weights = group.get("weights") if isinstance(group, dict) else None
        if (
            isinstance(weights, dict)
            and weights.get("strategy") == "group"
            and not group.get("input_activations")
            and isinstance(weights.get("group_size"), int)
            and weights["group_size"] > 0
        ):
            return int(weights["group_size"])
    return None


def expert_split(experts: int, ranks: int) -> list[int]:
    """How many experts each expert-parallel rank holds (vLLM's determine_expert_map, linear placement)."""
    base, extra = divmod(experts, ranks)
    return [base + (1 if rank < extra else 0) for rank in range(ranks)]


def moe_problems(config: dict[str, Any], tp: int, ep: bool) -> list[dict[str, Any]]:
    """What vLLM's FusedMoE does with the experts at tensor-parallel size ``tp`` (with or without expert
    parallelism); empty for a dense model. The expert MLP size of a Mixtral-style config (``intermediate_size``)
    is checked by :func:`tp_problems`."""
    moe = moe_sizes(config)
    if moe is None or tp == 1:
        return []
    cfg = text_config(config)
    count_key, experts, inter_key, inter = moe
    out: list[dict[str, Any]] = []
    if not ep:
        if inter_key == "moe_intermediate_size" and inter is not None and inter % tp:
            out.append(
                {
                    "key": inter_key,
                    "value": inter,
                    "severity": "error",
                    "why": f"every expert's {inter} intermediate features cannot be split evenly over {tp} ranks "
                    "(with tensor parallelism only, FusedMoE slices each expert over the ranks)",
                    "vllm_error": "AssertionError (FusedMoEConfig: intermediate_size % tp_size == 0)",
                }
            )
        group = _group_size(config)
        if inter is not None and not inter % tp and group is not None and (inter // tp) % group:
            out.append(
                {
                    "key": inter_key,
                    "value": inter,
                    "severity": "error",
                    "why": f"each rank's slice of an expert, {inter // tp} intermediate features, is not a whole "
                    f"number of the checkpoint's quantization groups ({group})",
                    "vllm_error": "ValueError: CompressedTensors WNA16 MoE with static group scales requires the MoE "
                    f"intermediate size per tensor-parallel partition ({inter // tp}) to be divisible by group_size "
                    f"({group}). Scale groups would otherwise cross TP shard boundaries; use a compatible TP size or "
                    "enable expert parallelism.",
                }
            )
        if experts % tp:
            out.append(
                {
                    "key": count_key,
                    "value": experts,
                    "severity": "info",
                    "why": f"{experts} experts are not divided over the {tp} ranks: with tensor parallelism only, "
                    f"each rank holds a 1/{tp} slice of every expert, so the count does not matter "
                    f"(--enable-expert-parallel would divide them {' + '.join(map(str, expert_split(experts, tp)))})",
                    "vllm_error": "",
                }
            )
    else:
        split = expert_split(experts, tp)
        if experts < tp:
            out.append(
                {
                    "key": count_key,
                    "value": experts,
                    "severity": "warn",
                    "why": f"expert parallelism over {tp} ranks with {experts} experts: "
                    + (f"rank {experts} holds" if experts == tp - 1 else f"ranks {experts} to {tp - 1} hold")
                    + " no expert at all (vLLM's determine_expert_map gives each rank "
                    f"{' + '.join(map(str, split))}): the other ranks do all the MoE work",
                    "vllm_error": "",
                }
            )
        elif experts % tp:
            out.append(
                {
                    "key": count_key,
                    "value": experts,
                    "severity": "info",
                    "why": f"{experts} experts split unevenly over {tp} expert-parallel ranks "
                    f"({' + '.join(map(str, split))}, vLLM's determine_expert_map): it runs, the ranks with "
                    f"{split[0]} experts set the MoE layers' time (EPLB refuses an uneven split)",
                    "vllm_error": "",
                }
            )
    shared = _int(cfg, "shared_expert_intermediate_size")
    shared_key = "shared_expert_intermediate_size"
    if shared is None and _int(cfg, "n_shared_experts") and inter_key == "moe_intermediate_size" and inter:
        shared, shared_key = int(cfg["n_shared_experts"]) * inter, "n_shared_experts"
    if shared is not None and shared % tp:
        out.append(
            {
                "key": shared_key,
                "value": cfg[shared_key],
                "severity": "error",
                "why": f"the shared expert's {shared} intermediate features cannot be split evenly over {tp} ranks "
                "(a shared expert is a dense MLP: tensor parallelism slices it, with or without expert parallelism)",
                "vllm_error": f"AssertionError: {shared} is not divisible by {tp}",
            }
        )
    return out


def tp_problems(config: dict[str, Any], tp: int, ep: bool = False) -> list[dict[str, Any]]:
    """What vLLM's layers cannot split at tensor-parallel size ``tp`` (pure logic on config.json);
    ``ep``: ``--enable-expert-parallel`` (a mixture of experts' experts divided, not sliced)."""
    cfg = text_config(config)
    out: list[dict[str, Any]] = []
    heads = _int(cfg, "num_attention_heads")
    kv = _int(cfg, "num_key_value_heads") or heads
    hidden = _int(cfg, "hidden_size")
    inter = _int(cfg, "intermediate_size")
    vocab = _int(cfg, "vocab_size")
    moe = moe_sizes(config)
    experts_inter = moe is not None and moe[2] == "intermediate_size"  # Mixtral: the experts' MLP size
    if heads is not None and heads % tp:
        out.append(
            {
                "key": "num_attention_heads",
                "value": heads,
                "severity": "error",
                "why": f"{heads} attention heads cannot be split evenly over {tp} ranks",
                "vllm_error": (
                    f"ValueError: Total number of attention heads ({heads}) must be divisible by tensor parallel size "
                    f"({tp})."
                ),
            }
        )
    if kv is not None:
        if kv >= tp and kv % tp:
            out.append(
                {
                    "key": "num_key_value_heads",
                    "value": kv,
                    "severity": "error",
                    "why": f"{kv} KV heads cannot be split evenly over {tp} ranks",
                    "vllm_error": f"AssertionError: {kv} is not divisible by {tp}",
                }
            )
        elif kv < tp and tp % kv:
            out.append(
                {
                    "key": "num_key_value_heads",
                    "value": kv,
                    "severity": "error",
                    "why": (
                        f"{kv} KV heads cannot be replicated evenly over {tp} ranks ({tp} must be a multiple of {kv})"
                    ),
                    "vllm_error": f"AssertionError: {tp} is not divisible by {kv}",
                }
            )
    if inter is not None and inter % tp and not (experts_inter and ep):
        out.append(
            {
                "key": "intermediate_size",
                "value": inter,
                "severity": "error",
                "why": (
                    f"every expert's {inter} intermediate features cannot be split evenly over {tp} ranks (with "
                    "tensor parallelism only, FusedMoE slices each expert over the ranks)"
                    if experts_inter
                    else f"the MLP's {inter} intermediate features cannot be split evenly over {tp} ranks"
                ),
                "vllm_error": (
                    "AssertionError (FusedMoEConfig: intermediate_size % tp_size == 0)"
                    if experts_inter
                    else f"AssertionError: {inter} is not divisible by {tp}"
                ),
            }
        )
    if vocab is not None:
        padded = -(-vocab // 64) * 64
        if padded % tp:
            out.append(
                {
                    "key": "vocab_size",
                    "value": vocab,
                    "severity": "error",
                    "why": (
                        f"the vocabulary, padded to {padded} (a multiple of 64), cannot be split evenly over {tp} ranks"
                    ),
                    "vllm_error": f"AssertionError: {padded} is not divisible by {tp}",
                }
            )
    if hidden is not None and hidden % tp:
        out.append(
            {
                "key": "hidden_size",
                "value": hidden,
                "severity": "info",
                "why": (
                    f"hidden_size {hidden} is not divisible by {tp}: vLLM's standard layers do not split it (they "
                    f"split heads and the MLP), but a custom layer that shards hidden_size will fail"
                ),
                "vllm_error": "",
            }
        )
    return out + moe_problems(config, tp, ep)


def pp_problems(config: dict[str, Any], pp: int) -> list[dict[str, Any]]:
    """How vLLM's get_pp_indices splits the decoder layers over ``pp`` pipeline stages."""
    layers = _int(text_config(config), "num_hidden_layers")
    if pp <= 1 or layers is None:
        return []
    if layers < pp:
        return [
            {
                "key": "num_hidden_layers",
                "value": layers,
                "severity": "error",
                "why": f"{layers} decoder layer(s) cannot fill {pp} pipeline stages: at least one stage holds none",
                "vllm_error": None,
            }
        ]
    if layers % pp:
        return [
            {
                "key": "num_hidden_layers",
                "value": layers,
                "severity": "info",
                "why": f"{layers} layers split unevenly over {pp} pipeline stages (vLLM gives the {layers % pp} extra "
                "layer(s) to the stages before the last); the slowest stage sets the step time",
                "vllm_error": None,
            }
        ]
    return []


def working_tp_sizes(config: dict[str, Any], limit: int = 16, ep: bool = False) -> list[int]:
    return [n for n in range(1, limit + 1) if not any(p["severity"] == "error" for p in tp_problems(config, n, ep))]


@check(
    "VD305",
    "not-divisible-by-tensor-parallel-size",
    "Attention heads, KV heads, intermediate size (an expert's too), vocabulary or experts cannot be split over "
    "`--tensor-parallel-size N` (`--enable-expert-parallel`), or the layers over `--pipeline-parallel-size M`.",
    severity=Severity.ERROR,
    also=(Severity.INFO,),
    stage=Stage.STATIC,
    topic="ranks",
    what=(
        "With tensor parallelism vLLM splits attention heads, KV heads (or replicates them when there are fewer than "
        "ranks), the MLP's intermediate features and the (64-padded) vocabulary evenly over the ranks; with pipeline "
        "parallelism it splits the decoder layers over the stages (every stage needs at least one). A mixture of "
        "experts (FusedMoE): with tensor parallelism only every rank holds a slice of every expert (the expert MLP "
        "size, and a WNA16 checkpoint's quantization groups, must split evenly; the expert count need not); with "
        "`--enable-expert-parallel` the experts are divided over the ranks, unevenly when they do not divide (the "
        "first ranks get one more: a load imbalance, not an error). Pure arithmetic on config.json, for the sizes "
        "given with `--tensor-parallel-size`, `--pipeline-parallel-size` (default 1) and `--enable-expert-parallel`, "
        "before anything is launched."
    ),
    why=(
        "vLLM checks only the attention heads up front; the other splits fail later, inside a worker, as a bare "
        "`AssertionError: 14 is not divisible by 4` after every rank started."
    ),
    example="num_attention_heads 28, num_key_value_heads 4: --tensor-parallel-size 8 fails (28 % 8), 4 works; "
    "moe_intermediate_size 1408 at --tensor-parallel-size 3 fails (1408 % 3), 3 experts at 2 ranks run (each rank "
    "holds half of every expert; with --enable-expert-parallel 2 + 1 experts).",
    fix=(
        "Pick a tensor-parallel size from the list this check prints (or combine a smaller TP size with pipeline "
        "parallelism)."
    ),
    references=("vllm-project/vllm#2652", "vllm-project/vllm#11797"),
)
def not_divisible_by_tp(facts: Facts, emit: Emit) -> Iterable[Finding]:
    tp, pp = facts.tensor_parallel_size, facts.pipeline_parallel_size
    cfg = text_config(facts.config)
    if _int(cfg, "num_attention_heads") is None:
        yield emit.not_applicable("config.json has no num_attention_heads")
        return
    if pp > 1:
        for arch in facts.architectures:
            verdicts = ((facts.class_record(arch) or {}).get("contract") or {}).get("vllm") or {}
            if verdicts.get("supports_pp") is False:
                yield emit.fail(
                    f"{arch} does not implement vLLM's SupportsPP interface: vLLM refuses pipeline_parallel_size {pp} "
                    "for it",
                    arch,
                    {
                        "pipeline_parallel_size": pp,
                        "vllm_error": "NotImplementedError: Pipeline parallelism is not "
                        "supported for this model. Supported models implement the `SupportsPP` interface.",
                    },
                    "implement SupportsPP (make_layers with PPMissingLayer, IntermediateTensors in forward, "
                    "make_empty_intermediate_tensors), or use tensor parallelism only",
                )
    for p in pp_problems(facts.config, pp):
        evidence = {"value": p["value"], "pipeline_parallel_size": pp}
        if p["severity"] == "error":
            yield emit.fail(p["why"], "config.json:num_hidden_layers", evidence, "use fewer pipeline stages")
        else:
            yield emit.warn(p["why"], "config.json:num_hidden_layers", evidence, "", severity=Severity.INFO)
    if tp == 1:
        yield emit.ok(
            "tensor-parallel size 1: nothing is split (pass --tensor-parallel-size N to check N)"
            + (f"; {pp} pipeline stages" if pp > 1 else ""),
            "config.json",
        )
        return
    ep = facts.enable_expert_parallel
    working = working_tp_sizes(facts.config, ep=ep)
    problems = tp_problems(facts.config, tp, ep)
    hint = f"tensor-parallel sizes up to 16 that work: {', '.join(map(str, working))}"
    for p in problems:
        severity = {"error": Severity.ERROR, "warn": Severity.WARN}.get(p["severity"], Severity.INFO)
        evidence = {
            "value": p["value"],
            "tensor_parallel_size": tp,
            "enable_expert_parallel": ep,
            "working_sizes": working,
            "vllm_error": p["vllm_error"],
        }
        subject = f"config.json:{p['key']}"
        advice = hint
        if p["key"] in EXPERT_COUNT_KEYS:  # the experts' split: the sizes that divide them evenly
            even = ", ".join(str(n) for n in working_tp_sizes(facts.config, ep=True) if not p["value"] % n)
            advice = (
                f"expert-parallel sizes that divide the {p['value']} experts evenly: {even}"
                if ep
                else "nothing to fix for tensor parallelism (every rank holds a slice of every expert); with "
                f"--enable-expert-parallel, the sizes that divide the {p['value']} experts evenly: {even}"
            )
        if severity is Severity.ERROR:
            yield emit.fail(f"{p['key']} = {p['value']}: {p['why']}", subject, evidence, advice)
        else:
            yield emit.warn(f"{p['key']} = {p['value']}: {p['why']}", subject, evidence, advice, severity=severity)
    if not any(p["severity"] == "error" for p in problems):
        moe = moe_sizes(facts.config)
        experts = ""
        if moe is not None:
            experts = (
                f"; {moe[1]} experts divided {' + '.join(map(str, expert_split(moe[1], tp)))} (expert parallelism)"
                if ep
                else f"; each of the {moe[1]} experts sliced over the ranks"
            )
        yield emit.ok(
            f"heads, KV heads, intermediate size and vocabulary split evenly over {tp} ranks{experts}", "config.json"
        )
