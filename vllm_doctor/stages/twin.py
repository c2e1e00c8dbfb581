"""``profile --twin``: the port and its in-tree twin through the same engine stage, one after the other.

:func:`plan_twin` finds the twin from the checkpoint's headers and config.json
(:mod:`vllm_doctor.analysis.twin`; no engine, under a second), so a ``--twin ARCH`` that does not
fit is a one-line input error (exit 2) before anything starts. :func:`profile_with_twin` then runs
:func:`vllm_doctor.stages.engine.diagnose_engine` twice with the same :class:`EngineOptions`
(same workload, same mode), never two engines at once: first the port, then the twin from a
doctor-owned model directory (:func:`build_twin_dir`: config.json with the twin's architecture and
the port's sizes, the port's tokenizer files copied, its safetensors files linked when the twin's
loader reads their names, else both runs use ``load_format=dummy``). The directory is removed when
the twin's run ends, and by :mod:`vllm_doctor.stages.tempdirs` should the doctor be stopped.
The comparison is :func:`vllm_doctor.analysis.twin_compare.compare_runs`, in
``report.profiles["twin"]`` of the port's report.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_doctor.analysis.records import EngineAnatomy, EngineProfile, TwinAB, TwinMatchInfo, WorkloadRun, held
from vllm_doctor.analysis.twin import NoTwin, TwinMatch, find_twin, twin_config
from vllm_doctor.analysis.twin_compare import TwinSide, compare_runs
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts.checkpoint import INDEX_NAME
from vllm_doctor.files import write_json_atomic
from vllm_doctor.model import Report
from vllm_doctor.probes.paths import inside, model_roots, read_regular
from vllm_doctor.stages.engine import EngineOptions, diagnose_engine

Progress = Callable[[str], None]
AUTO = "auto"
# what the tokenizer and vLLM's start-up read besides config.json and the weights
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
MAX_SIDE_FILE_BYTES = 64 << 20  # a tokenizer.json of a 256k vocabulary is ~20 MB
MAX_INDEX_BYTES = 64 << 20
# the report's sections this stage reads and writes (report.json's keys)
ENGINE, WORKLOAD, TWIN, FAILURE = "engine", "workload", "twin", "engine_failure"


@dataclass
class TwinPlan:
    """The twin to build (``match``), or why there is none (``none``)."""

    model_dir: Path
    config: dict[str, Any]
    match: TwinMatch | None = None
    none: str | None = None
    weight_files: list[str] = field(default_factory=list)  # relative: the files vLLM would load
    has_index: bool = False


def plan_twin(model: str, twin: str) -> TwinPlan:
    """Find the twin of ``model`` (``twin``: ``auto`` or an architecture's name). Raises
    :class:`DoctorInputError` for a bad model path and for a ``--twin ARCH`` that the doctor does
    not know or that does not fit the checkpoint (with what disagrees, in one line)."""
    from vllm_doctor.probes.model_dir import resolve_model_dir
    from vllm_doctor.probes.safetensors_header import read_checkpoint

    md = resolve_model_dir(model)
    ckpt = read_checkpoint(md.path, library=False)
    tensors = {t.name: t.shape for t in ckpt.tensors}
    got = find_twin(tensors, md.config, None if twin == AUTO else twin)
    if isinstance(got, NoTwin):
        if got.bad_input:
            raise DoctorInputError(got.reason, "--twin auto finds the architecture from the checkpoint's layout")
        return TwinPlan(md.path, md.config, none=got.reason)
    if got.weights == "same" and not ckpt.complete:
        got.weights = "dummy"
        got.notes.append(
            "the checkpoint has files vLLM cannot read or that lead outside the model directory (VD306/VD308): "
            "both runs load random weights (load_format=dummy)"
        )
    return TwinPlan(
        md.path,
        md.config,
        match=got,
        weight_files=[f.file for f in ckpt.files if f.ok],
        has_index=ckpt.index is not None,
    )


def build_twin_dir(plan: TwinPlan, make_dir: Callable[[str], str] | None = None) -> str:
    """The twin's model directory (a doctor-owned temporary directory; the caller removes it).

    Opens only files of the port's directory that resolve inside it (:func:`probes.paths.inside`),
    read with a size limit; the weights are symbolic links to their real paths, made only when
    both runs load the same weights."""
    from vllm_doctor.stages import tempdirs

    assert plan.match is not None
    out = Path((make_dir or tempdirs.make)("vllm-doctor-twin-"))
    write_json_atomic(out / "config.json", twin_config(plan.match, plan.config))
    roots = model_roots(plan.model_dir)
    for name in TOKENIZER_FILES:
        src = plan.model_dir / name
        if os.path.lexists(src) and inside(roots, src):
            try:
                (out / name).write_bytes(read_regular(src, MAX_SIDE_FILE_BYTES))
            except OSError:
                continue  # the engine then says what it misses: the same for the port
    if plan.match.weights == "same":
        for rel in plan.weight_files:
            src = plan.model_dir / rel
            if inside(roots, src):
                os.symlink(os.path.realpath(src), out / os.path.basename(rel))
        index = plan.model_dir / INDEX_NAME
        if plan.has_index and inside(roots, index):
            (out / INDEX_NAME).write_bytes(read_regular(index, MAX_INDEX_BYTES))
    return str(out)


def _prefixed(progress: Progress | None, who: str) -> Progress | None:
    if progress is None:
        return None
    return lambda line: progress(f"[{who}] {line}")


def _side(report: Report) -> TwinSide:
    """One side of the A/B: the records its engine-stage report holds."""
    anatomy = held(report, "facts", ENGINE, EngineAnatomy)
    return TwinSide(
        engine=held(report, "profiles", ENGINE, EngineProfile) or EngineProfile(),
        workload=held(report, "profiles", WORKLOAD, WorkloadRun) or WorkloadRun(),
        compile=anatomy.compile if anatomy is not None else None,
    )


def _ran(report: Report) -> str | None:
    """Why a run has nothing to compare (None: it ran the workload)."""
    failure = report.facts.get(FAILURE)
    if failure:
        return str(failure).splitlines()[0]
    profile = held(report, "profiles", ENGINE, EngineProfile)
    if profile is None or not profile.steps:
        return "no steps recorded"
    return None


def _put(report: Report, ab: TwinAB) -> None:
    report.profiles[TWIN] = ab


def profile_with_twin(
    model: str,
    options: EngineOptions,
    twin: str = AUTO,
    *,
    progress: Progress | None = None,
    log_dir: str | None = None,
) -> tuple[Report, Report | None]:
    """The port's engine-stage report with ``profiles["twin"]``, and the twin's own report (None
    when no twin ran). ``log_dir``: the port's engine log goes there, the twin's into ``twin/``."""
    say = progress or (lambda _line: None)
    plan = plan_twin(model, twin)
    if plan.match is None:
        say(f"twin A/B: {plan.none}")
        report = diagnose_engine(model, options, progress=progress, log_dir=log_dir)
        _put(report, TwinAB(none=plan.none))
        return report, None
    match = plan.match
    arch = match.architecture
    info = TwinMatchInfo.of(match.to_dict())
    if match.weights == "dummy":
        options = replace(options, engine_args={**options.engine_args, "load_format": "dummy"})
    if match.decoder_prefix is not None:  # the twin is the decoder's: text prompts on both runs
        options = replace(options, workload=replace(options.workload, images=0))
    weights = "the same weights" if match.weights == "same" else "random weights on both (load_format=dummy)"
    say(f"twin A/B: vLLM's {arch} is the twin ({match.how}; {weights}); run 1 of 2: the port")
    report = diagnose_engine(model, options, progress=_prefixed(progress, "port"), log_dir=log_dir)
    why = _ran(report)
    if why is not None:
        _put(report, TwinAB(architecture=arch, match=info, none=f"the port did not run: {why}"))
        return report, None
    from vllm_doctor.stages import tempdirs

    twin_dir = build_twin_dir(plan)
    info = replace(info, model_dir=twin_dir)
    try:
        say(f"twin A/B: run 2 of 2: vLLM's {arch} from {twin_dir} (same sizes, same workload, same mode)")
        twin_log = str(Path(log_dir) / "twin") if log_dir is not None else None
        twin_options = options
        if options.deep_dir:  # the twin's torch profiler traces beside the port's, not among them
            twin_options = replace(options, deep_dir=str(Path(options.deep_dir).parent / "twin" / "torch"))
        twin_report = diagnose_engine(
            twin_dir, twin_options, progress=_prefixed(progress, "twin"), log_dir=twin_log, links_into=model
        )
    finally:
        tempdirs.remove(twin_dir)
    why = _ran(twin_report)
    if why is not None:
        _put(
            report, TwinAB(architecture=arch, match=info, none=f"vLLM's {arch} did not run on the port's sizes: {why}")
        )
        return report, twin_report
    ab = compare_runs(_side(report), _side(twin_report), arch, info)
    _put(report, ab)
    from vllm_doctor.checks.perf import rerun_with_measurements

    rerun_with_measurements(report)  # the performance lint's findings carry the measured cost
    say(f"twin A/B: {ab.largest_gap.text}")
    return report, twin_report
