"""VD501 / VD502 / VD504: the KV cache's size, pressure and spec (topic ``kv-cache``).

They read each worker's :class:`~vllm_doctor.facts.kv.KvCache` (``doctor_kv``); VD502 the
step records of its profile; VD501 also vLLM's own error when the engine did not start.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import engine_started, kv_caches, profiles, subject, vllms_own_model
from vllm_doctor.checks.startup import ESTIMATED_LENGTH, KV_TOO_SMALL
from vllm_doctor.facts.engine import EngineFacts
from vllm_doctor.facts.kv import AttentionLayer, HfShape, KvCache, KvGroup, KvSpec
from vllm_doctor.facts.mixers import ATTENTION_KINDS
from vllm_doctor.model import Finding, Severity, Stage
from vllm_doctor.units import fmt_bytes


def blocks_needed(groups: list[KvGroup], length: int) -> int | None:
    """KV blocks one request of ``length`` tokens takes across all groups (vLLM's block pool is shared)."""
    total = 0
    for g in groups:
        spec = g.spec
        bs = spec.block_size or 0
        if bs <= 0:
            return None
        kind = spec.type or ""
        window = spec.sliding_window or spec.attention_chunk_size
        if "Mamba" in kind:
            total += 1
        elif window:
            total += min(math.ceil(length / bs), math.ceil((window - 1) / bs) + 1)
        elif "Attention" in kind or kind.endswith("Spec"):
            total += math.ceil(length / bs)
        else:
            return None
    return total


def largest_length(groups: list[KvGroup], num_blocks: int, cap: int) -> int | None:
    """The longest request that fits in ``num_blocks`` (binary search up to ``cap``)."""
    if blocks_needed(groups, 1) is None:
        return None
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        needed = blocks_needed(groups, mid)
        if needed is not None and needed <= num_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


@check(
    "VD501",
    "kv-cache-too-small",
    "The KV cache cannot hold one request of max_model_len; says the largest length that fits.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="kv-cache",
    reads_startup_error=True,
    what=(
        "From the running engine's KV cache (blocks x block size per KV group) computes the longest request that fits "
        "and how many requests of max_model_len fit at once; if the engine refused to start, reads vLLM's own numbers "
        "from its error."
    ),
    why=(
        "vLLM stops at start-up (`To serve at least one request with the model's max seq len ...`) or, with several "
        "groups, rejects long prompts at run time."
    ),
    example="max_model_len=32768 with gpu_memory_utilization=0.5 on a 24 GiB GPU",
    fix=(
        "Lower `max_model_len` to the length that fits, raise `gpu_memory_utilization` / `kv_cache_memory_bytes`, or "
        "use an fp8 KV cache (`kv_cache_dtype='fp8'`)."
    ),
    references=("vllm-project/vllm#10439", "vllm-project/vllm#16118"),
    requires=("engine-facts",),
)
def kv_cache_too_small(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    if facts.startup_error:
        err = facts.startup_error
        m = KV_TOO_SMALL.search(err)
        if m:
            est = ESTIMATED_LENGTH.search(err)
            yield emit.fail(
                f"the KV cache cannot hold one request of max_model_len={m.group(1)}: it needs {m.group(2)} GiB, "
                f"{m.group(3)} GiB are available"
                + (f"; the longest request that fits is {est.group(1)} tokens" if est else ""),
                "engine start-up",
                {
                    "max_model_len": int(m.group(1)),
                    "needed_gib": float(m.group(2)),
                    "available_gib": float(m.group(3)),
                    "largest_length": int(est.group(1)) if est else None,
                    "vllm_error": err[:600],
                },
                f"set max_model_len={est.group(1)} or less"
                if est
                else "lower max_model_len or give the KV cache more memory",
            )
            return
        if "No available memory for the cache blocks" in err:
            yield emit.fail(
                "no memory is left for the KV cache after the weights and activations",
                "engine start-up",
                {"vllm_error": err[:600]},
                "raise gpu_memory_utilization / kv_cache_memory_bytes, or use a smaller model / quantization",
            )
            return
    if (instead := engine_started(facts, emit)) is not None:
        yield instead
        return
    pairs, crashes = kv_caches(facts, emit)
    yield from crashes
    for w, kv in pairs:
        groups, num_blocks, max_len = kv.groups, kv.num_blocks, kv.max_model_len
        if not groups or not num_blocks or not max_len:
            yield emit.skip("this vLLM does not expose the KV cache configuration", subject(w))
            continue
        usable = num_blocks - 1  # block 0 is the null block
        fits = largest_length(groups, usable, cap=max(max_len, 1) * 1024)
        if fits is None:
            yield emit.skip(f"unknown KV spec types: {[g.spec.type for g in groups]}", subject(w))
            continue
        per_request = blocks_needed(groups, max_len) or 1
        evidence = {
            "num_blocks": num_blocks,
            "block_size": groups[0].spec.block_size,
            "groups": len(groups),
            "max_model_len": max_len,
            "largest_length": fits,
            "full_length_requests_at_once": usable // per_request,
            "kv_bytes": kv.storage_bytes,
        }
        if fits < max_len:
            yield emit.fail(
                f"the KV cache holds {fits} tokens per request, less than max_model_len={max_len}",
                subject(w),
                evidence,
                f"set max_model_len={fits} or give the KV cache more memory",
            )
        else:
            yield emit.ok(
                f"the KV cache ({num_blocks} blocks of {evidence['block_size']} tokens) holds "
                f"{usable // per_request} request(s) of max_model_len={max_len} at once"
                + (f"; the longest single request that fits is {fits} tokens" if fits < max_len * 1024 else ""),
                subject(w),
                evidence,
            )


@check(
    "VD502",
    "kv-cache-preemptions",
    "Requests were preempted (evicted from the KV cache and recomputed) during the run.",
    severity=Severity.WARN,
    stage=Stage.ENGINE,
    topic="kv-cache",
    what=(
        "When the KV cache runs out of free blocks, vLLM's scheduler preempts running requests: it frees their blocks "
        "and later recomputes their whole prefill. The doctor counts preempted and resumed requests per step (from "
        "the SchedulerOutput) next to the KV blocks in use."
    ),
    why=(
        "Each preemption throws away finished work: throughput drops and latency spikes while the KV usage metric "
        "looks merely 'high'."
    ),
    example="4 requests preempted, 4 resumed; KV cache peaked at 100% of 23 usable blocks",
    fix=(
        "Give the KV cache more room (gpu_memory_utilization, kv_cache_memory_bytes), or admit less at once "
        "(max_num_seqs, max_num_batched_tokens), or shorten max_model_len."
    ),
    references=("vllm-project/vllm#34076", "vllm-project/vllm#39734"),
    requires=("engine",),
)
def kv_cache_preemptions(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = profiles(facts, emit)
    yield from crashes
    for w, profile in pairs:
        steps = w.steps()
        if not len(steps):
            yield emit.skip(steps.error or "no step was profiled (run a workload while attached)", subject(w))
            continue
        preempted_col, resumed_col = steps["preempted_reqs"], steps["resumed_reqs"]
        preempted, resumed = int(sum(preempted_col)), int(sum(resumed_col))
        num_blocks = profile.get("num_blocks") or (w.kv.num_blocks if w.kv is not None else None)
        usable = max(1, int(num_blocks) - 1) if num_blocks else None  # block 0 is vLLM's null block
        peak_blocks = int(max(steps["kv_blocks_used"]))
        peak = peak_blocks / usable if usable else None
        evidence = {
            "preempted": preempted,
            "resumed": resumed,
            "peak_blocks": peak_blocks,
            "usable_blocks": usable,
            "peak_usage": peak,
            "steps": len(steps),
            "steps_with_preemption": sum(map(bool, map(operator.or_, preempted_col, resumed_col))),
        }
        usage = (
            f"KV cache peaked at {peak:.0%} of {usable} usable blocks"
            if peak is not None
            else f"KV peak {peak_blocks} blocks"
        )
        if preempted or resumed:
            yield emit.warn(
                f"{max(preempted, resumed)} request(s) preempted and recomputed; {usage}",
                subject(w),
                evidence,
                "give the KV cache more memory or admit fewer requests at once (max_num_seqs)",
            )
        else:
            yield emit.ok(f"no preemptions in {len(steps)} steps; {usage}", subject(w), evidence)


@check(
    "VD504",
    "kv-spec-mismatch",
    "The KV-cache spec does not match the model's attention layers (heads, head size, layers, bytes).",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="kv-cache",
    what=(
        "Compares each attention layer (vLLM's forward context) with the KV-cache group that holds it (KV heads, head "
        "size), with config.json (num_key_value_heads / tensor_parallel_size, head_dim), and the KV storage torch "
        "allocated (shared storage counted once) with the bytes vLLM planned."
    ),
    why=(
        "An attention layer that ignores grouped-query attention (KV heads = query heads) makes the KV cache several "
        "times larger than needed and shortens the max batch; a layer missing from the KV groups gets no cache at all."
    ),
    example=(
        "Attention(num_heads, head_dim, scale, num_kv_heads=config.num_attention_heads)  # config has "
        "num_key_value_heads=8"
    ),
    fix=(
        "Pass `num_kv_heads=config.num_key_value_heads // tp_size` (at least 1) and `head_size=config.head_dim` to "
        "vLLM's Attention, and give every attention layer its own prefix."
    ),
    requires=("engine",),
)
def kv_spec_mismatch(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    pairs, crashes = kv_caches(facts, emit)
    yield from crashes
    for w, kv in pairs:
        # vLLM's own class sizes its cache on purpose (MiniCPM3 caches every query head): only a
        # port is held to config.json; every model is held to its own KV spec
        builtin = vllms_own_model(w)
        problems = list(spec_problems(kv, against_config=not builtin))
        storage, planned = kv.storage_bytes, kv.planned_bytes
        if planned and storage is not None and storage != planned:
            how = "one buffer all groups share" if kv.planned_aliased else f"{len(kv.planned_tensors)} tensor(s)"
            problems.append(
                (
                    f"torch allocated {fmt_bytes(storage)} ({storage} bytes) of KV storage, vLLM planned "
                    f"{fmt_bytes(planned)} ({planned} bytes, {how})",
                    subject(w),
                    {"storage_bytes": storage, "planned_bytes": planned, "num_storages": kv.num_storages},
                )
            )
        for message, where, evidence in problems:
            yield emit.fail(message, where, {**evidence, "rank": w.rank}, evidence.pop("hint", None) or HINT)
        if not problems:
            layers = kv.attention_layers
            kinds = Counter(layer.kind or "attention" for layer in layers)
            what = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
            against = "their KV spec and config.json" if not builtin else "their KV spec (vLLM's own model)"
            yield emit.ok(
                f"{len(layers)} layer(s) with a KV cache or state ({what}) match {against}; KV "
                f"storage {fmt_bytes(storage)} in {kv.num_storages} storage(s) (shared storage counted once) = "
                "vLLM's plan",
                subject(w),
                {
                    "attention_layers": len(layers),  # every layer with a KV cache or state, whatever its kind
                    "kinds": dict(kinds),
                    "num_hidden_layers": kv.hf_config.num_hidden_layers,
                    "storage_bytes": storage,
                    "planned_bytes": planned,
                    "view_bytes": kv.view_bytes,
                },
            )


HINT = "pass num_kv_heads=config.num_key_value_heads // tp_size and head_size=config.head_dim to Attention"


def spec_problems(kv: KvCache, against_config: bool = True) -> Iterable[tuple[str, str, dict[str, Any]]]:
    """Each layer against the KV-cache group that holds it (the same kind of spec, the same sizes)
    and against config.json as vLLM reads it: a standard attention layer's KV heads and head size
    (vLLM's ``get_num_kv_heads`` / ``get_head_size``), an MLA layer's one latent head of
    ``kv_lora_rank + qk_rope_head_dim``. A Mamba / linear-attention layer's state is checked
    against its group's spec only (its sizes are the mixer's, not config.json's head sizes).
    ``against_config=False`` (vLLM's own model classes): the layers against their specs only."""
    group_of: dict[str, KvSpec] = {}
    for g in kv.groups:
        for name in g.layer_names:
            group_of[name] = g.spec
    hf = kv.hf_config
    tp = kv.tensor_parallel_size or 1
    cfg_kv = hf.num_key_value_heads if hf.num_key_value_heads is not None else hf.num_attention_heads
    expected_kv = hf.vllm_num_kv_heads
    if expected_kv is None and cfg_kv is not None:
        expected_kv = max(1, cfg_kv // tp)
    heads_ok = {h for h in (hf.head_dim, hf.vllm_head_size) if h}
    names = {layer.prefix for layer in kv.attention_layers}
    for layer in kv.attention_layers:
        name = layer.prefix
        if layer.kv_sharing_target:
            continue  # reads another layer's cache by design
        spec = group_of.get(name)
        own = layer.spec
        if spec is None:
            if own is not None and own.type is None:
                continue
            if own is None and layer.kind is None:
                continue  # no cache asked for (vLLM put it in no group on purpose)
            yield (
                f"{_kind(layer)} layer {name} is in no KV-cache group: it gets no cache",
                name,
                {"layer": layer.to_json()},
            )
            continue
        if own is not None and own.kind and spec.kind and own.kind != spec.kind:
            yield (
                f"{name} asks for a {own.kind} cache ({own.type}) but its KV-cache group is {spec.kind} ({spec.type})",
                name,
                {"layer_spec": own.to_json(), "group_spec": spec.to_json()},
            )
        for label, have, want in (
            ("KV heads", layer.num_kv_heads, spec.num_kv_heads),
            ("head size", layer.head_size, spec.head_size),
        ):
            if have is not None and want is not None and have != want:
                yield (f"{name}: {label} {have} but its KV spec says {want}", name, {"layer": have, "spec": want})
        if own is not None and own.shapes and spec.shapes and own.shapes != spec.shapes:
            yield (
                f"{name}: state shapes {own.shapes} but its KV-cache group's spec says {spec.shapes}",
                name,
                {"layer": own.shapes, "spec": spec.shapes},
            )
        kind = layer.kind or spec.kind or "attention"
        if not against_config:
            continue
        if kind == "mla":
            yield from _mla_problems(layer, hf)
            continue
        if kind not in ATTENTION_KINDS:
            continue
        if expected_kv is not None and layer.num_kv_heads is not None and layer.num_kv_heads != expected_kv:
            ratio = layer.num_kv_heads / expected_kv
            yield (
                f"{name} caches {layer.num_kv_heads} KV heads per rank, config.json implies {expected_kv} "
                f"(num_key_value_heads={cfg_kv} / tp={tp})"
                + (f": the KV cache is {ratio:g}x larger than needed" if ratio > 1 else ""),
                name,
                {
                    "layer_kv_heads": layer.num_kv_heads,
                    "expected": expected_kv,
                    "config_num_key_value_heads": cfg_kv,
                    "tp": tp,
                },
            )
        if heads_ok and layer.head_size is not None and layer.head_size not in heads_ok:
            yield (
                f"{name} uses head size {layer.head_size}, config.json says {min(heads_ok)}",
                name,
                {"layer_head_size": layer.head_size, "config_head_dim": min(heads_ok)},
            )
    for name in group_of:
        if name not in names:
            yield (f"KV-cache group names {name}, which is no layer of the model's forward context", name, {})


def _kind(layer: AttentionLayer) -> str:
    return {"mla": "MLA", None: "attention"}.get(layer.kind, layer.kind or "attention")


def _mla_problems(layer: AttentionLayer, hf: HfShape) -> Iterable[tuple[str, str, dict[str, Any]]]:
    """An MLA layer caches one latent "head" of ``kv_lora_rank + qk_rope_head_dim`` per token."""
    name = layer.prefix
    if layer.num_kv_heads is not None and layer.num_kv_heads != 1:
        yield (
            f"{name}: an MLA layer caches one latent head per token, this one {layer.num_kv_heads}",
            name,
            {"layer_kv_heads": layer.num_kv_heads, "hint": "MLA caches the compressed latent once: num_kv_heads=1"},
        )
    if hf.kv_lora_rank and hf.qk_rope_head_dim is not None and layer.head_size is not None:
        want = hf.kv_lora_rank + hf.qk_rope_head_dim
        if layer.head_size != want:
            yield (
                f"{name}: MLA latent of {layer.head_size} per token, config.json says kv_lora_rank "
                f"{hf.kv_lora_rank} + qk_rope_head_dim {hf.qk_rope_head_dim} = {want}",
                name,
                {
                    "layer_head_size": layer.head_size,
                    "kv_lora_rank": hf.kv_lora_rank,
                    "qk_rope_head_dim": hf.qk_rope_head_dim,
                    "hint": "build the MLA layer with kv_lora_rank and qk_rope_head_dim from config.json",
                },
            )
