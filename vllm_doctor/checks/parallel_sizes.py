"""VD305: can config.json's sizes be split over the tensor- and pipeline-parallel sizes asked for?

Pure arithmetic on config.json, in the fast pass: vLLM splits attention heads, KV heads, the
MLP's intermediate features and the padded vocabulary over tensor-parallel ranks, and the decoder
layers over pipeline stages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.weights_base import text_config
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage


def _int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def tp_problems(config: dict[str, Any], tp: int) -> list[dict[str, Any]]:
    """What vLLM's layers cannot split at tensor-parallel size ``tp`` (pure logic on config.json)."""
    cfg = text_config(config)
    out: list[dict[str, Any]] = []
    heads = _int(cfg, "num_attention_heads")
    kv = _int(cfg, "num_key_value_heads") or heads
    hidden = _int(cfg, "hidden_size")
    inter = _int(cfg, "intermediate_size")
    vocab = _int(cfg, "vocab_size")
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
    if inter is not None and inter % tp:
        out.append(
            {
                "key": "intermediate_size",
                "value": inter,
                "severity": "error",
                "why": f"the MLP's {inter} intermediate features cannot be split evenly over {tp} ranks",
                "vllm_error": f"AssertionError: {inter} is not divisible by {tp}",
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
    return out


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


def working_tp_sizes(config: dict[str, Any], limit: int = 16) -> list[int]:
    return [n for n in range(1, limit + 1) if not any(p["severity"] == "error" for p in tp_problems(config, n))]


@check(
    "VD305",
    "not-divisible-by-tensor-parallel-size",
    "Attention heads, KV heads, intermediate size or vocabulary cannot be split over `--tensor-parallel-size N`, or "
    "the layers over `--pipeline-parallel-size M`.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="ranks",
    what=(
        "With tensor parallelism vLLM splits attention heads, KV heads (or replicates them when there are fewer than "
        "ranks), the MLP's intermediate features and the (64-padded) vocabulary evenly over the ranks; with pipeline "
        "parallelism it splits the decoder layers over the stages (every stage needs at least one). Pure arithmetic "
        "on config.json, for the sizes given with `--tensor-parallel-size` and `--pipeline-parallel-size` (default "
        "1), before anything is launched."
    ),
    why=(
        "vLLM checks only the attention heads up front; the other splits fail later, inside a worker, as a bare "
        "`AssertionError: 14 is not divisible by 4` after every rank started."
    ),
    example="num_attention_heads 28, num_key_value_heads 4: --tensor-parallel-size 8 fails (28 % 8), 4 works.",
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
    working = working_tp_sizes(facts.config)
    problems = tp_problems(facts.config, tp)
    hint = f"tensor-parallel sizes up to 16 that work: {', '.join(map(str, working))}"
    for p in problems:
        severity = Severity.ERROR if p["severity"] == "error" else Severity.INFO
        evidence = {
            "value": p["value"],
            "tensor_parallel_size": tp,
            "working_sizes": working,
            "vllm_error": p["vllm_error"],
        }
        subject = f"config.json:{p['key']}"
        if severity is Severity.ERROR:
            yield emit.fail(f"{p['key']} = {p['value']}: {p['why']}", subject, evidence, hint)
        else:
            yield emit.warn(f"{p['key']} = {p['value']}: {p['why']}", subject, evidence, hint, severity=Severity.INFO)
    if not any(p["severity"] == "error" for p in problems):
        yield emit.ok(f"heads, KV heads, intermediate size and vocabulary split evenly over {tp} ranks", "config.json")
