"""The Python API: ``vllm_doctor.check(path)`` and friends, from a user's own script or test.

Every function here runs vLLM (and transformers) in child processes of its own, time-boxed:
the caller's process never imports vLLM.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from vllm_doctor.constants import DEFAULT_SAMPLE_EVERY, STEP_CLOCKS
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import Report
from vllm_doctor.report.write import write_reports
from vllm_doctor.stages.engine import BLOCKING, EngineOptions, Workload, diagnose_engine
from vllm_doctor.stages.options import from_keywords, keywords_doc, option_names
from vllm_doctor.stages.parity import (
    DEFAULT_PROMPTS,
    ParityEngine,
    ParityOptions,
    ParityResult,
    ParityUnavailable,
    engine_options,
    run_parity,
)
from vllm_doctor.stages.static import CheckOptions, caller_registry, diagnose
from vllm_doctor.stages.twin import profile_with_twin

# static findings that keep the engine stage from starting: an engine assertion fails on them too
ENGINE_BLOCKING_CODES = tuple(sorted(BLOCKING))

__all__ = [
    "DEFAULT_PROMPTS",
    "ENGINE_BLOCKING_CODES",
    "EngineOptions",
    "ParityEngine",
    "ParityResult",
    "ParityUnavailable",
    "check",
    "check_engine",
    "compare_with_reference",
    "engine_option_names",
    "parity_engine_key",
    "profile",
    "start_parity_engine",
]


def engine_option_names() -> list[str]:
    """The engine options' names: :func:`check_engine`'s and :func:`profile`'s keywords, the command
    line's flags (``max_model_len`` -> ``--max-model-len``) and the pytest plugin's options
    (``--vllm-doctor-max-model-len``), all from :class:`EngineOptions`."""
    return option_names()


def check(
    model: str,
    *,
    trust_remote_code: bool = False,
    fast: bool = False,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    import_timeout: float = 180.0,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    enable_expert_parallel: bool = False,
) -> Report:
    """Run the static checks on a model directory and return the :class:`Report`.

    ``tensor_parallel_size``, ``pipeline_parallel_size`` and ``enable_expert_parallel`` are the
    split VD305 checks (as the command line's ``--tensor-parallel-size`` ...).

    Called from the script that registers your model, it also compares this process's
    registry with a fresh engine process's (VD102: registration invisible to the engine).
    Raises :class:`vllm_doctor.DoctorInputError` for a bad path or unreadable config.json.
    """
    options = CheckOptions(
        trust_remote_code=trust_remote_code,
        fast=fast,
        select=set(select),
        ignore=set(ignore),
        caller_registry=caller_registry(),
        import_timeout=import_timeout,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        enable_expert_parallel=enable_expert_parallel,
    )
    return diagnose(model, options)


def check_engine(
    model: str,
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> Report:
    """Start a real engine on ``model`` (in a child process), run a small greedy workload with the
    doctor attached and return the engine-stage findings: start-up failure (VD500), placement
    (VD401-VD405), KV-cache size (VD501, VD504), memory breakdown (VD503), ...

    The engine runs in vLLM's own default mode (torch.compile and CUDA graphs where vLLM would use
    them), as ``vllm-doctor check --engine`` does; ``eager=True`` is vLLM's ``enforce_eager``. The
    report's ``facts["engine_mode_text"]`` says what ran, ``facts["engine_failure"]`` what vLLM
    said when it could not start or run the model. Same stage, same findings as the CLI.

    ``options``: the engine options below (a keyword the engine stage does not know is a TypeError).
    """
    engine = from_keywords(options, "check_engine", workload=Workload())
    return diagnose_engine(model, engine, select=select, ignore=ignore, progress=progress)


def profile(
    model: str,
    *,
    out: str | os.PathLike[str] | None = None,
    prompts: int = 8,
    input_len: int = 64,
    output_len: int = 32,
    images: int | None = None,
    layers: bool = True,
    sample_every: int = DEFAULT_SAMPLE_EVERY,
    progress: Callable[[str], None] | None = None,
    twin: str | None = None,
    step_clock: str | None = None,
    **options: Any,
) -> Report:
    """``vllm-doctor profile`` from Python: a greedy workload of ``prompts`` x ``input_len`` tokens in,
    ``output_len`` out, on a real engine in vLLM's default mode (``eager=True`` to opt out); for a
    multimodal model ``images`` per prompt (None: 1; 0: text only), whose encoder time each phase
    reports apart (``encoder_s``).

    The report holds the findings, ``profiles["engine"]`` (steps, per-layer time, KV usage,
    memory) and ``profiles["workload"]``; with ``out`` it is also written there as report.json,
    report.html and trace.json (atomically), with vLLM's log as engine.log.

    ``twin="auto"`` (or an architecture's name, e.g. ``"LlamaForCausalLM"``) also runs vLLM's
    in-tree architecture with the model's layout on the same workload in the same mode, after
    the model, and puts the A/B into ``profiles["twin"]`` (per phase, per layer kind, both
    rooflines, ``largest_gap``; ``{"none": why}`` when no twin fits); with ``out`` the twin's own
    reports go to ``out/twin``. A named architecture that does not fit raises
    :class:`vllm_doctor.DoctorInputError` before any engine starts.

    ``step_clock``: which steps carry the device clock's step time on a GPU, ``"sampled"`` (the
    sampled steps, the step after each, every 32nd and a window's first; the default) or ``"every"``
    (every step: the doctor's clock before issue 44, a CUDA event pair a step), as ``profile --step-clock``; None: the
    engine's ``VLLM_DOCTOR_STEP_CLOCK``, else sampled.

    ``options``: the engine options below, as :func:`check_engine` takes them.
    """
    if step_clock is not None and step_clock not in STEP_CLOCKS:
        raise DoctorInputError(f"step_clock must be one of {', '.join(STEP_CLOCKS)}, not {step_clock!r}")
    if min(prompts, input_len, output_len) < 1:
        raise DoctorInputError("prompts, input_len and output_len must be at least 1")
    if images is not None and images < 0:
        raise DoctorInputError("images must be 0 or more")
    workload = Workload(prompts=prompts, input_len=input_len, output_len=output_len, images=images)
    engine = from_keywords(
        options, "profile", workload=workload, layers=layers, sample_every=sample_every, step_clock=step_clock
    )
    log_dir = str(out) if out is not None else None
    twin_report = None
    if twin is not None:
        report, twin_report = profile_with_twin(model, engine, twin, progress=progress, log_dir=log_dir)
    else:
        report = diagnose_engine(model, engine, progress=progress, log_dir=log_dir)
    if out is not None:
        write_reports(Path(out), report)
        if twin_report is not None:
            write_reports(Path(out) / "twin", twin_report)
    return report


for _function in (check_engine, profile):  # the engine options' help, from the one declaration
    _function.__doc__ = f"{_function.__doc__}\n{textwrap.indent(keywords_doc(), '    ')}\n"


def compare_with_reference(
    model: str,
    *,
    reference: str = "hf",
    hf_class: str | None = None,
    prompts: Sequence[str | Sequence[int]] = DEFAULT_PROMPTS,
    max_tokens: int = 8,
    top_k: int = 5,
    dtype: str = "float32",
    device: str = "auto",
    atol: float | None = None,
    hidden_rtol: float | None = None,
    layers: bool = True,
    trust_remote_code: bool = False,
    max_model_len: int = 512,
    engine_args: dict[str, Any] | None = None,
    timeout: float = 600.0,
    engine: ParityEngine | None = None,
    images: int = 0,
) -> ParityResult:
    """Greedy tokens and top-k logprobs of vLLM vs Hugging Face transformers on ``model``.

    ``hf_class``: your HF modelling class (``"pkg.module:Class"`` or ``"path/file.py:Class"``);
    default ``AutoModelForCausalLM`` (with ``trust_remote_code`` for ``auto_map`` checkpoints).
    When they differ, each decoder layer's output is compared on the same token ids: the result
    names the first divergent layer. ``atol``/``hidden_rtol`` default per dtype
    (:data:`vllm_doctor.analysis.parity.TOLERANCES`). Raises :class:`ParityUnavailable` when a
    side cannot run at all (the message says why). ``engine``: one from
    :func:`start_parity_engine` with the same model and engine options, kept across calls
    (otherwise each call starts and stops its own).

    ``images``: for a multimodal model, that many images per prompt (0: text prompts). Each prompt
    gets the placeholder text of the model's registered processor (after its BOS, as
    ``profile --images`` builds its prompts) and seeded random images at the processor's size (the
    same pixels on every run), given to vLLM as PIL images in ``multi_modal_data``. vLLM runs the
    prompts one by one; its worker records the pixel values its vision tower received (what the
    model's registered vLLM processor, i.e. the plugin's processing code, made of the images) and
    the reference gets exactly those ``pixel_values`` with the token ids vLLM ran (placeholders
    expanded): ``hf_class`` must then take ``forward(input_ids, pixel_values=...)``. On a
    difference the vision tower's output, then the projector's, then each decoder layer's are
    compared on the same inputs, and ``first_divergent`` names the first that differs ("vision
    tower", "projector" or "decoder layer N"; ``encoder`` holds the tower's and projector's errors).
    """
    options = _parity_options(
        reference=reference, hf_class=hf_class, prompts=prompts, max_tokens=max_tokens, top_k=top_k, dtype=dtype,
        device=device, atol=atol, hidden_rtol=hidden_rtol, layers=layers, trust_remote_code=trust_remote_code,
        max_model_len=max_model_len, engine_args=engine_args, timeout=timeout, images=images,
    )  # fmt: skip
    return run_parity(model, options, engine=engine)


def parity_engine_key(model: str, **options: Any) -> str:
    """The identity of the engine a parity check with these keyword options needs (a JSON string)."""
    import json

    return json.dumps([model, engine_options(_parity_options(**options))], sort_keys=True, default=str)


def start_parity_engine(model: str, **options: Any) -> ParityEngine:
    """Start the vLLM engine for :func:`compare_with_reference` calls with the same keyword options
    (dtype, device, trust_remote_code, max_model_len, engine_args, timeout; ``images`` above 1
    raises vLLM's one-image-per-prompt limit); ``.close()`` it."""
    return ParityEngine(model, engine_options(_parity_options(**options)))


def _parity_options(
    *,
    prompts: Sequence[str | Sequence[int]] = DEFAULT_PROMPTS,
    engine_args: dict[str, Any] | None = None,
    **options: Any,
) -> ParityOptions:
    return ParityOptions(
        prompts=[p if isinstance(p, str) else [int(t) for t in p] for p in prompts],
        engine_args=dict(engine_args or {}),
        **options,
    )
