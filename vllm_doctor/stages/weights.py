"""The weights pass, wired into :func:`vllm_doctor.stages.static.diagnose` by two calls.

:func:`start_weights_pass` runs in the fast pass: it reads the safetensors headers
(milliseconds, no tensor data) into ``facts.checkpoint`` and, unless ``--fast``, starts the
meta-device load (stages/weights_trace.py) in a child that runs *while* the import pass runs.
:func:`finish_weights_pass` waits for that child and puts its result into the facts before any
check runs; the VD3xx checks only read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.analysis.records import ParamMapping, TensorMapping, WeightsBuilt, WeightsLoaded, WeightsReport
from vllm_doctor.checks.base import codes_for, informative_line, needs_import
from vllm_doctor.checks.config_sizes import config_size_problems
from vllm_doctor.facts import wire
from vllm_doctor.facts.checkpoint import OUTSIDE_KINDS
from vllm_doctor.facts.perf import PerfAnatomy
from vllm_doctor.facts.quant_checkpoint import quantization_config
from vllm_doctor.facts.static import BuildError, Facts, ParamLoad, TensorLoad
from vllm_doctor.facts.user_regex import unbounded_patterns
from vllm_doctor.model import Stage
from vllm_doctor.probes.model_files import handover_refusal, refused_files
from vllm_doctor.probes.safetensors_header import read_checkpoint
from vllm_doctor.stages.child import ChildJob

# the weights pass's checks: the weights topic and the static ranks check (VD305; report.facts["weights"]
# carries the tensor-parallel size it checks); those that wait for the meta-device load need it
WEIGHT_CODES = codes_for("weights", "ranks", stage=Stage.STATIC)
LOAD_CODES = tuple(code for code in codes_for("weights") if needs_import(code))
# the performance lint reads the same meta-device build's module tree
PERF_CODES = codes_for("performance", stage=Stage.STATIC)


def size_block(config: dict[str, Any]) -> str | None:
    """Why no model may be built from ``config`` (VD309's sizes), or None."""
    bad = config_size_problems(config)
    if not bad:
        return None
    listed = "; ".join(f"{p['key']} = {p['value']}" for p in bad[:5]) + (
        f"; {len(bad) - 5} more" if len(bad) > 5 else ""
    )
    return f"config.json has model sizes no model can be built from ({listed}; see VD309): the model was not built"


def pattern_block(config: dict[str, Any]) -> str | None:
    """Why no model may be built from ``config`` because vLLM would match a regular expression of
    its quantization config that is over vllm-doctor's bound (VD316; facts/user_regex.py), or None."""
    qconfig = quantization_config(config)
    bad = unbounded_patterns(qconfig) if qconfig is not None else []
    if not bad:
        return None
    listed = "; ".join(f"{p['key']} = {p['value']!r}" for p in bad[:3]) + (
        f"; {len(bad) - 3} more" if len(bad) > 3 else ""
    )
    return (
        f"config.json's quantization_config has a regular expression vLLM would match against every layer for as "
        f"long as that takes ({listed}; see VD316): the model was not built"
    )


def build_block(config: dict[str, Any]) -> str | None:
    """Why vllm-doctor does not build a model from ``config`` at all (its sizes, its patterns), or None."""
    return size_block(config) or pattern_block(config)


def start_weights_pass(
    facts: Facts, options: Any, codes: Iterable[str], say: Callable[[str], None] | None = None
) -> ChildJob | None:
    """The model directory's files vetted (``facts.refused_files``) and its headers read now; the
    meta-device load started in the background when a VD301-VD304 check wants it (the job to hand to
    :func:`finish_weights_pass`), unless the directory or config.json may not be handed to vLLM."""
    codes = set(codes)
    # the files vLLM would open on the doctor's behalf, vetted before any child gets the directory (VD113)
    refused = refused_files(facts.model_dir)
    facts.refused_files = [r.to_dict() for r in refused]
    facts.tensor_parallel_size = int(getattr(options, "tensor_parallel_size", 1) or 1)
    facts.pipeline_parallel_size = int(getattr(options, "pipeline_parallel_size", 1) or 1)
    facts.enable_expert_parallel = bool(getattr(options, "enable_expert_parallel", False))
    if not codes & {*WEIGHT_CODES, *PERF_CODES}:
        return None
    facts.checkpoint = read_checkpoint(facts.model_dir)
    if not codes & {*LOAD_CODES, *PERF_CODES}:
        return None
    if getattr(options, "fast", False):
        facts.weight_load_error = "skipped by --fast (the weights pass imports vLLM)"
        return None
    # a checkpoint file linking out is VD306's: vLLM is asked for no header then (paths_escape below)
    blocked = build_block(facts.config) or handover_refusal([r for r in refused if not r.checkpoint])
    if blocked:
        facts.weight_load_error = blocked
        return None
    checkpoint = facts.checkpoint
    if checkpoint.format != "safetensors":
        facts.weight_load_error = (
            f"no safetensors checkpoint in the model directory (found: {checkpoint.format}); "
            "vllm-doctor reads safetensors headers only, never pickled .bin/.pt files"
        )
        return None
    tensors = checkpoint.tensors
    if not tensors:
        facts.weight_load_error = "no checkpoint file could be read (see VD306/VD308)"
        return None
    request = {
        "model_dir": facts.model_dir,
        "architectures": facts.architectures,
        "trust_remote_code": facts.trust_remote_code,
        # a path escapes the model dir: vLLM's config code must not read checkpoint headers either
        "paths_escape": any(p.kind in OUTSIDE_KINDS for p in checkpoint.problems),
        "tensors": [{"name": t.name, "shape": t.shape, "dtype": t.dtype} for t in tensors],
    }
    timeout = float(getattr(options, "import_timeout", 180.0))
    job = ChildJob(
        "weights",
        request,
        timeout=timeout,
        what="the weights pass",
        memory_limit=getattr(options, "max_memory", "default"),
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    if say is not None:
        say(
            f"weights pass: {len(tensors)} tensors from {len(checkpoint.files)} file(s) headers; "
            "building the model on the meta device in a fresh process ..."
        )
    return job


@dataclass(frozen=True)
class WeightsPassReply:
    """The parts of the weights pass's reply that this stage reads (the checks read the reply's
    record, :meth:`Facts.weights_reply`); what the report shows as it came is Any."""

    error: BuildError | None = field(default=None, metadata=wire.rules(empty_none=True))  # {}: none
    perf: PerfAnatomy | None = None  # the performance lint's module tree of the meta-device build
    perf_error: str | None = None
    model: Any = None
    timings: dict[str, Any] = field(default_factory=dict)
    load_weights: Any = None
    tracer_errors: Any = None


def finish_weights_pass(facts: Facts, job: ChildJob | None) -> None:
    """Wait for the meta-device load and put its result (or why there is none) into ``facts``."""
    if job is None:
        return
    res = job.result()
    facts.weight_load_seconds = round(res.seconds, 3)
    if res.ok:
        facts.weight_load = res.data
        reply = wire.read(WeightsPassReply, res.data)
        if reply.perf is not None:
            facts.perf = reply.perf
        else:
            facts.perf_error = reply.perf_error
        err = reply.error
        if err is not None:
            stage = {
                "import": "importing vLLM",
                "config": "building vLLM's config for this model directory",
                "build": "building the model class on the meta device",
                "load": "driving load_weights",
                "internal": "the weights pass itself",
            }.get(err.stage or "", err.stage)
            facts.weight_load_error = f"failed while {stage}: {informative_line(str(err.summary))}"
            if err.stage in ("import", "internal"):  # the pass itself, not the model, failed
                facts.pass_failures.append({"pass": "the weights pass", "error": facts.weight_load_error})
    else:
        error = res.error or "the weights pass failed"
        if res.timed_out:
            error += " (building the model or its load_weights may hang)"
        tail = res.log_tail.strip().splitlines()[-3:]
        facts.weight_load_error = error + ("\n" + "\n".join(tail) if tail else "")
        facts.pass_failures.append({"pass": "the weights pass", "error": facts.weight_load_error})


def weights_report(facts: Facts) -> WeightsReport | None:
    """report.facts["weights"]: the checkpoint as read, and the full tensor -> parameter mapping."""
    if facts.checkpoint is None:
        return None
    data = facts.weight_load
    built = loaded = tracer_errors = None
    if data is not None:
        reply = wire.read(WeightsPassReply, data)
        built = WeightsBuilt(model=reply.model, timings={**reply.timings, "probe_wall_s": facts.weight_load_seconds})
        loads = facts.weights_reply()
        # the reply has tensors: the model was built and load_weights driven (it may have raised)
        if loads is not None and "tensors" in data:
            loaded = WeightsLoaded(
                load_weights=reply.load_weights,
                mapping={name: _mapping_entry(t) for name, t in loads.tensors.items()},
                params={name: _param_entry(p) for name, p in loads.params.items()},
            )
            tracer_errors = reply.tracer_errors or None
    return WeightsReport(
        checkpoint=facts.checkpoint.to_dict(),
        tensor_parallel_size=facts.tensor_parallel_size,
        load_error=facts.weight_load_error or None,
        built=built,
        loaded=loaded,
        tracer_errors=tracer_errors,
    )


def _param_entry(p: ParamLoad) -> ParamMapping:
    """report.facts["weights"]["params"][name]: what the report keeps of one parameter's record."""
    return ParamMapping(
        shape=p.shape,
        dtype=p.dtype,
        written=p.written,
        covered=p.covered,
        numel=p.numel,
        sources=p.sources,
        shards_expected=p.shards_expected,
        shards_missing=p.shards_missing,
        loader=p.loader,
        in_returned=p.in_returned,
        vllm_exempt=p.vllm_exempt,
    )


def _mapping_entry(t: TensorLoad) -> TensorMapping:
    """report.facts["weights"]["mapping"][tensor]: where one checkpoint tensor went."""
    first = t.errors[0] if t.errors else None
    return TensorMapping(
        status=t.status,
        params=t.params,
        shards=sorted({str(h.shard) for h in t.handed_to if h.shard is not None}),
        shape=t.shape,
        dtype=t.dtype,
        error=first.error if first is not None else None,
        looked_up=first.looked_up if first is not None and first.looked_up else None,
    )
