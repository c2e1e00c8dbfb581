"""The engine stage of ``vllm-doctor check --engine`` and ``vllm-doctor profile``.

The parent (:func:`run_engine_stage`) starts ``python -m vllm_doctor.engine_stage`` in a fresh
process: that child starts a real engine with the doctor's worker extension (single-process
mode by default: 2-4 s on CPU), attaches, runs a small greedy workload, detaches and writes one
JSON file (:class:`EngineFacts` + workload numbers). An engine that refuses to start is a
result too (its error feeds VD501/VD208). The parent never imports vLLM; a hung or crashed
engine costs a timeout, not the doctor.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_doctor.engine import DEFAULT_SAMPLE_EVERY
from vllm_doctor.engine_facts import EngineFacts, facts_from_dict, facts_to_dict

PROGRESS_PREFIX = "@@vllm-doctor@@ "
Progress = Callable[[str], None]
# vLLM settings that would change what the child's engine does: the child decides them itself
SCRUBBED_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_DOCTOR")


@dataclass
class Workload:
    prompts: int = 2
    input_len: int = 16
    output_len: int = 8
    seed: int = 0


@dataclass
class EngineOptions:
    workload: Workload = field(default_factory=Workload)
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None  # None: 64 MiB without CUDA, vLLM's own sizing with it
    trust_remote_code: bool = False
    multiprocess: bool = False
    layers: bool = True
    sample_every: int = DEFAULT_SAMPLE_EVERY  # per-layer sampling (1 = every step)
    probe: bool = True
    deep_dir: str | None = None  # vLLM's torch profiler writes here when set
    extra: dict[str, Any] = field(default_factory=dict)  # --engine-arg KEY=VALUE
    timeout: float = 600.0


@dataclass
class EngineStageResult:
    facts: EngineFacts
    workload: dict[str, Any]
    timings: dict[str, float]
    log_path: str | None
    engine_kwargs: dict[str, Any]
    deep: dict[str, Any] | None = None


def engine_kwargs_for(options: EngineOptions, cuda: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"enforce_eager": True}
    if options.max_model_len:
        kwargs["max_model_len"] = options.max_model_len
    if options.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = options.kv_cache_memory_bytes
    elif not cuda:
        kwargs["kv_cache_memory_bytes"] = 64 * 2**20
    if options.trust_remote_code:
        kwargs["trust_remote_code"] = True
    kwargs.update(options.extra)
    return kwargs


def run_engine_stage(model: str, options: EngineOptions, progress: Progress | None = None,
                     log_dir: str | None = None) -> EngineStageResult:
    """Run the child and return its facts; raises RuntimeError if it printed no result."""
    say = progress or (lambda _m: None)
    log_dir = log_dir or tempfile.mkdtemp(prefix="vllm-doctor-engine-")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    out = Path(log_dir) / "engine-stage.json"
    log_path = Path(log_dir) / "engine.log"
    request = {"model": model, "options": _options_dict(options)}
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = [sys.executable, "-m", "vllm_doctor.engine_stage", "--request", json.dumps(request), "--out", str(out)]
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, text=True, errors="replace", start_new_session=True)
        assert proc.stdout is not None
        timed_out = threading.Event()

        def kill() -> None:  # a silent, hung engine never ends the read loop by itself
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        watchdog = threading.Timer(options.timeout, kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                log.write(line)
                if line.startswith(PROGRESS_PREFIX):
                    say(line[len(PROGRESS_PREFIX):].rstrip())
            proc.wait()
        finally:
            watchdog.cancel()
        if timed_out.is_set():
            raise RuntimeError(f"the engine stage did not finish within {options.timeout:.0f} s (log: {log_path})")
    if not out.exists():
        raise RuntimeError(f"the engine stage exited with code {proc.returncode} and wrote no result (log: {log_path})")
    data = json.loads(out.read_text())
    timings = dict(data.get("timings") or {})
    timings["engine_stage_s"] = round(time.perf_counter() - t0, 3)
    return EngineStageResult(
        facts=facts_from_dict(data["facts"]), workload=data.get("workload") or {}, timings=timings,
        log_path=str(log_path), engine_kwargs=data.get("engine_kwargs") or {}, deep=data.get("deep"),
    )


def _options_dict(options: EngineOptions) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(options)


# ---- child side -------------------------------------------------------------------------


def _progress(msg: str) -> None:
    print(PROGRESS_PREFIX + msg, flush=True)


def describe_exception(exc: BaseException) -> str:
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n<- caused by ".join(parts)[:4000]


def make_prompts(workload: Workload, vocab_size: int) -> list[dict[str, list[int]]]:
    """Token-id prompts of exactly ``input_len`` tokens (ids above the usual special tokens)."""
    rng = random.Random(workload.seed)
    low = min(10, max(0, vocab_size - 1))
    return [{"prompt_token_ids": [rng.randrange(low, vocab_size) for _ in range(workload.input_len)]}
            for _ in range(workload.prompts)]


def child_main(request: dict[str, Any], out: str) -> int:
    from vllm_doctor.report.io import write_json_atomic

    opts = request["options"]
    workload = Workload(**opts.pop("workload"))
    options = EngineOptions(workload=workload, **opts)
    result: dict[str, Any] = {"ok": False, "timings": {}}
    cuda = _cuda_available()
    kwargs = engine_kwargs_for(options, cuda)
    result["engine_kwargs"] = kwargs
    _progress(f"engine stage: importing vLLM and starting a {'multiprocess' if options.multiprocess else 'single-process'} "
              f"engine ({'CUDA' if cuda else 'CPU'}, eager)")
    t = time.perf_counter()
    from vllm_doctor.compat.engine import greedy, shutdown, start_engine, torch_profiler_kwargs

    if options.deep_dir:
        kwargs.update(torch_profiler_kwargs(options.deep_dir))
    try:
        llm = start_engine(request["model"], single_process=not options.multiprocess, **kwargs)
    except Exception as exc:  # the engine's own refusal is a finding (VD501, VD208, ...)
        result["timings"]["engine_start_s"] = round(time.perf_counter() - t, 3)
        result["facts"] = facts_to_dict(EngineFacts(startup_error=describe_exception(exc), model_dir=request["model"]))
        _progress(f"engine stage: the engine did not start: {str(exc).splitlines()[0][:200]}")
        write_json_atomic(out, result)
        return 0
    result["timings"]["engine_start_s"] = round(time.perf_counter() - t, 3)
    _progress(f"engine stage: engine up in {result['timings']['engine_start_s']:.1f} s; attaching the doctor")
    from vllm_doctor.attach import EngineDoctor
    from vllm_doctor.compat.engine import EngineHandle

    doc = EngineDoctor(llm, layers=options.layers, sample_every=options.sample_every, probe=options.probe).attach()
    handle = EngineHandle(llm)
    vocab = handle.vocab_size() or 1000
    prompts = make_prompts(workload, vocab)
    params = greedy(workload.output_len, ignore_eos=True)
    if options.deep_dir:
        handle.start_torch_profile()
    _progress(f"engine stage: workload {workload.prompts} prompt(s) x {workload.input_len} tokens in, "
              f"{workload.output_len} out")
    t = time.perf_counter()
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    except Exception as exc:  # the model itself failed at run time: that is the finding
        result["facts"] = facts_to_dict(_facts_after_failure(doc, request["model"], describe_exception(exc)))
        _progress(f"engine stage: the workload failed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}")
        write_json_atomic(out, result)
        return 0
    wall = time.perf_counter() - t
    deep = None
    if options.deep_dir:
        handle.stop_torch_profile()
        files = sorted(str(p) for p in Path(options.deep_dir).rglob("*") if p.is_file())
        deep = {"dir": options.deep_dir, "files": files}
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    result["workload"] = {
        "prompts": workload.prompts, "input_len": workload.input_len, "output_len": workload.output_len,
        "generated_tokens": generated, "wall_s": round(wall, 4), "output_tokens_per_s": round(generated / wall, 2) if wall else None,
    }
    doc.detach()
    facts = doc.gather()
    facts.model_dir = request["model"]
    result.update(ok=True, facts=facts_to_dict(facts), deep=deep)
    result["timings"].update(doc.timings)
    _progress(f"engine stage: {generated} tokens in {wall:.2f} s; collected facts from {len(facts.workers)} worker(s)")
    write_json_atomic(out, result)
    shutdown(llm)
    return 0


def _facts_after_failure(doc: Any, model: str, error: str) -> EngineFacts:
    """Whatever the workers can still tell after a failed workload (often: nothing)."""
    try:
        facts = doc.gather()
    except Exception:
        facts = EngineFacts()
    facts.runtime_error = error
    facts.model_dir = model
    return facts


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="vllm-doctor engine stage (child process)")
    parser.add_argument("--request", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return child_main(json.loads(args.request), args.out)


if __name__ == "__main__":
    sys.exit(main())
