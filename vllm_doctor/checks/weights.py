"""VD3xx: will the checkpoint fill the model? (safetensors headers + a meta-device load_weights run)

VD305-VD308 need only config.json and the headers (fast pass). VD301-VD304 need the weights
pass: the model built on the meta device in a fresh process, its real ``load_weights`` driven
with meta tensors of the checkpoint's names, shapes and dtypes (compat/weights.py). When the
model cannot be built those four say ``skip`` with the reason; the others still run.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from vllm_doctor.checks.base import Emit, capped_findings, check, gate, informative_line, known
from vllm_doctor.facts.checkpoint import FLOAT_DTYPES, INDEX_NAME, OUTSIDE_KINDS
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Finding, Severity, Stage

EXPECTED_SKIPS = {"inv_freq", "cos_cached", "sin_cached"}  # rotary caches vLLM recomputes
NOT_INITIALIZED = "Following weights were not initialized from checkpoint: {...}"
REFS_LOADING = ("vllm/model_executor/model_loader/default_loader.py:track_weights_loading",)


@gate("checkpoint-files")
def _checkpoint_read(facts: Facts, emit: Emit) -> Finding | None:
    """The fast pass read a safetensors checkpoint (its files may still be broken)."""
    ck = facts.checkpoint
    if ck is None:
        return emit.skip("the checkpoint was not read")
    if ck.format == "none":
        return emit.not_applicable("no checkpoint files (*.safetensors, *.bin, *.pt) in the model directory")
    if ck.format != "safetensors":
        return emit.skip(f"the checkpoint is {ck.format} (pickle); vllm-doctor reads safetensors headers only")
    return None


@gate("checkpoint")
def _checkpoint_tensors(facts: Facts, emit: Emit) -> Finding | None:
    """As ``checkpoint-files``, and at least one file could be read."""
    instead = _checkpoint_read(facts, emit)
    if instead is None and not known(facts.checkpoint).tensors:
        return emit.skip("no checkpoint file could be read (see VD306/VD308)")
    return instead


@gate("weights-pass", after_import=True)
def _weights_pass_over(facts: Facts, emit: Emit) -> None:
    """Nothing to skip for: the check uses the weights pass's result where there is one."""
    return None


@gate("weights-load", after_import=True)
def _weights_loaded(facts: Facts, emit: Emit) -> Finding | None:
    """The weights pass built the model on the meta device and drove its load_weights."""
    if facts.usable_weight_load() is None:
        reason = facts.weight_load_error or "the weights pass did not run"
        return emit.skip(f"the model could not be built and loaded on the meta device: {reason}")
    return None


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
    got = known(facts.usable_weight_load())
    params: dict[str, Any] = got["params"]
    tensors: dict[str, Any] = got["tensors"]
    unused = [
        n for n, t in tensors.items() if t["status"] in ("skipped", "raised", "handed_not_written", "shape_mismatch")
    ]
    unread_prefixes = {_module_prefix(n) for n in known(facts.checkpoint).unread_tensors}
    findings: list[Finding] = []
    unverifiable: list[str] = []
    meta_limited: list[str] = []
    for name, p in sorted(params.items()):
        if p["written"]:
            continue
        if _module_prefix(name) in unread_prefixes:
            unverifiable.append(name)
            continue
        failed = p.get("failed_from") or []
        if failed and all(tensors.get(t, {}).get("status") == "unverifiable" for t in failed):
            meta_limited.append(name)
            continue
        vllm_notices = p["in_returned"] is False and not p["vllm_exempt"]
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
        elif p.get("shards_missing") and p.get("shards_loaded"):
            message = (
                f"{name}: shard(s) {_shard_text(p['shards_missing'])} of the fused parameter are never loaded "
                f"(loaded: {_shard_text(p['shards_loaded'])}; {p['covered']} of {p['numel']} elements written); "
                f"{consequence}"
            )
        elif p["covered"]:
            message = (
                f"{name}: only {p['covered']} of {p['numel']} elements are written by the checkpoint; {consequence}"
            )
        else:
            message = f"no checkpoint tensor fills {name}; {consequence}"
        same_block = [t for t in unused if _module_prefix(t) == _module_prefix(name)]
        related = failed or difflib.get_close_matches(name, same_block, n=3, cutoff=0.5)
        hint = ""
        if related and not failed:
            hint = f"checkpoint tensor(s) {', '.join(related)} did not load (see VD302/VD303); "
        if failed:
            hint = "fix the tensor's shape or name (VD302/VD303) and this parameter is filled"
        elif p.get("shards_missing"):
            hint += (
                f"add the tensor for shard {_shard_text(p['shards_missing'])} to the checkpoint, or map its name in "
                f"`stacked_params_mapping`"
            )
        else:
            hint += "add the tensor to the checkpoint or make load_weights map its checkpoint name to this parameter"
        findings.append(
            emit.fail(
                message,
                name,
                {
                    "shape": p["shape"],
                    "dtype": p["dtype"],
                    "elements_written": p["covered"],
                    "numel": p["numel"],
                    "shards_expected": p["shards_expected"],
                    "shards_loaded": p["shards_loaded"],
                    "shards_missing": p["shards_missing"],
                    "sources": p["sources"],
                    "failed_from": failed,
                    "load_weights_reports_it": p["in_returned"],
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
    if not findings and not unverifiable and not meta_limited:
        yield emit.ok(f"all {len(params)} parameters are filled from {len(tensors)} checkpoint tensors", "model")
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
    got = known(facts.usable_weight_load())
    tensors: dict[str, Any] = got["tensors"]
    nearest: dict[str, list[str]] = got.get("nearest", {})
    findings: list[Finding] = []
    unverifiable: list[str] = []
    for err in got.get("load_weights", {}).get("global_errors", []):
        findings.append(
            emit.fail(
                f"load_weights raised before taking any checkpoint tensor: {err.get('error')}",
                "load_weights",
                {"error": err.get("error"), "traceback": err.get("traceback", "")},
                "run load_weights on a small model in a debugger; the traceback shows where",
            )
        )
    for name, t in tensors.items():
        status = t["status"]
        if status == "unverifiable":
            unverifiable.append(name)
            continue
        if status not in ("raised", "skipped", "handed_not_written"):
            continue
        evidence: dict[str, Any] = {"status": status, "shape": t["shape"], "dtype": t["dtype"]}
        if status == "raised":
            err = next(e for e in t["errors"] if e["kind"] == "raised")
            looked = err.get("looked_up")
            evidence.update(
                error=err["error"],
                looked_up=looked,
                where=err["where"],
                traceback=err.get("traceback", ""),
                vllm_error=err["error"],
            )
            near = nearest.get(looked or "", []) or nearest.get(name, [])
            evidence["nearest_parameters"] = near
            lookup = f" (it looked up {looked!r})" if looked and looked != name else ""
            hint = (
                f"the model has {near[0]!r}: map the checkpoint name onto it"
                if near
                else "map the name in load_weights or drop the tensor"
            )
            findings.append(
                emit.fail(
                    f"load_weights raises {err['error'].splitlines()[0]} for checkpoint tensor {name}{lookup}",
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
            tied = name.startswith("lm_head.") and _text_config(facts.config).get("tie_word_embeddings") is True
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
            evidence["handed_to"] = t.get("handed_to", [])
            findings.append(
                emit.warn(
                    f"checkpoint tensor {name} is handed to a weight_loader that writes nothing",
                    name,
                    evidence,
                    "check the parameter's weight_loader: it returns without copying the tensor",
                    severity=Severity.WARN,
                )
            )
    if unverifiable:
        yield emit.skip(
            (
                f"{len(unverifiable)} tensor(s) use operations that meta tensors cannot run; not verified: "
                f"{', '.join(unverifiable[:5])}"
            ),
            "(tensors not verifiable on the meta device)",
        )
    elif not findings:
        yield emit.ok(f"load_weights loads all {len(tensors)} checkpoint tensors", "checkpoint")
        return
    yield from capped_findings(findings, emit, "checkpoint tensors not consumed")


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
    got = known(facts.usable_weight_load())
    findings: list[Finding] = []
    for name, t in got["tensors"].items():
        status = t["status"]
        if status not in ("shape_mismatch", "partial", "broadcast"):
            continue
        handed = t.get("handed_to") or []
        param = handed[0]["param"] if handed else (t["params"][0] if t["params"] else None)
        shard = handed[0]["shard"] if handed else None
        err = next((e for e in t["errors"] if e["kind"] == "shape"), None)
        want = (err or {}).get("expected_shape") or t.get("expected_shape")
        actual = t["shape"]
        target = f"{param}" + (f" (shard {shard})" if shard is not None else "") if param else "its parameter"
        if status == "shape_mismatch":
            message = (
                f"checkpoint tensor {name} has shape {actual} but {target} wants {want if want else 'another shape'}"
            )
            if err:
                message += f"; the loader fails with {err['error'].splitlines()[0]}"
        elif status == "partial":
            message = (
                f"only {t['consumed']} of {t['numel']} elements of {name} {actual} are loaded into {target} (wants "
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
                    "error": (err or {}).get("error"),
                    "vllm_error": (err or {}).get("error") or "",
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
    data = facts.usable_weight_load()
    pairs: dict[tuple[str, str], list[str]] = {}
    source = "the parameters the tensors load into"
    if data is not None:
        params = data["params"]
        for name, t in data["tensors"].items():
            for pname in t["params"][:1]:
                p = params.get(pname)
                if p is None:
                    continue
                pdt = _torch_to_st(p["dtype"])
                pairs.setdefault((t["dtype"], pdt), []).append(name)
    else:
        model = (facts.weight_load or {}).get("model") or {}
        model_dtype = model.get("dtype_name") or _config_dtype(facts.config)
        if model_dtype is None:
            yield emit.skip("the model dtype is unknown: " + (facts.weight_load_error or "config.json names no dtype"))
            return
        source = (
            "the model dtype vLLM resolves"
            if model.get("dtype_name")
            else "config.json's dtype (the model could not be built)"
        )
        for t in checkpoint.tensors:
            if t.dtype in FLOAT_DTYPES:
                pairs.setdefault((t.dtype, model_dtype), []).append(t.name)
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


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: config.json itself, or its `text_config` / `llm_config`."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and "num_attention_heads" in sub:
            return sub
    return config


def _int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def tp_problems(config: dict[str, Any], tp: int) -> list[dict[str, Any]]:
    """What vLLM's layers cannot split at tensor-parallel size ``tp`` (pure logic on config.json)."""
    cfg = _text_config(config)
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
    layers = _int(_text_config(config), "num_hidden_layers")
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
    cfg = _text_config(facts.config)
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


@check(
    "VD306",
    "broken-shard-index",
    (
        "model.safetensors.index.json names a missing file or a path outside the model directory (or a file links "
        "outside it)."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "For a sharded checkpoint vLLM globs the top-level *.safetensors files and keeps those the index's "
        "`weight_map` names. vllm-doctor checks every entry: the file must exist, be a top-level file of the model "
        "directory, and stay inside it (no `../`, absolute paths or escaping symlinks; such paths are never opened). "
        "It also flags tensors the index places in a file that lacks them and tensors stored twice."
    ),
    why=(
        "vLLM 0.32 stops with `FileNotFoundError: Weight files referenced in index but missing: {...}` after the "
        "model was built; an index path outside the directory can make a loader read files the model's author did not "
        "ship."
    ),
    example='"weight_map": {"lm_head.weight": "../outside.safetensors", ...}',
    fix=(
        "Regenerate the index (e.g. save_pretrained with max_shard_size), or fix the file names in `weight_map` to "
        "the shard files in the directory."
    ),
    requires=("checkpoint-files",),
)
def broken_shard_index(facts: Facts, emit: Emit) -> Iterable[Finding]:
    checkpoint = known(facts.checkpoint)
    problems = [p for p in checkpoint.problems if p.scope == "index"]
    warn_kinds = {"duplicate-tensor", "index-tensor-not-in-file"}
    findings: list[Finding] = []
    for p in problems:
        evidence = {"kind": p.kind, **p.evidence, "vllm_error": p.vllm_error}
        if p.kind in warn_kinds:
            findings.append(
                emit.warn(
                    p.message, p.subject, evidence, "regenerate the index from the shard files", severity=Severity.WARN
                )
            )
        else:
            hint = (
                "use plain file names of shards in the model directory in weight_map"
                if p.kind in OUTSIDE_KINDS or p.kind in ("index-path-not-top-level", "index-path-invalid")
                else "add the missing shard file or regenerate the index"
            )
            findings.append(emit.fail(p.message, p.subject, evidence, hint))
    yield from capped_findings(findings, emit, "shard index problems")
    if not problems:
        index = checkpoint.index
        if index is None:
            yield emit.ok(
                f"single-file or unindexed checkpoint ({len(checkpoint.files)} file(s)); no index to check",
                "checkpoint",
            )
        else:
            yield emit.ok(
                (
                    f"{INDEX_NAME}: {index.get('entries')} entries in {len(index.get('files', []))} file(s), all "
                    f"present and inside the model directory"
                ),
                INDEX_NAME,
            )


@check(
    "VD307",
    "tie-word-embeddings-mismatch",
    "`tie_word_embeddings` disagrees with the presence of `lm_head.weight` in the checkpoint.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "With `tie_word_embeddings: true` the LM head reuses the input embedding and models skip `lm_head.weight`; "
        "with `false` the checkpoint must carry `lm_head.weight`."
    ),
    why=(
        "Untied without lm_head.weight: vLLM leaves the LM head uninitialised without a word (embedding-type layers "
        "are exempt from its missing-weight check) and generates garbage. Tied with a separate lm_head.weight: the "
        "trained LM head is silently ignored."
    ),
    example=(
        'config.json "tie_word_embeddings": false, checkpoint without lm_head.weight (a tied model exported with the '
        "flag dropped)."
    ),
    fix=(
        "Set tie_word_embeddings to what the model was trained with: true if the head is the embedding, false (and "
        "ship lm_head.weight) if not."
    ),
    requires=("checkpoint-files",),
)
def tie_word_embeddings_mismatch(facts: Facts, emit: Emit) -> Iterable[Finding]:
    checkpoint = known(facts.checkpoint)
    cfg = _text_config(facts.config)
    tie = cfg.get("tie_word_embeddings", facts.config.get("tie_word_embeddings"))
    source = "config.json"
    if not isinstance(tie, bool):
        model = (facts.weight_load or {}).get("model") or {}
        tie = (model.get("hf") or {}).get("tie_word_embeddings")
        source = "the config class's default (config.json does not set it)"
        if not isinstance(tie, bool):
            yield emit.skip(
                "config.json does not set tie_word_embeddings and its config class default is unknown (needs the "
                "weights pass)"
            )
            return
    names = {t.name for t in checkpoint.tensors}
    index = checkpoint.index
    complete = checkpoint.complete
    has_lm_head = "lm_head.weight" in names
    if not has_lm_head and not complete:
        yield emit.skip("part of the checkpoint could not be read (see VD306/VD308); lm_head.weight may be in it")
        return
    has_embed = any(n.endswith(("embed_tokens.weight", "wte.weight")) for n in names)
    subject = "config.json:tie_word_embeddings"
    evidence = {
        "tie_word_embeddings": tie,
        "from": source,
        "lm_head_in_checkpoint": has_lm_head,
        "indexed": index is not None,
    }
    if tie is False and not has_lm_head and has_embed:
        yield emit.fail(
            (
                "tie_word_embeddings is false but the checkpoint has no lm_head.weight: the LM head stays "
                "uninitialised and vLLM does not notice"
            ),
            subject,
            evidence,
            (
                'if the model was trained with a tied head, set "tie_word_embeddings": true; otherwise export '
                "lm_head.weight"
            ),
        )
    elif tie is True and has_lm_head:
        hf = ((facts.weight_load or {}).get("model") or {}).get("hf") or {}
        unties = hf.get("untied_by_checkpoint")
        evidence["vllm_unties"] = unties
        if unties:
            yield emit.warn(
                "tie_word_embeddings is true but the checkpoint carries its own lm_head.weight: this vLLM notices, "
                "builds the head untied and loads it (re-tying only if it equals the embedding); older vLLM "
                "versions tie and silently ignore it",
                subject,
                evidence,
                'make config.json say what the model is: "tie_word_embeddings": false if lm_head.weight differs from '
                "the embedding, "
                "else drop lm_head.weight from the checkpoint",
                severity=Severity.INFO,
            )
        else:
            untie_known = unties is False
            yield emit.warn(
                "tie_word_embeddings is true but the checkpoint carries its own lm_head.weight: "
                + (
                    "this vLLM ties the head to the embedding and ignores it"
                    if untie_known
                    else (
                        "vLLM ties the head to the embedding and ignores it (vLLM 0.32 and later load it untied "
                        "instead)"
                    )
                ),
                subject,
                evidence,
                'if lm_head.weight differs from the embedding (an untied model), set "tie_word_embeddings": false',
                severity=Severity.WARN,
            )
    else:
        yield emit.ok(
            f"tie_word_embeddings={tie} and lm_head.weight {'present' if has_lm_head else 'absent'} agree", subject
        )


@check(
    "VD308",
    "safetensors-file-unreadable",
    (
        "A safetensors file is corrupt: truncated header, header length past end of file, bad JSON or offsets, data "
        "cut short."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="weights",
    what=(
        "A safetensors file starts with an 8-byte little-endian header length, then a JSON header of tensor names, "
        "dtypes, shapes and data offsets that must tile the rest of the file exactly. vllm-doctor validates the "
        "header (reading no tensor data) and cross-checks it with the safetensors library that vLLM uses."
    ),
    why=(
        "vLLM finds out only when it reaches the file during loading, after building the model: `SafetensorError: "
        "Error while deserializing header: ...` without saying which of many shards is broken. A download cut short "
        "is the usual cause."
    ),
    example="model-00003-of-00004.safetensors is 2 GB shorter than its header says (interrupted download).",
    fix="Download or copy the named file again (compare its size or hash with the source).",
    requires=("checkpoint-files",),
)
def safetensors_file_unreadable(facts: Facts, emit: Emit) -> Iterable[Finding]:
    checkpoint = known(facts.checkpoint)
    problems = [p for p in checkpoint.problems if p.scope == "file"]
    yield from capped_findings(
        (
            emit.fail(
                p.message,
                p.subject,
                {"kind": p.kind, **p.evidence, "vllm_error": p.vllm_error},
                "download or copy this file again; compare its size with the source",
            )
            for p in problems
        ),
        emit,
        "unreadable safetensors files",
    )
    if not problems:
        files = checkpoint.files
        yield emit.ok(
            f"{len(files)} safetensors file(s), headers valid ({len(checkpoint.tensors)} tensors)", "checkpoint"
        )


# VD309: the sizes a model is built from; each must be a positive whole number below a plausibility bound
SIZE_LIMITS: dict[str, int] = {
    "num_hidden_layers": 10_000,
    "hidden_size": 1 << 20,
    "num_attention_heads": 1 << 16,
    "num_key_value_heads": 1 << 16,
    "vocab_size": 1 << 24,
    "intermediate_size": 1 << 22,
}
MAX_PARAMETERS = 10**15  # the largest published models have a few 10**12
SUB_CONFIGS = ("text_config", "llm_config", "language_config")
_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}


def _shown(value: Any, limit: int = 60) -> str:
    """A config value as config.json spells it, cut to ``limit`` characters."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    elif isinstance(value, (int, float)):
        text = repr(value)
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _size_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be the size ``key``, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {_JSON_TYPES.get(type(value), type(value).__name__)}, not a whole number"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "is not a number"
        return "is a float, not a whole number" + (f" (write {int(value)})" if value.is_integer() else "")
    if value <= 0:
        return "must be at least 1" if value == 0 else "is negative"
    if value > SIZE_LIMITS[key]:
        return f"is over {SIZE_LIMITS[key]:,}, vllm-doctor's plausibility limit for {key}"
    return None


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
        sizes: dict[str, int] = {}
        for key in SIZE_LIMITS:
            value = cfg.get(key)
            if value is None:  # absent, or null: the config class's default applies
                continue
            why = _size_problem(key, value)
            if why is None:
                sizes[key] = value
            else:
                out.append({"key": prefix + key, "value": _shown(value), "why": why})
        total = _parameter_estimate(sizes)
        if total is not None and total > MAX_PARAMETERS:
            out.append(
                {
                    "key": prefix.rstrip(".") or "sizes",
                    "value": ", ".join(f"{k} {v}" for k, v in sizes.items()),
                    "why": f"these sizes make a model of about {total:.1e} parameters (over {MAX_PARAMETERS:.0e})",
                }
            )
    return out


# a float setting in which Infinity is as wrong as NaN: a norm's epsilon, rope's base and scaling, dropout
FLOAT_SETTING = re.compile(r"(eps|epsilon|theta|factor|dropout|pdrop|initializer_range|mscale|beta_fast|beta_slow)$")


def config_non_finite(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every NaN / Infinity / -Infinity number anywhere in config.json (Python's json reads them;
    JSON has no such values), in file order. Each: key (dotted, ``[i]`` for list items), value,
    why, severity ("error": NaN anywhere, Infinity in a float setting; "warn": Infinity elsewhere).
    The model sizes are :func:`config_size_problems`'s and ``architectures`` VD108's: not here."""
    skipped = {"architectures", *SIZE_LIMITS, *(f"{sub}.{key}" for sub in SUB_CONFIGS for key in SIZE_LIMITS)}
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
    return any(cfg.get(key) is not None for cfg in scopes for key in SIZE_LIMITS)


@check(
    "VD309",
    "config-size-invalid",
    (
        "A model size in config.json (layers, hidden size, heads, KV heads, vocabulary, MLP size) is zero, negative, "
        "not a whole number, NaN/Infinity or absurdly large; or another number in it (rope_theta, rms_norm_eps, ...) "
        "is NaN/Infinity."
    ),
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="config",
    what=(
        "num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, vocab_size and intermediate_size "
        "(in config.json and in its text_config / llm_config / language_config) must be positive whole numbers. "
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
            "write the size the model was trained with as a positive integer",
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


_BUILD_STAGES = {
    "config": ("building vLLM's config for this model directory", "vLLM's config"),
    "class": ("resolving the model class", "the model class"),
    "build": ("building the model on the meta device (vLLM's initialize_model)", "the model's construction"),
    "load": ("driving load_weights", "load_weights"),
}


@check(
    "VD310",
    "model-build-failed",
    "vLLM cannot build the model class under this config.json, or load_weights raises, in the weights pass.",
    severity=Severity.ERROR,
    stage=Stage.STATIC,
    topic="contract",
    what=(
        "The weights pass builds the model the way vLLM's loader does (EngineArgs -> VllmConfig -> "
        "get_model_architecture -> initialize_model, on the meta device, so no memory is spent) and drives its "
        "load_weights with the checkpoint's tensor names and shapes. When that raises, this is the error vLLM will "
        "raise at start-up, with the model's own line where the traceback has one. When another check already "
        "names the cause (the class cannot be imported or resolved, its __init__ signature, config.json rejected "
        "or with absurd sizes, no load_weights), this check defers to it instead of reporting the cause twice."
    ),
    why=(
        "Without it, a model whose __init__ raises under the real config (an attribute a ported config lacks, a "
        "size that does not divide, a layer built with arguments vLLM's layer refuses) leaves every weight check "
        "skipped and the run says nothing; the engine then fails at start-up, far from the cause."
    ),
    example=(
        "failed while building the model on the meta device: TypeError: 'NoneType' object is not subscriptable "
        "at my_model/model.py:61 in __init__"
    ),
    fix=(
        "Open the line named: it runs when vLLM constructs the model, on every device. Read sizes and options from "
        "the config the way vLLM's own models do (getattr with a default for optional keys such as rope_scaling), "
        "and build layers with the arguments vLLM's layer classes take."
    ),
    requires=("weights-pass",),
    # VD2: the class's interface (vLLM's config refuses a class whose forward or compute_logits it rejects)
    defers_to=("VD101", "VD103", "VD104", "VD105", "VD106", "VD108", "VD109", "VD111", "VD2", "VD309"),
)
def model_build_failed(facts: Facts, emit: Emit) -> Iterable[Finding]:
    data = facts.weight_load
    if data is None:
        yield emit.not_applicable(facts.weight_load_error or "the weights pass did not run")
        return
    err = data.get("error")
    if not isinstance(err, dict):
        yield emit.ok("vLLM built the model on the meta device and load_weights ran to the end")
        return
    stage = str(err.get("stage"))
    if stage not in _BUILD_STAGES:  # "import" / "internal": the pass itself failed (VD100)
        yield emit.not_applicable(f"the weights pass itself did not complete (VD100): {err.get('summary')}")
        return
    doing, subject = _BUILD_STAGES[stage]
    where = err.get("where")
    summary = informative_line(str(err.get("summary")))
    yield emit.fail(
        f"failed while {doing}: {summary}" + (f" at {where}" if where else ""),
        subject,
        {
            "stage": stage,
            "vllm_error": str(err.get("summary"))[:3000],
            "where": where,
            "traceback": str(err.get("traceback"))[-4000:],
        },
        f"fix the line named ({where})"
        if where
        else "read the traceback in the evidence: the innermost frame is where it failed",
    )
