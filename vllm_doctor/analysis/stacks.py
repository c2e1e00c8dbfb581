"""What each process of a vLLM engine is doing, read from its Python stacks, and one verdict.

Pure logic over :class:`~vllm_doctor.facts.stacks.ProcessDump` samples (py-spy dumps, live or
recorded). It knows vLLM's own frames:

- the busy loops: the engine core's ``run_busy_loop`` waiting in ``_process_input_queue`` and a
  worker's ``worker_busy_loop`` waiting in ``MessageQueue.dequeue`` are *idle*;
- a step: ``execute_model`` / ``sample_tokens`` / ``_dummy_run``; in the engine core, the
  executor's ``collective_rpc`` is *waiting for the workers*;
- collectives: frames of ``torch/distributed`` and ``vllm/distributed`` (NCCL, gloo,
  ``shm_broadcast``, custom all-reduce) inside a step, native NCCL frames with ``--native``;
- the model's code: any frame that is not a library's (vLLM's own ``model_executor/models``
  and ``transformers/models`` count as model code), inside a step;
- start-up: an engine core or worker with no busy loop on its stack (spawn's imports,
  ``load_model``, ``profile_run``, ``capture_model``, ...).

A process whose main-thread stack is the same in every sample "did not move". The verdict:
stuck in the model / in a collective / in start-up when a process in that state did not move
(the model outranks a collective: a rank stuck in its forward holds the others in theirs),
busy when something runs, idle when every engine process waits for work.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vllm_doctor.facts.stacks import Frame, ProcessDump

__all__ = [
    "ProcessState",
    "State",
    "Verdict",
    "classify",
    "did_not_move",
    "is_model_code",
    "summarize_process",
    "verdict",
]

State = Literal["idle", "waiting", "busy", "model", "collective", "startup", "other", "error"]
VerdictKind = Literal["idle", "busy", "stuck in the model", "stuck in a collective", "stuck in start-up", "unknown"]

LOOPS = {"run_busy_loop", "worker_busy_loop", "run_engine_busy_loop"}
IDLE_WAITS = {"_process_input_queue", "dequeue", "acquire_read", "wait", "get", "poll", "recv", "__enter__"}
STEPS = {"execute_model", "sample_tokens", "execute_dummy_batch", "_dummy_run", "_dummy_sampler_run", "step"}
STEPS |= {"step_with_batch_queue", "_process_engine_step", "collective_rpc", "forward"}
EXECUTOR_WAITS = {"collective_rpc", "get_response", "aggregate_output", "wait_for_response", "_wait_for_response"}
STARTUP_PHASES = (
    "load_model",
    "load_weights",
    "profile_run",
    "_dummy_run",
    "capture_model",
    "compile_or_warm_up_model",
    "determine_available_memory",
    "initialize_from_config",
    "initialize_kv_cache",
    "_initialize_kv_caches",
    "init_device",
    "init_worker_distributed_environment",
    "wait_for_ready",
    "wait_for_engine_startup",
    "build_async_engine_client",
)
API_IDLE = {"Runner.run", "run", "run_forever", "serve", "run_until_complete"}
COLLECTIVE_DIRS = ("torch/distributed/", "vllm/distributed/")
MODEL_DIRS = ("vllm/model_executor/models/", "transformers/models/")
LIBRARIES = {
    "vllm",
    "vllm_doctor",
    "torch",
    "triton",
    "numpy",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "zmq",
    "uvloop",
    "uvicorn",
    "fastapi",
    "starlette",
    "anyio",
    "h11",
    "httptools",
    "pydantic",
    "msgspec",
    "cloudpickle",
    "psutil",
    "tqdm",
    "setproctitle",
    "prometheus_client",
    "ray",
    "xformers",
    "flashinfer",
    "vllm_flash_attn",
    "einops",
    "compressed_tensors",
    "depyf",
    "xgrammar",
    "outlines",
    "lark",
    "regex",
    "sentencepiece",
    "nvtx",
    "pynvml",
    "cupy",
    "pybase64",
    "cbor2",
    "openai",
    "aiohttp",
    "websockets",
}


def _bare(frame: Frame) -> str:
    return frame.name.rsplit(".", 1)[-1]


def _top(frame: Frame) -> str:
    return frame.short.split("/", 1)[0].removesuffix(".py")


def is_library(frame: Frame) -> bool:
    """Frames of Python itself or of a known library (vLLM, torch, ...), not the user's code."""
    if frame.short.startswith("<") or frame.filename.startswith("<"):
        return True
    top = _top(frame)
    return top in LIBRARIES or top in sys.stdlib_module_names or "site-packages/torch/" in frame.filename


def is_model_code(frame: Frame) -> bool:
    """The model's own code: vLLM's and transformers' model files, or any file of no known library."""
    return frame.short.startswith(MODEL_DIRS) or not is_library(frame)


def _is_vllm(frame: Frame) -> bool:
    return frame.short.startswith("vllm/")


def _is_collective(frame: Frame) -> bool:
    if frame.short.startswith(COLLECTIVE_DIRS):
        return True
    low = f"{frame.name} {frame.filename}".lower()
    return "nccl" in low or "gloo" in low


@dataclass(frozen=True)
class ProcessState:
    """One process's state from its main thread, and the line that says it."""

    state: State
    summary: str
    where: str | None = None  # file:line of the frame that matters
    function: str | None = None
    active: bool | None = None  # on a CPU (py-spy's view) when sampled

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state,
            "summary": self.summary,
            "where": self.where,
            "function": self.function,
            "active": self.active,
        }


def _frame_text(frame: Frame) -> str:
    return f"{frame.where} ({frame.name})"


def _startup(inner: list[Frame], model: Frame | None, active: bool | None) -> ProcessState:
    """``inner``: the main thread's frames, innermost first."""
    phase = next((f for f in inner if _bare(f) in STARTUP_PHASES), None)
    if phase is None and any(_bare(f) in ("_fixup_main_from_name", "prepare") for f in inner):
        vllm_frame = next((f for f in inner if _is_vllm(f)), inner[0] if inner else None)
        where = vllm_frame.where if vllm_frame else None
        return ProcessState("startup", f"starting up: importing modules (at {where})", where, "import", active)
    shown = phase or next((f for f in inner if _is_vllm(f)), inner[0] if inner else None)
    if shown is None:
        return ProcessState("startup", "starting up", active=active)
    text = f"starting up: {_bare(shown)} at {shown.where}"
    if model is not None:
        text += f", inside the model's code at {_frame_text(model)}"
        return ProcessState("startup", text, model.where, model.name, active)
    return ProcessState("startup", text, shown.where, shown.name, active)


def classify(dump: ProcessDump, role: str) -> ProcessState:
    """The state of one process (its main thread) in one dump."""
    if dump.error:
        return ProcessState("error", dump.error)
    thread = dump.main_thread()
    if thread is None or not thread.frames:
        return ProcessState("other", "no Python frames on the main thread", active=thread.active if thread else None)
    inner = list(thread.python_frames())  # innermost first; native frames (--native) only name a collective
    if not inner:
        return ProcessState("other", "no Python frames on the main thread", active=thread.active)
    native_collective = next((f for f in thread.frames if f.native and _is_collective(f)), None)
    outer = inner[::-1]
    active = thread.active

    def state(kind: State, summary: str, frame: Frame | None) -> ProcessState:
        return ProcessState(kind, summary, frame.where if frame else None, frame.name if frame else None, active)

    loop_at = next((i for i, f in enumerate(outer) if _bare(f) in LOOPS and _is_vllm(f)), None)
    step_at = next(
        (i for i, f in enumerate(outer) if _bare(f) in STEPS and (_is_vllm(f) or f.short.startswith("torch/"))),
        None,
    )
    in_step = outer[step_at:] if step_at is not None else []
    model = next((f for f in reversed(in_step) if is_model_code(f)), None)  # the innermost model frame
    collective = next((f for f in in_step if _is_collective(f)), None)  # the outermost collective frame
    if collective is None and in_step and native_collective is not None:
        collective = native_collective  # e.g. ncclGroupEnd under a Python frame of the model
    innermost_vllm = next((f for f in inner if _is_vllm(f)), None)

    if role == "api-server":
        if any(_bare(f) in STARTUP_PHASES for f in inner):
            return _startup(inner, None, active)
        top_named = next((f for f in inner if not f.short.startswith("<")), inner[0])
        if top_named.name in API_IDLE or _bare(top_named) in API_IDLE:
            return state("idle", "serving HTTP (event loop waiting)", top_named)
        return state("busy", f"busy at {_frame_text(top_named)}", top_named)

    if role in ("engine-core", "worker") and loop_at is None:
        return _startup(inner, model, active)

    if loop_at is None and step_at is None:
        first = next((f for f in inner if not is_library(f)), innermost_vllm or inner[0])
        return state("other", f"at {_frame_text(first)}", first)

    if step_at is None:
        # inside the busy loop, outside any step: waiting for work
        waits = [f for f in outer[loop_at:] if _is_vllm(f) or _top(f) == "zmq"] if loop_at is not None else []
        if all(_bare(f) in IDLE_WAITS | LOOPS for f in waits[1:]):
            text = "idle, waiting for requests" if role == "engine-core" else "idle, waiting for work"
            return state("idle", text, innermost_vllm)
        shown = innermost_vllm or inner[0]
        return state("busy", f"busy in vLLM at {_frame_text(shown)}", shown)

    if model is not None and (
        collective is None or (collective in inner and inner.index(collective) > inner.index(model))
    ):
        # the model's code is innermost: it computes (or hangs) in its own forward
        return state("model", f"inside the model's forward at {_frame_text(model)}", model)
    if collective is not None and not (role == "engine-core" and any(_bare(f) in EXECUTOR_WAITS for f in in_step)):
        deepest = native_collective or next(f for f in reversed(in_step) if _is_collective(f))
        text = f"in a collective: {collective.name}"
        text += f" at {deepest.where}" if deepest is collective else f", waiting at {_frame_text(deepest)}"
        if model is not None:
            text += f", called from the model at {_frame_text(model)}"
        return state("collective", text, deepest)
    if any(_bare(f) in EXECUTOR_WAITS for f in in_step) and role == "engine-core":
        step = [f for f in in_step if _bare(f) in STEPS and _bare(f) not in EXECUTOR_WAITS][-1:] or [outer[step_at]]
        return state("waiting", f"waiting for the workers in {step[0].name} ({step[0].where})", step[0])
    shown = innermost_vllm or inner[0]
    return state("busy", f"busy in vLLM: {_frame_text(shown)}", shown)


def did_not_move(samples: Sequence[ProcessDump]) -> bool | None:
    """True when the main thread's stack is identical in every sample; None with fewer than two."""
    stacks = [s.main_thread() for s in samples if not s.error]
    if len(stacks) < 2 or any(t is None for t in stacks):
        return None
    return len({t.signature() for t in stacks if t is not None}) == 1


def summarize_process(samples: Sequence[ProcessDump], role: str) -> tuple[ProcessState, bool | None]:
    """The state in the last sample, and whether the stack stayed put over all samples."""
    last = samples[-1]
    return classify(last, role), did_not_move(samples)


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    text: str
    pids: tuple[int, ...] = ()  # the processes the verdict is about

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "text": self.text, "pids": list(self.pids)}


@dataclass(frozen=True)
class Judged:
    """One process as the verdict sees it."""

    pid: int
    label: str
    role: str
    state: ProcessState
    still: bool | None  # did not move over the samples (None: one sample)


def verdict(processes: Sequence[Judged], seconds: float) -> Verdict:
    """One verdict for the engine from its processes' states (engine core and workers count)."""
    # the engine core and workers; without them (LLM(...) in one process) whatever was found
    engine = [p for p in processes if p.role in ("engine-core", "worker")] or list(processes)
    seen = [p for p in engine if p.state.state != "error"]
    if not seen:
        return Verdict("unknown", "unknown: no stack of the engine could be read")
    if all(p.state.state == "other" for p in seen):
        return Verdict("unknown", "unknown: no vLLM engine loop, step or start-up found in these stacks")

    def names(group: list[Judged]) -> str:
        return ", ".join(p.label for p in group)

    for kind, state in (
        ("stuck in the model", "model"),
        ("stuck in a collective", "collective"),
        ("stuck in start-up", "startup"),
    ):
        stuck = [p for p in seen if p.state.state == state and p.still]
        if stuck:
            first = stuck[0].state
            at = f" at {first.where} ({first.function})" if first.where else ""
            text = f"{kind}: {names(stuck)} did not move{at} for {seconds:.1f} s"
            return Verdict(kind, text, tuple(p.pid for p in stuck))  # type: ignore[arg-type]
    order = ("model", "collective", "startup", "busy", "waiting")
    running = sorted((p for p in seen if p.state.state in order), key=lambda p: order.index(p.state.state))
    if running:
        lead = running[0]
        text = f"busy: {lead.label} {lead.state.summary}"
        if any(p.still is None for p in running):
            text += " (one sample: take two or more to tell stuck from busy)"
        return Verdict("busy", text, tuple(p.pid for p in running))
    return Verdict("idle", "idle: the engine waits for requests", tuple(p.pid for p in seen))
