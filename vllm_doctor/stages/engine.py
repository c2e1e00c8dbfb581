"""The engine stage: one owner for ``check --engine``, ``profile``, ``vllm_doctor.check_engine``,
``vllm_doctor.profile`` and every engine assertion of the pytest plugin.

:func:`diagnose_engine` is that owner: the guard (static findings vLLM cannot start from, VD305 /
VD309), the run, the eager diagnosis after a failure, the tensor-parallel-1 shapes VD406 needs, the
report, and its merge into a static report. Every front end calls it with the same defaults
(vLLM's own execution mode; ``eager=True`` opts out), so the same model gets the same findings
whichever way in.

The run (:func:`run_engine_stage`) starts a fresh child through :mod:`vllm_doctor.stages.child`
(task ``engine``): that child starts a real engine with the doctor's worker extension
(single-process mode by default: 2-4 s on CPU eager), attaches, runs a small greedy workload,
detaches and writes one JSON file (:class:`EngineFacts` + workload numbers). An engine that refuses
to start is a result too (its error feeds VD500/VD501/VD208). The parent never imports vLLM; a hung
or crashed engine costs a timeout, not the doctor.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from vllm_doctor.analysis.records import EngineProfile, WeightsReport, WorkloadRun, held
from vllm_doctor.checks.perf import perf_codes
from vllm_doctor.constants import DOCTOR_ENV, GRAPH_TIMING_ENV, SWITCH_ON
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts.engine import (
    EngineFacts,
    ExecutionMode,
    class_import_text,
    facts_from_dict,
    facts_to_dict,
)
from vllm_doctor.model import Finding, Outcome, Report
from vllm_doctor.stages.child import run_child
from vllm_doctor.stages.options import EngineOptions, Workload

__all__ = ["BLOCKING", "EngineOptions", "EngineStageResult", "Workload", "diagnose_engine", "run_engine_stage"]

Progress = Callable[[str], None]
# vLLM settings that would change what the child's engine does: the child decides them itself
SCRUBBED_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", DOCTOR_ENV)
# --engine-arg keys dropped from the eager re-run (they would bring graphs or compilation back)
EAGER_CONFLICTS = ("enforce_eager", "compilation_config", "cudagraph_capture_sizes")


@dataclass
class EngineStageResult:
    facts: EngineFacts
    workload: dict[str, Any]
    timings: dict[str, float]
    log_path: str | None
    engine_kwargs: dict[str, Any]
    deep: dict[str, Any] | None = None


def engine_kwargs_for(options: EngineOptions, cuda: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"enforce_eager": True} if options.eager else {}
    if options.max_model_len:
        kwargs["max_model_len"] = options.max_model_len
    if options.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = options.kv_cache_memory_bytes
    elif not cuda:
        kwargs["kv_cache_memory_bytes"] = 64 * 2**20
    if options.trust_remote_code:
        kwargs["trust_remote_code"] = True
    if options.tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = options.tensor_parallel_size
    if options.pipeline_parallel_size > 1:
        kwargs["pipeline_parallel_size"] = options.pipeline_parallel_size
    if options.enable_expert_parallel:
        kwargs["enable_expert_parallel"] = True
    kwargs.update(options.engine_args)
    return kwargs


def cpu_thread_binding(ranks: int, cores: list[int]) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers on ``cores``: disjoint core lists
    joined by ``|`` (vLLM's CPU executor binds each rank's OpenMP threads to one list and refuses
    to guess on a host with fewer NUMA nodes than ranks). None when there are fewer cores than ranks."""
    if ranks <= 1 or len(cores) < ranks:
        return None
    per = len(cores) // ranks
    groups = [cores[i * per : (i + 1) * per] for i in range(ranks)]
    return "|".join(",".join(map(str, g)) for g in groups)


def _root_cause_from_log(facts: EngineFacts, log_path: Path) -> None:
    """A core or worker process failed and vLLM's front end only says "see root cause above":
    take the cause from that process's traceback in the engine log."""
    from vllm_doctor.compat.startup import is_wrapper_error, root_cause_from_log

    field_name = "startup_error" if facts.startup_error else "runtime_error"
    reported = getattr(facts, field_name)
    if not reported or not is_wrapper_error(reported):
        return
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 2_000_000))
            root = root_cause_from_log(fh.read().decode("utf-8", "replace"))
    except OSError:
        return
    if root is None:
        return
    where = f" at {root['where']}" if root.get("where") else ""
    process = f" (in vLLM's {root['process']} process{where})" if root.get("process") else where
    setattr(facts, field_name, f"{root['error']}{process}\n<- reported as: {(reported.splitlines() or [''])[0]}")
    if field_name == "startup_error" and root.get("phase"):
        facts.startup_phase, facts.startup_function = root["phase"], root["function"]


def run_engine_stage(
    model: str, options: EngineOptions, progress: Progress | None = None, log_dir: str | None = None
) -> EngineStageResult:
    """Run the child and return its facts; raises RuntimeError if it printed no result.

    An engine that failed outside eager mode is run again, eagerly and with the op probe, and
    that run's facts become ``facts.diagnosis`` (VD500 names the cause from them).
    """
    from vllm_doctor.stages import tempdirs

    t0 = time.perf_counter()
    made = log_dir is None
    log_dir = log_dir or tempdirs.make("vllm-doctor-engine-")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    log_path = Path(log_dir) / "engine.log"
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # engine.log keeps what vLLM says at start-up
    if options.layers and not options.eager:  # per-layer time inside FULL CUDA graphs (engine/graphs.py)
        env[GRAPH_TIMING_ENV] = SWITCH_ON
    if options.device == "cpu":  # the engine sees no GPU (torch, vLLM and the doctor's sizing alike)
        env["CUDA_VISIBLE_DEVICES"] = ""
    res = run_child(
        "engine",
        {"model": model, "options": asdict(options)},
        timeout=options.engine_timeout,
        what="the engine stage",
        progress=progress,
        env=env,
        log_path=log_path,
        memory_limit=options.max_memory,
    )
    if made:  # from here on the error or the report names engine.log: the directory stays for the user
        tempdirs.keep(log_dir)
    if not res.ok:
        raise RuntimeError(f"{res.error} (log: {log_path})")
    data = res.data
    timings = dict(data.get("timings") or {})
    timings["engine_stage_s"] = round(res.seconds, 3)
    facts = facts_from_dict(data["facts"])
    _root_cause_from_log(facts, log_path)
    failed = bool(facts.startup_error or facts.runtime_error)
    # a class that does not import fails the same way in eager mode: no re-run for it
    if failed and options.diagnose and not facts.mode.enforce_eager and not facts.class_import_errors:
        if progress is not None:
            progress("engine stage: re-running the model in eager mode with the op probe to find the cause")
        kept = {k: v for k, v in options.engine_args.items() if k not in EAGER_CONFLICTS}
        again = replace(options, eager=True, diagnose=False, layers=False, probe=True, deep_dir=None, engine_args=kept)
        try:
            facts.diagnosis = run_engine_stage(model, again, progress, str(Path(log_dir) / "eager")).facts
        except RuntimeError as exc:
            if progress is not None:
                progress(f"engine stage: the eager re-run gave no answer: {exc}")
        timings["engine_diagnosis_s"] = round(time.perf_counter() - t0 - res.seconds, 3)
    return EngineStageResult(
        facts=facts,
        workload=data.get("workload") or {},
        timings=timings,
        log_path=str(log_path),
        engine_kwargs=data.get("engine_kwargs") or {},
        deep=data.get("deep"),
    )


def make_prompts(workload: Workload, vocab_size: int) -> list[dict[str, list[int]]]:
    """Token-id prompts of exactly ``input_len`` tokens (ids above the usual special tokens)."""
    rng = random.Random(workload.seed)
    low = min(10, max(0, vocab_size - 1))
    return [
        {"prompt_token_ids": [rng.randrange(low, vocab_size) for _ in range(workload.input_len)]}
        for _ in range(workload.prompts)
    ]


# ---- child side -------------------------------------------------------------------------


def child_task(request: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The child's side (run through :mod:`vllm_doctor.stages.child`)."""
    from vllm_doctor.compat.common import describe_exception

    opts = request["options"]
    workload = Workload(**opts.pop("workload"))
    options = EngineOptions(workload=workload, **opts)
    result: dict[str, Any] = {"ok": False, "timings": {}}
    from vllm_doctor.compat.llm import cuda_available

    cuda = cuda_available()
    kwargs = engine_kwargs_for(options, cuda)
    result["engine_kwargs"] = kwargs
    ranks = int(kwargs.get("tensor_parallel_size") or 1) * int(kwargs.get("pipeline_parallel_size") or 1)
    if ranks > 1:
        options = replace(options, multiprocess=True)  # vLLM runs each rank in a worker process of its own
    if options.multiprocess and cuda:
        # this process has touched CUDA (cuda_available): a forked engine core or worker could not
        # use it ("Cannot re-initialize CUDA in forked subprocess", seen on the H200 with one rank)
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if ranks > 1 and not cuda and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        binding = cpu_thread_binding(ranks, sorted(os.sched_getaffinity(0)))
        if binding:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binding
            result["cpu_thread_binding"] = binding
    requested = "eager" if kwargs.get("enforce_eager") else "vllm-default"
    progress(
        f"engine stage: importing vLLM and starting a {'multiprocess' if options.multiprocess else 'single-process'} "
        f"engine ({'CUDA' if cuda else 'CPU'}, {'eager' if kwargs.get('enforce_eager') else 'vLLM default mode'})"
    )
    t = time.perf_counter()
    from vllm_doctor.compat.llm import execution_mode, greedy, shutdown, start_engine, torch_profiler_kwargs
    from vllm_doctor.compat.startup import startup_phase

    if options.deep_dir:
        kwargs.update(torch_profiler_kwargs(options.deep_dir))
    try:
        llm = start_engine(request["model"], single_process=not options.multiprocess, **kwargs)
    except Exception as exc:  # the engine's own refusal is the finding (VD500, with VD501, VD208, ...)
        result["timings"]["engine_start_s"] = round(time.perf_counter() - t, 3)
        where = startup_phase(exc)
        mode = ExecutionMode(
            requested=requested, enforce_eager=bool(kwargs.get("enforce_eager")), torch_compile=where["compiling"]
        )
        failed = EngineFacts(
            startup_error=describe_exception(exc),
            model_dir=request["model"],
            mode=mode,
            startup_phase=where["phase"],
            startup_function=where["function"],
        )
        failed.class_import_errors = _uninspectable_classes(failed.startup_error or "")
        result["facts"] = facts_to_dict(failed)
        said = failed.startup_error or type(exc).__name__
        progress(f"engine stage: the engine did not start ({where['phase']}): {said.splitlines()[0][:200]}")
        for record in failed.class_import_errors[:3]:
            progress(f"engine stage: the cause: {class_import_text(record)[:400]}")
        return result
    mode = ExecutionMode.of({**execution_mode(llm), "requested": requested})
    result["timings"]["engine_start_s"] = round(time.perf_counter() - t, 3)
    progress(f"engine stage: engine up in {result['timings']['engine_start_s']:.1f} s; attaching the doctor")
    from vllm_doctor.compat.llm import EngineHandle
    from vllm_doctor.live.attach import EngineDoctor

    doc = EngineDoctor(
        llm,
        layers=options.layers,
        sample_every=options.sample_every,
        probe=options.probe,
        step_clock=options.step_clock,
    ).attach()
    handle = EngineHandle(llm)
    vocab = handle.vocab_size() or 1000
    prompts: list[dict[str, Any]] = list(make_prompts(workload, vocab))
    fed: dict[str, Any] = {}
    images = 1 if workload.images is None else workload.images
    if images > 0:
        try:
            made = handle.multimodal_prompts(workload.prompts, workload.input_len, images, workload.seed)
        except Exception as exc:  # the processor's own failure (check: VD211): text prompts, and say so
            made = None
            fed["images_error"] = describe_exception(exc, limit=1000)
            progress(f"engine stage: no image prompts (the multimodal processor failed: {str(exc)[:200]}); text only")
        if made is not None:
            prompts, fed = made
    params = greedy(workload.output_len, ignore_eos=True)
    if options.deep_dir:
        handle.start_torch_profile()
    with_images = ""
    if fed.get("images_per_prompt"):
        width, height = fed["image_size"]
        with_images = f", {fed['images_per_prompt']} image(s) each ({width}x{height})"
    progress(
        f"engine stage: workload {workload.prompts} prompt(s) x {workload.input_len} tokens in, "
        f"{workload.output_len} out{with_images}"
    )
    t = time.perf_counter()
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    except Exception as exc:  # the model itself failed at run time: that is the finding
        failed = _facts_after_failure(doc, request["model"], describe_exception(exc))
        failed.mode, failed.startup_phase = mode, "first step"
        result["facts"] = facts_to_dict(failed)
        progress(f"engine stage: the workload failed: {describe_exception(exc).splitlines()[0][:200]}")
        return result
    wall = time.perf_counter() - t
    deep = None
    if options.deep_dir:
        handle.stop_torch_profile()
        files = sorted(str(p) for p in Path(options.deep_dir).rglob("*") if p.is_file())
        deep = {"dir": options.deep_dir, "files": files}
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    result["workload"] = {
        "prompts": workload.prompts,
        "input_len": workload.input_len,
        "output_len": workload.output_len,
        "generated_tokens": generated,
        "wall_s": round(wall, 4),
        "host_start_s": t,
        "output_tokens_per_s": round(generated / wall, 2) if wall else None,
        **fed,
    }
    doc.detach()
    facts = doc.gather()
    facts.model_dir = request["model"]
    facts.mode = mode
    result.update(ok=True, facts=facts_to_dict(facts), deep=deep)
    result["timings"].update(doc.timings)
    progress(f"engine stage: {generated} tokens in {wall:.2f} s; collected facts from {len(facts.workers)} worker(s)")
    shutdown(llm)
    return result


def _uninspectable_classes(error: str) -> list[dict[str, Any]]:
    """vLLM refused with only "Model architectures [...] failed to be inspected" (its registry
    imported the class in a subprocess and logged the traceback): import the classes here, as
    ``check``'s import pass does, so that VD500 names the error and its line in every front end
    (``check --engine``, ``profile``, the pytest plugin)."""
    from vllm_doctor.compat.runtime import uninspectable_classes

    try:
        return uninspectable_classes(error)
    except Exception:  # the doctor's own question failed: vLLM's words stand alone
        return []


def _facts_after_failure(doc: Any, model: str, error: str) -> EngineFacts:
    """Whatever the workers can still tell after a failed workload (often: nothing)."""
    try:
        facts = doc.gather()
    except Exception:
        facts = EngineFacts()
    facts.runtime_error = error
    facts.model_dir = model
    return facts


def gpu_visible() -> bool:
    """NVIDIA's device nodes, unless hidden by CUDA_VISIBLE_DEVICES (without importing torch here)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


# static findings that vLLM would fail on before serving a token, without saying why in terms of
# the model (a split it cannot make, sizes it cannot build from): the engine is not started
BLOCKING = {
    "VD305": "the model cannot be split over the tensor- / pipeline-parallel sizes asked for (VD305)",
    "VD309": "config.json has model sizes no model can be built from (VD309)",
    "VD316": "config.json's quantization_config has a regular expression vllm-doctor does not run (VD316)",
    "VD113": "a file of the model directory links outside it, blocks or is oversized (VD113)",
    "VD306": "a checkpoint file links outside the model directory (VD306)",
}
# codes that block only for findings of these kinds (evidence["kind"]): a method mismatch or a
# broken index entry is what the engine stage shows; a file vLLM would open outside the directory is not
_BLOCKING_KINDS = {"VD316": {"unbounded-pattern"}, "VD306": {"file-outside-dir", "index-outside-dir"}}


def blocking_findings(report: Report) -> list[Finding]:
    """The failed findings of ``report`` that keep the engine stage from starting. A VD309 about a
    NaN or Infinity outside the model's sizes (``rope_theta``, ``rms_norm_eps``) does not: vLLM
    builds and runs that model, and the engine stage shows what it does."""
    return [
        f
        for f in report.findings
        if f.code in BLOCKING
        and f.outcome is Outcome.FAIL
        and not (f.code == "VD309" and f.evidence.get("kind") == "not-finite")
        and (f.code not in _BLOCKING_KINDS or f.evidence.get("kind") in _BLOCKING_KINDS[f.code])
    ]


def _links_into(finding: Finding, root: str | None) -> bool:
    """Is ``finding`` a checkpoint file linking into ``root`` or, for a Hugging Face cache
    snapshot, its repo's blobs (the doctor's twin directory's links to the port's vetted
    checkpoint), and nothing else?"""
    if root is None or finding.code != "VD306" or finding.evidence.get("kind") != "file-outside-dir":
        return False
    from vllm_doctor.probes.paths import inside, model_roots

    target = finding.evidence.get("resolves_to")
    return isinstance(target, str) and inside(model_roots(root), target)


def _guard_report(model: str, options: EngineOptions, progress: Progress | None) -> Report:
    """The static checks the engine stage needs when no static report was given: the blocking codes
    (fast pass, no vLLM import), and at tensor-parallel size > 1 the weights pass for VD406's shapes."""
    from vllm_doctor.stages.static import CheckOptions, diagnose

    shapes = options.tensor_parallel_size > 1
    codes = set(BLOCKING) | ({"VD301"} if shapes else set())
    check = CheckOptions(
        trust_remote_code=options.trust_remote_code,
        fast=not shapes,
        select=codes,
        tensor_parallel_size=options.tensor_parallel_size,
        pipeline_parallel_size=options.pipeline_parallel_size,
        enable_expert_parallel=options.enable_expert_parallel,
        max_memory=options.max_memory,
    )
    return diagnose(model, check, progress)


def _reference_shapes(report: Report) -> dict[str, list[int]]:
    """Each parameter's shape as the weights pass built it at tensor-parallel size 1 (VD406 checks
    each rank's shard against it); empty without a weights pass."""
    weights = held(report, "facts", "weights", WeightsReport)
    params = weights.loaded.params if weights is not None and weights.loaded is not None else {}
    return {name: p.shape for name, p in params.items() if p.shape}


def engine_report(
    result: EngineStageResult,
    target: str,
    reference_shapes: dict[str, list[int]] | None = None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
) -> Report:
    """The engine stage's report from what the engine child answered (``result``): the engine
    checks, anatomy and profiles, the workload and the engine log's path. No engine runs here:
    the same function reads a live child's answer and a recorded one (tests/data/engine_replies).
    ``reference_shapes``: each parameter's shape at tensor-parallel size 1 (VD406)."""
    from vllm_doctor.analysis.engine import time_accounting
    from vllm_doctor.live.attach import build_engine_report

    result.facts.reference_shapes = reference_shapes or None
    report = build_engine_report(result.facts, target, select, ignore)
    report.facts["engine_log"] = result.log_path
    workload = WorkloadRun.of(result.workload)
    report.profiles["workload"] = workload
    engine = report.profiles.get("engine")
    if isinstance(engine, EngineProfile):
        accounting = time_accounting(engine, workload)
        if accounting is not None:
            report.profiles["engine"] = replace(engine, time_accounting=accounting)
    report.profiles["engine_kwargs"] = result.engine_kwargs
    if result.deep:
        report.profiles["torch_profiler"] = result.deep
    report.timings.update({k if k.startswith("engine") else f"engine_{k}": v for k, v in result.timings.items()})
    return report


def diagnose_engine(
    model: str,
    options: EngineOptions | None = None,
    static: Report | None = None,
    *,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    progress: Progress | None = None,
    log_dir: str | None = None,
    links_into: str | None = None,
) -> Report:
    """The engine stage as a :class:`Report`: VD4xx/VD5xx/VD208 findings, anatomy, profiles.

    ``static``: the static stage's report of the same model (``check --engine``): its blocking
    findings decide whether the engine starts, its weights pass gives VD406 the shapes, and the
    engine's report is merged into it (returned). Without it, the blocking checks run here (fast
    pass). A model the guard stops gets no engine: the report says why (``facts.engine_failure``)
    and carries the blocking findings. An engine that fails is a finding (VD500), never a skip.
    Raises :class:`vllm_doctor.DoctorInputError` for a bad model path, RuntimeError when the engine
    child gave no answer at all (a doctor failure). ``links_into``: a directory the model
    directory's checkpoint links may point into without stopping the engine; only the doctor's own
    twin directory has one (``profile --twin``: its links to the port's checkpoint, which passed
    the port's guard).
    """
    options = options or EngineOptions()
    if options.device == "cuda" and not gpu_visible():
        raise DoctorInputError(
            "device cuda was asked for, but this machine shows no NVIDIA GPU",
            "leave the device at auto (cuda when there is a GPU), or pick cpu",
        )
    guard = static if static is not None else _guard_report(model, options, progress)
    target = guard.target
    blocked = [f for f in blocking_findings(guard) if not _links_into(f, links_into)]
    if blocked:
        report = Report(target=target, environment=dict(guard.environment))
        report.facts["engine_failure"] = "the engine stage was not started: " + "; ".join(
            BLOCKING[code] for code in sorted({f.code for f in blocked})
        )
        if static is None:
            report.findings = blocked
        if progress is not None:
            progress(report.facts["engine_failure"])
    else:
        result = run_engine_stage(target, options, progress, log_dir)
        report = engine_report(result, target, _reference_shapes(guard), select, ignore)
    if static is None:
        return report
    # the performance lint ran on the worker's real model: its findings replace the meta-device build's
    lint = set(perf_codes())
    engine_perf = {f.code for f in report.findings if f.code in lint and f.outcome is not Outcome.SKIP}
    static.findings = [f for f in static.findings if f.code not in engine_perf]
    return static.merge(report)
