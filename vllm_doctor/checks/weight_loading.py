"""VD301-VD304: does ``load_weights`` fill every parameter from the checkpoint, and without loss?

These need the weights pass (:mod:`.weights_base`): the model built on the meta device, its real
``load_weights`` driven with meta tensors of the checkpoint's names, shapes and dtypes, every
element written into every parameter recorded. When the model cannot be built they say ``skip``
with the reason (VD304 then compares with the model dtype alone).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, capped_findings, check, known
from vllm_doctor.checks.quant_load import (
    defaulted_params,
    dropped_by_method,
    malformed_scales,
    malformed_tensors,
    missing_quant_params,
    unquantized_modules,
    unquantized_tensors,
)
from vllm_doctor.checks.tower_load import tower_params, tower_tensors, unbuilt_groups
from vllm_doctor.checks.weights_base import built, text_config
from vllm_doctor.facts import wire
from vllm_doctor.facts.checkpoint import FLOAT_DTYPES
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage

EXPECTED_SKIPS = {"inv_freq", "cos_cached", "sin_cached"}  # rotary caches vLLM recomputes
NOT_INITIALIZED = "Following weights were not initialized from checkpoint: {...}"
REFS_LOADING = ("vllm/model_executor/model_loader/default_loader.py:track_weights_loading",)


def _shard_text(shards: list[Any]) -> str:
    return ", ".join(str(s) for s in shards)


@check(
    "VD301",
    "parameter-not-loaded",
    "A model parameter that no checkpoint tensor fills (or a fused parameter with a shard no tensor fills).",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "Every parameter of the model vLLM builds must be written by `load_weights` from a checkpoint tensor. "
        "vllm-doctor builds your class on the meta device and runs its real `load_weights` with meta tensors of the "
        "checkpoint's names, shapes and dtypes, recording every element written into every parameter. A fused "
        "parameter (qkv_proj from q/k/v, gate_up_proj from gate/up) counts as loaded only when every shard was "
        "written."
    ),
    why=(
        f"vLLM's own check (`{NOT_INITIALIZED}`) trusts the names `load_weights` returns and skips linear and "
        f"embedding layers altogether: a missing linear weight, a fused qkv_proj without its v shard, or a missing "
        f"lm_head run silently on uninitialised memory and produce garbage. Only norms and other plain parameters "
        f"make vLLM stop."
    ),
    example=(
        "checkpoint lacks model.layers.1.self_attn.v_proj.weight -> qkv_proj.weight has shards q, k but never v; vLLM "
        "starts and generates nonsense."
    ),
    fix=(
        "Make the checkpoint and `load_weights` agree: rename the tensor (or add it to `stacked_params_mapping` / a "
        "`WeightsMapper`), stop skipping it, or re-export the checkpoint with the missing tensors."
    ),
    references=("vllm-project/vllm#15536", "vllm-project/vllm#12860", "vllm-project/vllm#44788", *REFS_LOADING),
    requires=("checkpoint", "weights-load"),
)
def parameter_not_loaded(facts: Facts, emit: Emit) -> Iterable[Finding]:
    got = known(facts.usable_weights())
    params, tensors = got.params, got.tensors
    lost = ("skipped", "raised", "handed_not_written", "shape_mismatch")
    unused = [n for n, t in tensors.items() if t.status in lost]
    unread_prefixes = {_module_prefix(n) for n in known(facts.checkpoint).unread_tensors}
    findings: list[Finding] = []
    unverifiable: list[str] = []
    meta_limited: list[str] = []
    by_tower = tower_params(facts)
    defaulted = defaulted_params(facts)  # vLLM fills them itself (KV-cache scales)
    scales = {f"{m}.{leaf}" for m, leaves in missing_quant_params(facts).items() for leaf in leaves}
    scales |= {f"{m.module}.{m.leaf}" for m in malformed_scales(facts)}  # VD315: there, stored wrong
    unquantized = unquantized_modules(facts)
    deferred_quant: list[str] = []
    for name, p in sorted(params.items()):
        if p.written or name in defaulted:
            continue
        if name in scales or name.rsplit(".", 1)[0] in unquantized:
            deferred_quant.append(name)  # VD315 names a layer's missing scales, VD314 a layer built unquantized
            continue
        if p.num_experts and p.expert_loads:
            continue  # a fused-MoE layer that got some experts: VD311 names the missing ones
        if name in by_tower:
            continue  # its whole tower is unloaded: VD313 names it once, with the cause
        if _module_prefix(name) in unread_prefixes:
            unverifiable.append(name)
            continue
        failed = p.failed_from
        if failed and all(t in tensors and tensors[t].status == "unverifiable" for t in failed):
            meta_limited.append(name)
            continue
        vllm_notices = p.in_returned is False and not p.vllm_exempt
        consequence = (
            f"vLLM's own check catches this one (`{NOT_INITIALIZED}`)"
            if vllm_notices
            else (
                "vLLM's own missing-weight check does not cover it: the engine would run with uninitialised memory "
                "there"
            )
        )
        if failed:
            message = (
                f"{name} is not filled: loading checkpoint tensor {', '.join(failed)} into it fails (see VD302/VD303)"
            )
        elif p.shards_missing and p.shards_loaded:
            message = (
                f"{name}: shard(s) {_shard_text(p.shards_missing)} of the fused parameter are never loaded "
                f"(loaded: {_shard_text(p.shards_loaded)}; {p.covered} of {p.numel} elements written); "
                f"{consequence}"
            )
        elif p.covered:
            message = f"{name}: only {p.covered} of {p.numel} elements are written by the checkpoint; {consequence}"
        else:
            message = f"no checkpoint tensor fills {name}; {consequence}"
        same_block = [t for t in unused if _module_prefix(t) == _module_prefix(name)]
        related = failed or difflib.get_close_matches(name, same_block, n=3, cutoff=0.5)
        hint = ""
        if related and not failed:
            hint = f"checkpoint tensor(s) {', '.join(related)} did not load (see VD302/VD303); "
        if failed:
            hint = "fix the tensor's shape or name (VD302/VD303) and this parameter is filled"
        elif p.shards_missing:
            hint += (
                f"add the tensor for shard {_shard_text(p.shards_missing)} to the checkpoint, or map its name in "
                f"`stacked_params_mapping`"
            )
        else:
            hint += "add the tensor to the checkpoint or make load_weights map its checkpoint name to this parameter"
        findings.append(
            emit.fail(
                message,
                name,
                {
                    "shape": p.shape,
                    "dtype": p.dtype,
                    "elements_written": p.covered,
                    "numel": p.numel,
                    "shards_expected": p.shards_expected,
                    "shards_loaded": p.shards_loaded,
                    "shards_missing": p.shards_missing,
                    "sources": p.sources,
                    "failed_from": failed,
                    "load_weights_reports_it": p.in_returned,
                    "vllm_notices": vllm_notices,
                    "related_checkpoint_tensors": related,
                    "vllm_error": NOT_INITIALIZED if vllm_notices else "",
                },
                hint,
            )
        )
    if unverifiable:
        yield emit.skip(
            f"{len(unverifiable)} parameter(s) get no tensor from the readable files; the index puts their tensors in "
            f"files that cannot be read (see VD306/VD308): "
            f"{', '.join(unverifiable[:5])}{' ...' if len(unverifiable) > 5 else ''}",
            "(parameters in unreadable files)",
        )
    if meta_limited:
        yield emit.skip(
            f"{len(meta_limited)} parameter(s) are loaded by operations that cannot run on the meta device; "
            f"not verified: {', '.join(meta_limited[:5])}{' ...' if len(meta_limited) > 5 else ''}",
            "(parameters not verifiable on the meta device)",
        )
    unfilled_defaults = sorted(n for n in defaulted if n in params and not params[n].written)
    also = (
        f" ({len(unfilled_defaults)} KV-cache/query scale(s) and zero point(s) the checkpoint lacks, e.g. "
        f"{unfilled_defaults[0]}: vLLM fills them itself)"
        if unfilled_defaults
        else ""
    )
    if deferred_quant and not findings and not unverifiable and not meta_limited:
        yield emit.ok(
            f"every parameter is filled but the {len(deferred_quant)} of the quantized layers VD314/VD315 name{also}",
            "model",
            {"defaulted_by_vllm": unfilled_defaults[:20]},
        )
        return
    if by_tower and not findings and not unverifiable and not meta_limited:
        yield emit.ok(f"every parameter is filled but the {len(by_tower)} of the tower(s) VD313 names{also}", "model")
        return
    if not findings and not unverifiable and not meta_limited:
        yield emit.ok(
            f"all {len(params) - len(unfilled_defaults)} parameters are filled from {len(tensors)} checkpoint "
            f"tensors{also}",
            "model",
            {"defaulted_by_vllm": unfilled_defaults[:20]},
        )
        return
    yield from capped_findings(findings, emit, "parameters not loaded")


def _module_prefix(name: str) -> str:
    """model.layers.3.self_attn.qkv_proj.weight -> model.layers.3.self_attn (fused and
    unfused names of one block share it)."""
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else name


@check(
    "VD302",
    "checkpoint-tensor-not-consumed",
    "A checkpoint tensor that `load_weights` never loads, or on which it raises (with the name it looked up).",
    severity=Severity.ERROR,
    also=(Severity.WARN, Severity.INFO),
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "Each checkpoint tensor is handed to your `load_weights`, which maps its name to a parameter (stacked/fused "
        "params, prefixes, tied `lm_head`, quantization scales) and calls the parameter's `weight_loader`. "
        "vllm-doctor follows every tensor through your real `load_weights` on the meta device."
    ),
    why=(
        "A tensor whose mapped name does not exist raises `KeyError` deep in start-up (after the whole model was "
        "built); a tensor that is silently skipped leaves its parameter uninitialised (VD301) or hides a naming "
        "mismatch."
    ),
    example=(
        "checkpoint: model.layers.1.mlp.gate_projection.weight; load_weights replaces '.gate_proj' -> '.gate_up_proj' "
        "and looks up model.layers.1.mlp.gate_up_projection.weight -> KeyError."
    ),
    fix=(
        "Rename the checkpoint tensor, or teach load_weights the name (stacked_params_mapping, WeightsMapper / "
        "hf_to_vllm_mapper, `skip_prefixes` for tensors that should be ignored)."
    ),
    references=(
        "vllm-project/vllm#4989",
        "vllm-project/vllm#27138",
        "vllm-project/vllm#40358",
        "hiyouga/LlamaFactory#2789",
    ),
    requires=("checkpoint", "weights-load"),
)
def checkpoint_tensor_not_consumed(facts: Facts, emit: Emit) -> Iterable[Finding]:
    got = known(facts.usable_weights())
    tensors, nearest = got.tensors, got.nearest
    findings: list[Finding] = []
    unverifiable: list[str] = []
    for err in got.load_weights.global_errors:
        findings.append(
            emit.fail(
                f"load_weights raised before taking any checkpoint tensor: {err.error}",
                "load_weights",
                {"error": err.error, "traceback": err.traceback},
                "run load_weights on a small model in a debugger; the traceback shows where",
            )
        )
    deferred = tower_tensors(facts) | unquantized_tensors(facts)  # VD313 names their tower, VD314 their layer
    not_built = unbuilt_groups(facts, [n for n, t in tensors.items() if t.status == "skipped"])
    deliberate = {n for g in not_built.values() for n in g["tensors"]}
    discardable = dropped_by_method(facts)
    discarded = discardable & {n for n, t in tensors.items() if t.status == "skipped"}
    deliberate |= discarded  # the quantization method's checkpoint mapper drops them (GPTQ's g_idx)
    for name, t in tensors.items():
        status = t.status
        if status == "unverifiable":
            unverifiable.append(name)
            continue
        if status not in ("raised", "skipped", "handed_not_written") or name in deferred or name in deliberate:
            continue
        evidence: dict[str, Any] = {"status": status, "shape": t.shape, "dtype": t.dtype}
        if status == "raised":
            err = next(e for e in t.errors if e.kind == "raised")
            looked = err.looked_up
            evidence.update(
                error=err.error,
                looked_up=looked,
                where=err.where,
                traceback=err.traceback,
                vllm_error=err.error,
            )
            near = nearest.get(looked or "", []) or nearest.get(name, [])
            evidence["nearest_parameters"] = near
            lookup = f" (it looked up {looked!r})" if looked and looked != name else ""
            hint = (
                f"the model has {near[0]!r}: map the checkpoint name onto it"
                if near
                else "map the name in load_weights or drop the tensor"
            )
            if name in discardable:
                hint = (
                    "the quantization method does not use this tensor (vLLM's AutoWeightsLoader drops it through "
                    "quant_config.get_checkpoint_weight_mapper()): skip it in load_weights, or load through "
                    "AutoWeightsLoader"
                )
            findings.append(
                emit.fail(
                    f"load_weights raises {err.error.splitlines()[0]} for checkpoint tensor {name}{lookup}",
                    name,
                    evidence,
                    hint,
                )
            )
        elif status == "skipped" and name.rsplit(".", 1)[-1] in EXPECTED_SKIPS:
            findings.append(
                emit.warn(
                    (
                        f"load_weights skips checkpoint tensor {name}, as vLLM's own models do: it is recomputed at "
                        f"start-up"
                    ),
                    name,
                    evidence,
                    "nothing to do; drop the tensor from the checkpoint to silence this",
                    severity=Severity.INFO,
                )
            )
        elif status == "skipped":
            near = nearest.get(name, [])
            evidence["nearest_parameters"] = near
            tied = name.startswith("lm_head.") and text_config(facts.config).get("tie_word_embeddings") is True
            findings.append(
                emit.warn(
                    (
                        f"load_weights never loads checkpoint tensor {name}: it is skipped without reaching any "
                        f"weight_loader"
                    )
                    + (" (tie_word_embeddings is true, so the head is the embedding; see VD307)" if tied else ""),
                    name,
                    evidence,
                    "if this tensor is needed, remove the filter that skips it; if not, drop it from the checkpoint",
                    severity=Severity.WARN,
                )
            )
        else:
            evidence["handed_to"] = wire.write(t.handed_to)  # a finding's evidence is report.json's
            findings.append(
                emit.warn(
                    f"checkpoint tensor {name} is handed to a weight_loader that writes nothing",
                    name,
                    evidence,
                    "check the parameter's weight_loader: it returns without copying the tensor",
                    severity=Severity.WARN,
                )
            )
    yield from (_not_built(emit, group) for group in not_built.values())
    if unverifiable:
        yield emit.skip(
            (
                f"{len(unverifiable)} tensor(s) use operations that meta tensors cannot run; not verified: "
                f"{', '.join(unverifiable[:5])}"
            ),
            "(tensors not verifiable on the meta device)",
        )
    elif not findings:
        rest = len(tensors) - len(deliberate | deferred)
        yield emit.ok(
            f"load_weights loads all {rest} checkpoint tensors"
            + (" of the modules the model builds" if deliberate - discarded else "")
            + (f" (VD313/VD314 name the tower(s) or layer(s) of the other {len(deferred)})" if deferred else "")
            + (
                f"; {len(discarded)} tensor(s) the quantization method discards (e.g. {sorted(discarded)[0]}: vLLM's "
                "loader drops them, its kernels do not use them)"
                if discarded
                else ""
            ),
            "checkpoint",
        )
        return
    yield from capped_findings(findings, emit, "checkpoint tensors not consumed")


def _not_built(emit: Emit, group: dict[str, Any]) -> Finding:
    """A pass for the checkpoint tensors of a module the model deliberately does not build."""
    module, names = group["module"], group["tensors"]
    if group["kind"] == "layer":
        indices = sorted(group["indices"])
        span = str(indices[0]) if len(indices) == 1 else f"{{{indices[0]}..{indices[-1]}}}"
        subject = f"{module}.{span}.*"
        ((key, declared),) = group["declared"].items()
        says = ", ".join(f"{k}={v}" for k, v in {key: declared, **group["feature_layer"]}.items())
        message = (
            f"{subject}: not built ({says}); the model builds {group['built']} of the {declared} layers and "
            f"load_weights skips the {len(names)} checkpoint tensors of the others, as vLLM's own LLaVA does with "
            "the CLIP/SigLIP layers past vision_feature_layer"
        )
    else:
        subject = f"{module}.*"
        message = (
            f"{subject}: not built (the class sets {module} to None); load_weights skips its {len(names)} checkpoint "
            "tensors, as vLLM's CLIP/SigLIP towers do with post_layernorm when LLaVA takes an earlier layer's features"
        )
    return emit.ok(message, subject, {**group, "tensors": names[:50], "tensor_count": len(names)})


@check(
    "VD303",
    "checkpoint-shape-mismatch",
    "A checkpoint tensor's shape does not fit the parameter (or shard) it loads into.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "vllm-doctor compares each checkpoint tensor with what the parameter's weight_loader wants at tensor-parallel "
        "size 1 (the fused shard's rows for qkv/gate_up) and watches the copies: a failed assert, a tensor only "
        "partly used (vLLM's loaders `narrow` silently), or one broadcast into a larger parameter."
    ),
    why=(
        "vLLM fails late with a bare `AssertionError` or `start (0) + length (256) exceeds dimension size (128)` that "
        "names no tensor — or, when a loader narrows a larger tensor, loads a slice without a word."
    ),
    example=(
        "model.layers.0.mlp.down_proj.weight stored transposed as [256, 128] (Conv1D-style) for a [128, 256] parameter."
    ),
    fix=(
        "Re-export the tensor with the shape the parameter wants (transpose Conv1D weights, check head_dim / "
        "num_key_value_heads / intermediate_size in config.json)."
    ),
    requires=("checkpoint", "weights-load"),
)
def checkpoint_shape_mismatch(facts: Facts, emit: Emit) -> Iterable[Finding]:
    got = known(facts.usable_weights())
    findings: list[Finding] = []
    for name, t in got.tensors.items():
        status = t.status
        if status not in ("shape_mismatch", "partial", "broadcast"):
            continue
        handed = t.handed_to
        param = handed[0].param if handed else (t.params[0] if t.params else None)
        shard = handed[0].shard if handed else None
        err = next((e for e in t.errors if e.kind == "shape"), None)
        want = (err.expected_shape if err is not None else None) or t.expected_shape
        actual = t.shape
        target = f"{param}" + (f" (shard {shard})" if shard is not None else "") if param else "its parameter"
        if status == "shape_mismatch":
            message = (
                f"checkpoint tensor {name} has shape {actual} but {target} wants {want if want else 'another shape'}"
            )
            if err is not None:
                message += f"; the loader fails with {err.error.splitlines()[0]}"
        elif status == "partial":
            message = (
                f"only {t.consumed} of {t.numel} elements of {name} {actual} are loaded into {target} (wants "
                f"{want}): vLLM's loader silently takes a slice"
            )
        else:
            message = (
                f"checkpoint tensor {name} {actual} is broadcast into {target} (wants {want}): every row gets the "
                f"same values"
            )
        transposed = bool(want and len(want) == 2 and list(reversed(want)) == actual)
        findings.append(
            emit.fail(
                message,
                name,
                {
                    "status": status,
                    "param": param,
                    "shard": shard,
                    "expected_shape": want,
                    "actual_shape": actual,
                    "transposed": transposed,
                    "error": err.error if err is not None else None,
                    "vllm_error": err.error if err is not None else "",
                },
                "the tensor is stored transposed: transpose it when exporting (or in load_weights)"
                if transposed
                else (
                    "re-export the tensor with the parameter's shape; check head_dim, num_key_value_heads and "
                    "intermediate_size in config.json"
                ),
            )
        )
    if not findings:
        yield emit.ok("every checkpoint tensor fits its parameter's shape", "checkpoint")
        return
    yield from capped_findings(findings, emit, "shape mismatches")


# (checkpoint dtype, parameter dtype) -> (severity, what is lost)
LOSSY: dict[tuple[str, str], tuple[Severity, str]] = {
    ("F64", "F32"): (Severity.INFO, "precision (52 -> 23 mantissa bits)"),
    ("F64", "BF16"): (Severity.INFO, "precision (52 -> 7 mantissa bits)"),
    ("F64", "F16"): (Severity.WARN, "precision, and values above 65504 overflow to inf in float16"),
    ("F32", "BF16"): (Severity.INFO, "precision (23 -> 7 mantissa bits); the range is kept"),
    ("F32", "F16"): (
        Severity.WARN,
        "precision, and values above 65504 (or below 6e-8) overflow to inf (or flush to 0) in float16",
    ),
    ("BF16", "F16"): (Severity.WARN, "range: bfloat16 values above 65504 overflow to inf in float16"),
    ("F16", "BF16"): (Severity.INFO, "precision (10 -> 7 mantissa bits)"),
}


def _config_dtype(config: dict[str, Any]) -> str | None:
    value = config.get("dtype") or config.get("torch_dtype")
    table = {"bfloat16": "BF16", "float16": "F16", "half": "F16", "float32": "F32", "float": "F32"}
    return table.get(str(value)) if value else None


@check(
    "VD304",
    "lossy-checkpoint-dtype",
    (
        "Checkpoint tensors are stored in a wider float type than the model's parameters (precision loss, fp16 "
        "overflow risk), or as integers for float parameters."
    ),
    severity=Severity.WARN,
    also=(Severity.ERROR,),
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "vLLM casts every tensor to the parameter's dtype while loading (the model dtype: `--dtype`, else "
        "config.json's `dtype`/`torch_dtype`). vllm-doctor compares the header dtypes with the dtypes of the "
        "parameters the tensors land in."
    ),
    why=(
        "float32 -> bfloat16 only loses precision; float32 or bfloat16 -> float16 can overflow (|x| > 65504 becomes "
        "inf) and produce NaNs at run time, with no message at load time."
    ),
    example="a float32 checkpoint (fine-tuning output) served with config.json dtype float16.",
    fix=(
        "Serve in bfloat16 (`--dtype bfloat16`) or float32, or convert the checkpoint deliberately (and check for "
        "values out of float16 range)."
    ),
    requires=("checkpoint", "weights-pass"),
)
def lossy_checkpoint_dtype(facts: Facts, emit: Emit) -> Iterable[Finding]:
    checkpoint = known(facts.checkpoint)
    data = facts.usable_weights()
    pairs: dict[tuple[str, str], list[str]] = {}
    source = "the parameters the tensors load into"
    if data is not None:
        params = data.params
        # VD314 names the layer built unquantized, VD315 a scale stored as an integer or boolean
        deferred = unquantized_tensors(facts) | malformed_tensors(facts)
        for name, t in data.tensors.items():
            if name in deferred:
                continue
            for pname in t.params[:1]:
                p = params.get(pname)
                if p is None:
                    continue
                pdt = _torch_to_st(p.dtype)
                pairs.setdefault((t.dtype, pdt), []).append(name)
    else:
        model = built(facts)
        resolved = model.dtype_name if model is not None else None  # vLLM's dtype for the model it built
        model_dtype = resolved or _config_dtype(facts.config)
        if model_dtype is None:
            yield emit.skip("the model dtype is unknown: " + (facts.weight_load_error or "config.json names no dtype"))
            return
        source = "the model dtype vLLM resolves" if resolved else "config.json's dtype (the model could not be built)"
        for header in checkpoint.tensors:
            if header.dtype in FLOAT_DTYPES:
                pairs.setdefault((header.dtype, model_dtype), []).append(header.name)
    found = False
    for (ck, pdt), names in sorted(pairs.items()):
        if ck not in FLOAT_DTYPES and ck != "BOOL" and pdt in FLOAT_DTYPES:
            found = True
            yield emit.fail(
                f"{len(names)} checkpoint tensor(s) stored as {ck} load into {pdt} parameters: the integers are cast "
                "to floats as they are (quantized weights loaded into an unquantized model?)",
                f"{ck}->{pdt}",
                {
                    "checkpoint_dtype": ck,
                    "parameter_dtype": pdt,
                    "tensors": len(names),
                    "examples": names[:5],
                    "compared_with": source,
                },
                (
                    "serve it with its quantization config (quantization_config in config.json / --quantization) or "
                    "export float weights"
                ),
                severity=Severity.ERROR,
            )
            continue
        lossy = LOSSY.get((ck, pdt))
        if lossy is None:
            continue
        found = True
        severity, lost = lossy
        yield emit.warn(
            f"{len(names)} checkpoint tensor(s) stored as {ck} load into {pdt} parameters: loses {lost}",
            f"{ck}->{pdt}",
            {
                "checkpoint_dtype": ck,
                "parameter_dtype": pdt,
                "tensors": len(names),
                "examples": names[:5],
                "compared_with": source,
            },
            "serve with --dtype bfloat16 (or float32)"
            if pdt == "F16"
            else "expected when serving a float32 checkpoint in bfloat16; pass --dtype float32 to keep full precision",
            severity=severity,
        )
    if not found:
        yield emit.ok(
            "no checkpoint tensor loses precision or range when it is cast to its parameter's dtype", "checkpoint"
        )


def _torch_to_st(dtype: str) -> str:
    return {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}.get(dtype, dtype.upper())
