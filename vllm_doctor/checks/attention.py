"""VD208: attention layers registered under a unique prefix, their own module path (topic ``contract``).

An engine-stage check of the model's contract: it reads vLLM's start-up error (``Duplicate
layer name``) and, in an engine that started, the attention layers of each worker's
:class:`~vllm_doctor.facts.kv.KvCache` (``doctor_kv``).
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.checks.base import Emit, check
from vllm_doctor.checks.engine_base import engine_started, kv_caches, subject, vllms_own_model
from vllm_doctor.checks.startup import DUPLICATE_LAYER
from vllm_doctor.facts.engine import EngineFacts
from vllm_doctor.facts.mixers import prefix_matches
from vllm_doctor.model import Finding, Severity, Stage


@check(
    "VD208",
    "attention-prefix-not-unique",
    "Attention layers without a unique `prefix` naming their place in the model.",
    severity=Severity.ERROR,
    stage=Stage.ENGINE,
    topic="contract",
    reads_startup_error=True,
    what=(
        "vLLM registers every Attention layer in its forward context under the `prefix` passed to it, and binds KV "
        "caches and quantization scales by that name. Checks the prefixes are unique (vLLM refuses duplicates at "
        "start-up) and equal to where the layer sits in the model."
    ),
    why=(
        "Duplicates stop the engine with `Duplicate layer name`; a prefix that differs from the module path (e.g. "
        "`layers.0.attn` for `model.layers.0.self_attn.attn`) breaks KV-scale loading and per-layer KV binding in "
        "quantized checkpoints."
    ),
    example="self.attn = Attention(..., prefix='attn')   # the same for every layer",
    fix=(
        'Thread `prefix` down from the model: `Attention(..., prefix=f"{prefix}.attn")` with the decoder layer built '
        'as `Layer(..., prefix=f"{prefix}.layers.{i}")`.'
    ),
    references=("vllm-project/vllm#18212", "vllm-project/vllm#15077"),
    requires=("engine-facts",),
)
def attention_prefix_not_unique(facts: EngineFacts, emit: Emit) -> Iterable[Finding]:
    if facts.startup_error:
        m = DUPLICATE_LAYER.search(facts.startup_error)
        if m:
            yield emit.fail(
                f"two attention layers use the prefix {m.group(1)!r}: vLLM refused to start",
                m.group(1),
                {"vllm_error": facts.startup_error[:600]},
                'pass a unique prefix to each Attention: prefix=f"{prefix}.attn"',
            )
            return
    if (instead := engine_started(facts, emit)) is not None:
        yield instead
        return
    pairs, crashes = kv_caches(facts, emit)
    yield from crashes
    for w, kv in pairs:
        layers = kv.attention_layers
        if vllms_own_model(w):
            # vLLM names its own layers as it binds them (HRM registers one attention per recurrent
            # step under a virtual layer index): the rule is for a port's prefixes
            yield emit.ok(f"{len(layers)} attention layer(s) of vLLM's own model, registered by vLLM", subject(w))
            continue
        bad = 0
        for layer in layers:
            prefix, paths = layer.prefix, list(layer.module_paths)
            if prefix_matches(prefix, paths):
                continue
            bad += 1
            where = paths[0] if paths else "nowhere in the model (not a submodule)"
            yield emit.warn(
                f"attention layer registered as {prefix!r} sits at {where!r}",
                prefix,
                {"prefix": prefix, "module_paths": paths, "rank": w.rank},
                "pass the module's own path as prefix (thread `prefix` down from the model's constructor)",
            )
        if not bad:
            yield emit.ok(
                f"{len(layers)} attention layer(s), each registered under a prefix of its own place in the model",
                subject(w),
            )
