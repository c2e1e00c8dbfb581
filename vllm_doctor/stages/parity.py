"""Parity with a reference implementation: the two runs, each in its own child process.

1. ``parity_vllm`` (child): a real vLLM engine (eager, no prefix caching, the requested dtype,
   the doctor's worker extension) decodes the prompts greedily with top-k logprobs, then runs
   ONE more request (the first prompt) with the worker-side hooks of
   :mod:`vllm_doctor.engine.hidden` armed: each decoder layer's output on those token ids.
2. ``parity_hf`` (child, at the same time): the transformers model (the author's class or
   AutoModelForCausalLM) does the same on the same token ids (:mod:`vllm_doctor.compat.hf`).
3. The parent compares (:mod:`vllm_doctor.analysis.parity`). Separate children keep torch state
   apart (threads, dtype defaults, vLLM's patches) and time-box each side.
4. When the logprobs first differ on another step than the first prompt's prefill, a second
   round compares the layer outputs ON THAT STEP: the prefill of that prompt, or a decode step
   (vLLM prefills the prompt and the tokens before the step, then decodes the last one through
   its KV cache with the hooks armed for that decode forward; the reference feeds the same token
   through ``past_key_values``). The verdict rests on that step only.
5. With ``images`` (a multimodal model): each prompt gets that many seeded random images at the
   processor's size and its placeholder text (:meth:`EngineHandle.image_prompt`, the pieces of the
   profiler's multimodal prompts); vLLM runs the prompts one by one, and its worker records what
   the vision tower received (the pixel values vLLM's registered processor, i.e. the plugin's
   processing code, made from the PIL images), the tower's and the projector's outputs. Then
   the reference runs on those same pixel values and the expanded token ids vLLM ran (one after
   the other, not at once), and a prefill's comparison starts with the tower and the projector.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_doctor.analysis.parity import (
    LayerCheck,
    ParityResult,
    PartError,
    PromptMismatch,
    compare_hidden,
    compare_outputs,
    compare_parts,
    localise,
    tolerances,
)
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts import wire
from vllm_doctor.facts.anatomy import Anatomy
from vllm_doctor.facts.engine import RpcReply
from vllm_doctor.files import write_json_atomic
from vllm_doctor.stages import tempdirs
from vllm_doctor.stages.child import ChildJob
from vllm_doctor.stages.engine import SCRUBBED_ENV

Progress = Callable[[str], None]
SERVER_LIFETIME_S = 24 * 3600.0  # a parity engine lives as long as its pytest session (each request is time-boxed)
DEFAULT_PROMPTS: tuple[str, ...] = ("hello world my name is", "the doctor is in and the world is")

__all__ = [
    "DEFAULT_PROMPTS", "ParityEngine", "ParityOptions", "ParityResult", "ParityUnavailable", "engine_options",
    "run_parity",
]  # fmt: skip


@dataclass(frozen=True)
class CapturedLayers:
    """vLLM's side of a layer capture (the extension's ``doctor_collect_hidden`` data)."""

    complete: bool = False  # the hooks saw the whole request (or the decode step)
    layers: dict[str, list[Any]] = field(default_factory=dict)  # layer index -> rows of numbers
    names: dict[str, str] = field(default_factory=dict)  # layer index -> module path
    encoder: dict[str, list[Any]] = field(default_factory=dict)  # "vision tower" | "projector" -> rows
    encoder_names: dict[str, str] = field(default_factory=dict)  # part -> module path
    encoder_complete: bool = False
    pixel_values: Any = None  # what the vision tower received: [images, channels, height, width]


@dataclass(frozen=True)
class VllmAnswer:
    """The vLLM engine child's answer to one request (``resp-N.json``)."""

    error: str | None = None  # vLLM could not run the request
    device: str | None = None  # "cuda" | "cpu"
    model_class: str | None = None
    prompt_token_ids: list[list[int]] | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)  # per prompt: token_ids, logprobs
    hidden: CapturedLayers | None = None
    capture_error: str | None = None  # why no layer outputs came
    step_logprobs: dict[str, float] | None = None  # the capture step's, run alone
    given_token_ids: list[list[int]] | None = None  # with images: the prompts' ids before the placeholders
    images: list[CapturedLayers] = field(default_factory=list)  # with images: per prompt, its encoder's capture


@dataclass(frozen=True)
class ReferenceAnswer:
    """The Hugging Face reference child's answer (:func:`vllm_doctor.compat.hf.reference_run`)."""

    error: str | None = None
    model_class: str | None = None
    prompt_token_ids: list[list[int]] | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    hidden: dict[str, list[Any]] | None = None  # layer index -> rows of numbers
    path: str | None = None  # how the step was run ("its KV cache", "a full forward, ...")
    encoder: dict[str, list[Any]] = field(default_factory=dict)  # with images: part -> rows


@dataclass(frozen=True)
class CaptureStep:
    """The second round's request: one step's layer outputs (the prefill of ``context``, or the
    decode step that feeds ``token`` after it)."""

    context: list[int] = field(default_factory=list)
    token: int | None = None
    top_k: int = 1
    images: int = 0  # the context is prompt ``prompt``'s ids (and tokens after it): its images go in again
    prompt: int = 0


@dataclass(frozen=True)
class EngineRequest:
    """One request to the vLLM engine child (``req-N.json``)."""

    prompts: list[Any] = field(default_factory=list)  # text or token ids
    max_tokens: int = 0
    top_k: int = 1
    capture: bool = False  # each layer's output on the first prompt's prefill
    images: int = 0  # per prompt (the prompts run one by one, each with its encoder's capture)
    capture_step: CaptureStep | None = field(default=None, metadata=wire.rules(empty_none=True))


@dataclass(frozen=True)
class EngineStart:
    """What the vLLM engine child is started with (:func:`engine_options`, plus its folder)."""

    model: str = ""
    dir: str = ""  # where the requests and answers are exchanged
    dtype: str = "auto"
    device: str = "auto"  # "auto" | "cuda" | "cpu"
    trust_remote_code: bool = False
    max_model_len: int | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)  # more EngineArgs, as given
    start_timeout: float = 600  # seconds the first answer may wait for the engine to start


class ParityUnavailable(RuntimeError):
    """A side of the comparison could not run (no vLLM, no reference, engine refused, time-out)."""


@dataclass
class ParityOptions:
    reference: str = "hf"
    hf_class: str | None = None  # "pkg.mod:Class" / "file.py:Class"; None: AutoModelForCausalLM
    prompts: list[Any] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    max_tokens: int = 8
    top_k: int = 5
    dtype: str = "float32"
    device: str = "auto"  # "cpu", "cuda" or "auto" (cuda when there is one)
    atol: float | None = None  # logprob tolerance (nats); None: per dtype
    hidden_rtol: float | None = None
    layers: bool = True  # compare decoder-layer outputs when the logprobs differ
    trust_remote_code: bool = False
    max_model_len: int = 512
    engine_args: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0
    images: int = 0  # per prompt, for a multimodal model (0: text prompts)


IMAGE_SEED = 0  # the images' pixels: numpy's generator seeded with (IMAGE_SEED, prompt index)


def _gpu_visible() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def _short(spec: str) -> str:
    """``/long/path/modeling_x.py:Class`` -> ``modeling_x.py:Class`` (for messages)."""
    return spec.rsplit("/", 1)[-1]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}


def engine_options(options: ParityOptions) -> dict[str, Any]:
    """What the vLLM engine of a parity check is started with (one engine per distinct dict)."""
    engine_args = dict(options.engine_args)
    if options.images > 1:  # vLLM's default limit is one image per prompt
        engine_args.setdefault("limit_mm_per_prompt", {"image": options.images})
    return {
        "dtype": options.dtype,
        "device": options.device,
        "trust_remote_code": options.trust_remote_code,
        "max_model_len": options.max_model_len,
        "engine_args": engine_args,
        "start_timeout": options.timeout,
    }


class ParityEngine:
    """One real vLLM engine for parity requests, in a child process, until :meth:`close`.

    Requests and answers are JSON files in a private directory (``req-N.json`` -> ``resp-N.json``,
    written atomically); each :meth:`ask` is time-boxed, and a child that dies or stops answering
    is killed with its process group. A pytest session keeps one per (model, options).
    """

    def __init__(self, model: str, options: dict[str, Any], progress: Progress | None = None) -> None:
        _refuse_unsafe_dir(model)  # before vLLM is handed the directory
        self.model = model
        self.options = options
        self.dir = Path(tempdirs.make("vllm-doctor-parity-engine-"))
        self.asked = 0
        self.closed = False
        self._job = ChildJob(
            "parity_vllm", {"model": model, "dir": str(self.dir), **options}, timeout=SERVER_LIFETIME_S,
            what="the vLLM side of the parity check", progress=progress, env=_env(),
        )  # fmt: skip

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request (prompts, max_tokens, top_k, capture) -> the engine's answer."""
        if self.closed:
            raise ParityUnavailable("this parity engine was closed")
        self.asked += 1
        answer = self.dir / f"resp-{self.asked}.json"
        write_json_atomic(self.dir / f"req-{self.asked}.json", request, exact_strings=True)
        # the first answer waits for the engine to start as well
        deadline = (
            time.monotonic() + timeout + (wire.read(EngineStart, self.options).start_timeout if self.asked == 1 else 0)
        )
        while time.monotonic() < deadline:
            if answer.is_file():
                data: dict[str, Any] = json.loads(answer.read_text(encoding="utf-8"))
                return data
            if self._job.done():
                res = self._job.result()
                self.closed = True
                failed = wire.read(VllmAnswer, res.data).error if res.ok else None
                if failed:
                    raise ParityUnavailable(f"vLLM could not run {self.model}: {failed}")
                raise ParityUnavailable(
                    f"{res.error or 'the vLLM side of the parity check stopped'}\n{res.log_tail[-1500:]}"
                )
            time.sleep(0.1)
        self.close()
        raise ParityUnavailable(f"the vLLM side of the parity check did not answer within {timeout:.0f} s")

    def close(self) -> None:
        """Ask the engine to shut down (a few seconds), then take its process group down."""
        if self.closed:
            return
        self.closed = True
        (self.dir / "stop").touch()
        deadline = time.monotonic() + 15
        while not self._job.done() and time.monotonic() < deadline:
            time.sleep(0.1)
        self._job.kill()
        self._job.result()
        tempdirs.remove(self.dir)


def run_parity(
    model: str, options: ParityOptions, progress: Progress | None = None, engine: ParityEngine | None = None
) -> ParityResult:
    """Run both sides and compare. Raises :class:`ParityUnavailable` when a side cannot run.

    ``engine``: a :class:`ParityEngine` started with :func:`engine_options` of these options, to
    reuse; without one, an engine is started for this call and closed after it."""
    if options.reference != "hf":
        raise DoctorInputError(f"reference must be 'hf' (Hugging Face transformers), not {options.reference!r}")
    if options.dtype not in ("float32", "float16", "bfloat16"):
        raise DoctorInputError(f"dtype must be float32, float16 or bfloat16, not {options.dtype!r}")
    if options.images < 0:
        raise DoctorInputError("images must be 0 or more")
    _refuse_unsafe_dir(model)
    atol, rtol = tolerances(options.dtype)
    atol = options.atol if options.atol is not None else atol
    rtol = options.hidden_rtol if options.hidden_rtol is not None else rtol
    request = {"prompts": options.prompts, "max_tokens": options.max_tokens, "top_k": options.top_k,
               "capture": options.layers, "images": options.images}  # fmt: skip
    ref_request = {
        "model": model,
        "hf_class": options.hf_class,
        "dtype": options.dtype,
        "device": options.device,
        "trust_remote_code": options.trust_remote_code,
        "prompts": options.prompts,
        "max_tokens": options.max_tokens,
        "top_k": options.top_k,
        "capture": options.layers,
    }
    # each side tokenizes the prompts itself and captures on the first prompt's prefill
    own_engine = engine is None
    if engine is None:
        engine = ParityEngine(model, engine_options(options), progress)
    try:
        side, ref = _both_sides(engine, model, request, ref_request, options, progress)
        if options.images:  # the reference ran on the ids and pixel values vLLM ran
            ref_request = {**ref_request, "prompts": side.prompt_token_ids, "pixel_values": _pixels(side)}
        if ref.prompt_token_ids != side.prompt_token_ids:
            raise ParityUnavailable(
                "vLLM and transformers tokenize the prompts differently; pass token ids as prompts to compare the "
                f"models alone (vLLM: {side.prompt_token_ids}, transformers: {ref.prompt_token_ids})"
            )
        mismatches, largest = compare_outputs(side.outputs, ref.outputs, atol, options.top_k)
        result = ParityResult(
            model=model,
            reference=f"Hugging Face ({_short(options.hf_class) if options.hf_class else ref.model_class})",
            dtype=options.dtype,
            atol=atol,
            hidden_rtol=rtol,
            prompts=len(side.outputs),
            max_tokens=options.max_tokens,
            top_k=options.top_k,
            mismatches=mismatches,
            max_logprob_diff=largest,
            engine={"model_class": side.model_class, "device": side.device},
            images=options.images,
        )
        if options.layers:
            _compare_layers(result, side, ref, engine, model, ref_request, options, progress)
    finally:
        if own_engine:
            engine.close()
    return result


def _refuse_unsafe_dir(model: str) -> None:
    """Both sides hand the model directory to vLLM and transformers, which open its files by name
    and follow symlinks: a directory with a file linking out of it, a FIFO or an oversized settings
    file (VD113, VD306) is not compared (:class:`ParityUnavailable` with the files)."""
    from vllm_doctor.probes.model_dir import resolve_model_dir
    from vllm_doctor.probes.model_files import handover_refusal, refused_files

    refusal = handover_refusal(refused_files(resolve_model_dir(model).path))
    if refusal is not None:
        raise ParityUnavailable(refusal)


def _both_sides(
    engine: ParityEngine,
    model: str,
    request: dict[str, Any],
    ref_request: dict[str, Any],
    options: ParityOptions,
    progress: Progress | None,
) -> tuple[VllmAnswer, ReferenceAnswer]:
    """One request to the engine and one reference child; on CPU both run at once, on a GPU one
    after the other (vLLM sizes its KV cache from the memory it finds free). With images the
    reference runs after vLLM, on the expanded ids and the pixel values vLLM's tower received."""
    images = bool(options.images) and "capture_step" not in request
    sequential = (_gpu_visible() and options.device != "cpu") or images
    asked = engine.ask(request, options.timeout) if sequential else None
    if images and asked is not None:
        side = wire.read(VllmAnswer, asked)
        if side.error:
            raise ParityUnavailable(f"vLLM could not run {model}: {side.error}")
        pixels = _pixels(side)
        if any(p is None for p in pixels):
            why = side.capture_error or "the vision tower's hooks did not fire"
            raise ParityUnavailable(f"the pixel values vLLM's vision tower received were not captured: {why}")
        ref_request = {**ref_request, "prompts": side.prompt_token_ids, "pixel_values": pixels}
    theirs_job = ChildJob(
        "parity_hf", ref_request, timeout=options.timeout, what="the Hugging Face reference run",
        progress=progress, env=_env(),
    )  # fmt: skip
    if asked is None:
        asked = engine.ask(request, options.timeout)
    theirs = theirs_job.result()
    side = wire.read(VllmAnswer, asked)
    if side.error:
        raise ParityUnavailable(f"vLLM could not run {model}: {side.error}")
    if not theirs.ok:
        raise ParityUnavailable(f"{theirs.error}\n{theirs.log_tail[-1500:]}")
    ref = wire.read(ReferenceAnswer, theirs.data)
    if ref.error:
        raise ParityUnavailable(f"the Hugging Face reference could not run {model}: {ref.error}")
    return side, ref


def _compare_layers(
    result: ParityResult,
    side: VllmAnswer,
    ref: ReferenceAnswer,
    engine: ParityEngine,
    model: str,
    ref_request: dict[str, Any],
    options: ParityOptions,
    progress: Progress | None,
) -> None:
    """The first prompt's prefill (captured with the outputs), then the diverging step when it is another."""
    checks: list[LayerCheck] = []
    rtol = result.hidden_rtol
    hidden = side.hidden or CapturedLayers()
    if hidden.layers and ref.hidden:
        rows, first = compare_hidden(hidden.layers, ref.hidden, hidden.names, rtol)
        checks.append(LayerCheck(0, 0, rows, first, encoder=_parts(side.images[0] if side.images else None, ref)))
    else:
        result.capture_note = side.capture_error or "no layer outputs were captured"
    target = result.first_difference
    if target is not None and (target.prompt, target.step) != (0, 0):
        check, why = _compare_step(result, side, ref, target, engine, model, ref_request, options, progress)
        if check is not None:
            checks.append(check)
        else:
            result.capture_note = why
    localise(result, checks)


def _compare_step(
    result: ParityResult,
    side: VllmAnswer,
    ref: ReferenceAnswer,
    target: PromptMismatch,
    engine: ParityEngine,
    model: str,
    ref_request: dict[str, Any],
    options: ParityOptions,
    progress: Progress | None,
) -> tuple[LayerCheck | None, str]:
    """Each layer's output on the step where the logprobs first differ (second round of both sides)."""
    p, s = target.prompt, target.step
    ours, picked = side.outputs[p]["token_ids"][:s], ref.outputs[p]["token_ids"][:s]
    if ours != picked:  # compare_outputs stops a prompt where the picks part, so this does not happen
        return None, f"the runs picked different tokens before that step ({ours} vs {picked})"
    ids = (side.prompt_token_ids or [])[p]
    step: dict[str, Any] = (
        {"context": ids, "token": None} if s == 0 else {"context": ids + ours[: s - 1], "token": ours[s - 1]}
    )
    asked: dict[str, Any] = {**step, "top_k": options.top_k}
    theirs: dict[str, Any] = {**ref_request, "capture_step": step}
    if options.images:  # vLLM gets the prompt's own ids and its images again, the reference their pixel values
        given = (side.given_token_ids or [])[p]
        asked |= {"context": given + ours[: s - 1], "images": options.images, "prompt": p}
        theirs = {**ref_request, "pixel_values": None, "capture_step": {**step, "pixel_values": _pixels(side)[p]}}
    where = "prefill" if s == 0 else f"decode step {s}"
    if progress:
        progress(f"parity: comparing each layer's output on the {where} of prompt {p}, where the logprobs first differ")
    try:
        v, r = _both_sides(engine, model, {"capture_step": asked}, theirs, options, progress)
    except ParityUnavailable as exc:
        return None, f"the second capture could not run: {str(exc)[:500]}"
    hidden = v.hidden or CapturedLayers()
    if v.capture_error or not hidden.layers or not r.hidden:
        return None, str(v.capture_error or "no layer outputs were captured on that step")
    offset = 0 if s == 0 else len(step["context"])
    rows, first = compare_hidden(hidden.layers, r.hidden, hidden.names, result.hidden_rtol, offset)
    encoder = _parts(hidden, r) if options.images else []
    check = LayerCheck(p, s, rows, first, reference_path=str(r.path or "a full forward"), encoder=encoder)
    if s > 0 and v.step_logprobs is not None:
        check.note = _reproduction_note(v.step_logprobs, side.outputs[p]["logprobs"][s], result.atol)
    return check, ""


def _pixels(side: VllmAnswer) -> list[Any]:
    """Per prompt, the pixel values vLLM's vision tower received (None: not captured)."""
    return [capture.pixel_values for capture in side.images]


def _parts(capture: CapturedLayers | None, ref: ReferenceAnswer) -> list[PartError]:
    """The tower's and the projector's outputs of one request, vLLM's vs the reference's."""
    if capture is None or not capture.encoder or not ref.encoder:
        return []
    return compare_parts(capture.encoder, ref.encoder, capture.encoder_names)


def _reproduction_note(again: dict[str, float], before: dict[str, float], atol: float) -> str | None:
    """A caveat when vLLM's logprobs on the capture run (the step alone) differ from its first run's."""
    diffs = [abs(float(again[t]) - float(before[t])) for t in set(again) & set(before)]
    worst = max(diffs, default=0.0)
    if diffs and worst <= atol:
        return None
    return (
        f"vLLM's logprobs on the capture run (this request alone) differ from its first run's (batched) at this "
        f"step by {worst:.3g} nats: the layer outputs compared may not be the ones that moved the logprobs"
    )


# ---- child side ---------------------------------------------------------------------------


def vllm_task(request: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Start the engine, then answer ``req-N.json`` files in ``dir`` until ``stop`` appears."""
    from vllm_doctor.compat.common import describe_exception
    from vllm_doctor.compat.llm import EngineHandle, cuda_available, shutdown, start_engine

    start = wire.read(EngineStart, request)
    device = start.device or "auto"
    cuda = cuda_available() if device in ("auto", "cuda") else False
    kwargs: dict[str, Any] = {
        "dtype": start.dtype,
        "enforce_eager": True,  # the layer hooks need Python forwards
        "enable_prefix_caching": False,  # the capture request must run every token again
        "max_model_len": start.max_model_len,
        "seed": 0,
    }
    if not cuda:
        kwargs["kv_cache_memory_bytes"] = 64 * 2**20
    if start.trust_remote_code:
        kwargs["trust_remote_code"] = True
    kwargs.update(start.engine_args)
    progress(f"parity: starting vLLM on {start.model} ({start.dtype}, {'CUDA' if cuda else 'CPU'}, eager)")
    try:
        llm = start_engine(start.model, single_process=True, **kwargs)
    except Exception as exc:
        return {"error": describe_exception(exc)}
    handle = EngineHandle(llm)
    folder = Path(start.dir)
    served = 0
    try:
        while not (folder / "stop").exists():
            asked = folder / f"req-{served + 1}.json"
            if not asked.is_file():
                time.sleep(0.05)
                continue
            served += 1
            answer = _answer(handle, llm, json.loads(asked.read_text(encoding="utf-8")), f"parity-{served}")
            write_json_atomic(
                folder / f"resp-{served}.json", {**answer, "device": "cuda" if cuda else "cpu"}, exact_strings=True
            )
    finally:
        shutdown(llm)
    return {"served": served}


def _answer(handle: Any, llm: Any, request: dict[str, Any], tag: str) -> dict[str, Any]:
    """``tag``: this request's own (names its images: vLLM's encoder cache must not answer for them)."""
    from vllm_doctor.compat.common import describe_exception
    from vllm_doctor.compat.llm import greedy_logprobs, prompt_token_ids

    out: dict[str, Any] = {}
    asked = wire.read(EngineRequest, request)
    try:
        step = asked.capture_step
        if step is not None and step.images:
            prompt = handle.image_prompt(step.context, step.images, IMAGE_SEED, step.prompt, tag)
            out.update(_capture(handle, llm, prompt, step.token, step.top_k or 1))
            return out
        if step is not None:  # the second round: one step's layer outputs only
            out.update(_capture(handle, llm, step.context, step.token, step.top_k or 1))
            return out
        if asked.images:
            out.update(_image_prompts(handle, llm, asked, tag))
            return out
        ids = prompt_token_ids(llm, asked.prompts)
        out["prompt_token_ids"] = ids
        out["outputs"] = greedy_logprobs(llm, ids, asked.max_tokens, asked.top_k)
        if asked.capture and ids:
            out.update(_capture(handle, llm, ids[0]))
    except Exception as exc:
        out["error"] = describe_exception(exc)
    return out


def _image_prompts(handle: Any, llm: Any, asked: EngineRequest, tag: str) -> dict[str, Any]:
    """The first round with images: each prompt alone (its encoder's capture is its own), with
    its images; the first prompt's prefill also with each decoder layer's output."""
    from vllm_doctor.compat.llm import greedy_logprobs, prompt_token_ids

    given = prompt_token_ids(llm, asked.prompts)
    out: dict[str, Any] = {"given_token_ids": given, "prompt_token_ids": [], "outputs": [], "images": []}
    for p, ids in enumerate(given):
        prompt = handle.image_prompt(ids, asked.images, IMAGE_SEED, p, tag)
        layers = asked.capture and p == 0
        armed = _arm(handle, prompt, None, layers=layers)
        (run,) = greedy_logprobs(llm, [prompt], asked.max_tokens, asked.top_k)
        out["prompt_token_ids"].append(run.pop("prompt_token_ids"))
        out["outputs"].append(run)
        if armed is not None:
            out["capture_error"] = armed
            out["images"].append({})
            continue
        data = wire.read(RpcReply, handle.rpc("doctor_collect_hidden")[0]).data
        captured = wire.read(CapturedLayers, data)
        if not captured.encoder_complete:
            out["capture_error"] = f"the encoder's hooks did not fire on prompt {p} ({captured.encoder_names})"
        if layers:
            out.update(_captured(handle, data, None))
        out["images"].append(data)
    return out


def _arm(handle: Any, prompt: Any, token: int | None, layers: bool = True) -> str | None:
    """Arm the worker's hooks for ``prompt`` (ids, or a prompt dict with images: also its encoder);
    None, or why they could not be armed."""
    images = isinstance(prompt, dict)
    ids = prompt["prompt_token_ids"] if images else prompt
    options = {"tokens": len(ids), "decode": token is not None, "layers": layers, "encoder": images,
               "all_rows": images}  # fmt: skip
    armed = handle.ensure_extension("doctor_ping") and handle.rpc("doctor_arm_hidden", options)
    first = wire.read(RpcReply, armed[0] if armed else {})
    return None if first.ok else str(first.error)


def _captured(handle: Any, data: Any, token: int | None) -> dict[str, Any]:
    model_class = wire.read(Anatomy, wire.read(RpcReply, handle.rpc("doctor_anatomy")[0]).data).identity.model_class
    if not wire.read(CapturedLayers, data).complete:
        what = "the decode step" if token is not None else "the whole request"
        return {"capture_error": f"the hooks did not see {what}", "hidden": data, "model_class": model_class}
    return {"hidden": data, "model_class": model_class}


def _capture(handle: Any, llm: Any, ids: Any, token: int | None = None, top_k: int = 1) -> dict[str, Any]:
    """Each decoder layer's output on the prefill of ``ids`` (token ids, or a prompt dict with
    images: then also the encoder's parts); with ``token``: on the decode step that feeds ``token``
    after that prefill (its logprobs come back as ``step_logprobs``)."""
    from vllm_doctor.compat.llm import greedy_logprobs

    failed = _arm(handle, ids, token)
    if failed is not None:
        return {"capture_error": failed}
    out: dict[str, Any] = {}
    if token is None:
        greedy_logprobs(llm, [ids], 1, 1)
    else:  # the prefill samples ``token`` (forced), the decode step feeds it through the KV cache
        (run,) = greedy_logprobs(llm, [ids], 2, top_k, only_token=token)
        if run["token_ids"][:1] != [token]:
            handle.rpc("doctor_collect_hidden")
            return {"capture_error": f"vLLM did not feed token {token} into the decode step ({run['token_ids']})"}
        out["step_logprobs"] = run["logprobs"][1]
    reply = wire.read(RpcReply, handle.rpc("doctor_collect_hidden")[0])
    if not reply.ok:
        model_class = wire.read(Anatomy, wire.read(RpcReply, handle.rpc("doctor_anatomy")[0]).data).identity.model_class
        return {"capture_error": str(reply.error), "model_class": model_class}
    return {**out, **_captured(handle, reply.data, token)}


def hf_task(request: dict[str, Any], progress: Progress) -> dict[str, Any]:
    from vllm_doctor.compat.common import describe_exception

    progress(f"parity: running the Hugging Face reference ({request.get('hf_class') or 'AutoModelForCausalLM'})")
    try:
        from vllm_doctor.compat.hf import reference_run

        return reference_run(request)
    except Exception as exc:
        return {"error": describe_exception(exc)}
