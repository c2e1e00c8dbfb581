"""Ground truth: run an example variant on a real vLLM engine in a fresh subprocess.

The parent side (`run_variant`, `run_variants`) starts

    python tests/engine_harness.py --model DIR --mode MODE [--script FILE]

with a clean environment, and returns the one JSON line the child prints, plus the tail of
everything the engine logged (the engine core's own traceback lands there in multiprocess
mode, not in the caller's exception):

    {ok, error_type, error_message, generated_text, model_class, log_tail, seconds, ...}

The child tries `LLM(model=DIR).generate(["hello world"], max_tokens=8, temperature=0)` with
the cheapest engine settings measured on CPU (eager, 64 MiB KV cache, max_model_len 256).
This module must stay importable without vLLM: the worker extension below is loaded by name
inside vLLM's worker processes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
PROMPT = "hello world"
MAX_TOKENS = 8
ENGINE_KWARGS: dict[str, Any] = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 * 2**20,
    "max_model_len": 256,
}
WORKER_EXTENSION = "tests.engine_harness.HarnessWorkerExtension"
RESULT_KEYS = ("ok", "error_type", "error_message", "generated_text", "model_class")
ERROR_MESSAGE_CHARS = 2000
LOG_TAIL_CHARS = 6000
# "(EngineCore pid=12) ERROR 11-29 18:42:12 [file.py:953] " in front of vLLM's log lines
_LOG_PREFIX = re.compile(r"^(?:\([\w-]+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]+\] ?)?")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): ?(.*)$")
# Environment variables that would change what the engine does; never inherited.
SCRUBBED_ENV = (
    "PYTHONPATH",
    "VLLM_PLUGINS",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_WORKER_MULTIPROC_METHOD",
    "VLLM_CACHE_ROOT",
    "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "VLLM_DOCTOR",
)


class HarnessWorkerExtension:
    """Mixed into vLLM's worker (`worker_extension_cls`): callable by name via collective_rpc."""

    model_runner: Any

    def harness_model_class(self) -> str:
        return qualified_class_name(self.model_runner.model)


def qualified_class_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


# --- parent side --------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineJob:
    """One engine run: which model, which plugin site, which process layout."""

    name: str
    model_dir: Path
    site_dir: Path
    engine_mode: str  # "inprocess" | "multiprocess" | "script"
    script: Path | None = None


def job_for_variant(variant_dir: Path) -> EngineJob:
    """The job that make_examples.py describes in OUT/NAME/variant.json."""
    meta = json.loads((variant_dir / "variant.json").read_text())
    script = variant_dir / meta["script"] if meta.get("script") else None
    return EngineJob(
        name=meta["name"],
        model_dir=variant_dir / "model",
        site_dir=variant_dir / "site",
        engine_mode=meta["engine_mode"],
        script=script,
    )


def engine_env(job: EngineJob, work_dir: Path) -> dict[str, str]:
    """A clean environment: the variant's site + the repo on the path, private caches."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(job.site_dir), str(REPO_ROOT)])
    env["VLLM_CACHE_ROOT"] = str(work_dir / "vllm-cache")  # model-info cache, per job
    env["HF_HOME"] = str(work_dir / "hf-home")  # trust_remote_code module cache, per job
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if job.engine_mode == "inprocess":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def host_has_amx() -> bool:
    """What vLLM's CPU backend asks torch before it picks an AMX kernel (bf16 attention, the
    AMX_MLA backend, int8 GEMMs): where this is True, vLLM answers some fixtures otherwise than on
    the host without AMX where they were recorded (docs/development.md, "AMX hosts")."""
    import torch

    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(check is not None and check())


PIP_INSTALLED = "ok-pip-installed"  # the working plugin, installed by pip, multiprocess engine


def install_plugin_with_pip(scratch: Path) -> Path:
    """`pip install --no-deps --no-build-isolation --target SCRATCH/site` of a copy of the example
    plugin's source (pip builds in place; the copy keeps build/ and *.egg-info out of the repo)."""
    source, target = scratch / "tiny_model_plugin", scratch / "site"
    shutil.copytree(
        REPO_ROOT / "examples" / "tiny_model_plugin",
        source,
        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
    )
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    cmd += ["--no-input", "--disable-pip-version-check", "--target", str(target), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def examples_jobs(examples_dir: Path, pip_site: Path) -> dict[str, EngineJob]:
    """Every variant make_examples.py built, and the working plugin installed by pip (multiprocess)."""
    jobs = {job.name: job for job in (job_for_variant(d) for d in sorted(examples_dir.iterdir()) if d.is_dir())}
    jobs[PIP_INSTALLED] = EngineJob(
        name=PIP_INSTALLED, model_dir=examples_dir / "ok" / "model", site_dir=pip_site, engine_mode="multiprocess"
    )
    return jobs


def run_variant(job: EngineJob, work_dir: Path, timeout_s: float = 240) -> dict[str, Any]:
    """Run one job in a fresh process group; never raises for an engine failure."""
    work_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--model", str(job.model_dir)]
    cmd += ["--mode", job.engine_mode]
    if job.script is not None:
        cmd += ["--script", str(job.script)]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=work_dir,
        env=engine_env(job, work_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # so a timeout can stop the engine's children too
    )
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    seconds = round(time.perf_counter() - start, 1)
    (work_dir / "engine.log").write_text(output)

    result, log_lines = _split_result(output)
    if result is None:
        reason = f"timed out after {timeout_s} s" if timed_out else "printed no result"
        result = {
            "ok": False,
            "error_type": "HarnessError",
            "error_message": f"engine subprocess {reason} (exit code {proc.returncode})",
            "generated_text": None,
            "model_class": None,
        }
    result.update(
        name=job.name,
        engine_mode=job.engine_mode,
        returncode=proc.returncode,
        seconds=seconds,
        log_tail="\n".join(log_lines)[-LOG_TAIL_CHARS:],
        log_exceptions=exception_lines(log_lines),
        log_path=str(work_dir / "engine.log"),
    )
    return result


# engine runs side by side: one engine process leaves about half of the two-core machine idle
# (imports, start-up handshakes, the first request); each run is its own process with its own
# work directory, caches and environment, so two at a time change nothing they report
CONCURRENCY = 2


def run_variants(
    jobs: Iterable[EngineJob], work_root: Path, concurrency: int = CONCURRENCY, timeout_s: float = 240
) -> dict[str, dict[str, Any]]:
    """Run jobs `concurrency` at a time; results by job name."""
    return run_concurrently({j.name: partial(run_variant, j, work_root / j.name, timeout_s) for j in jobs}, concurrency)


def run_concurrently(
    runs: dict[str, Callable[[], dict[str, Any]]], concurrency: int = CONCURRENCY
) -> dict[str, dict[str, Any]]:
    """Each of ``runs`` (name -> a call that runs one engine process and never raises for an
    engine failure), ``concurrency`` at a time, in the order given; results by name, in that order."""
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = {name: pool.submit(run) for name, run in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def exception_lines(log_lines: Iterable[str], max_chars: int = 500) -> list[str]:
    """Distinct `SomeError: message` lines of the log (tracebacks of every process), in order.

    In multiprocess mode the caller only sees `Engine core initialization failed`; the root
    cause is a traceback that the engine core or worker logged.
    """
    found: list[str] = []
    for line in log_lines:
        match = _EXCEPTION_LINE.match(_LOG_PREFIX.sub("", line.strip()))
        if match:
            text = match.group(0)[:max_chars]
            if text not in found:
                found.append(text)
    return found


def _split_result(output: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The child's result line (the last JSON object with our keys) and the other lines."""
    lines = output.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("{") and '"ok"' in line:
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if isinstance(parsed, dict) and set(RESULT_KEYS) <= parsed.keys():
                return parsed, lines[:i] + lines[i + 1 :]
    return None, lines


# --- child side ---------------------------------------------------------------------------


def describe_exception(exc: BaseException) -> str:
    """`Type: message` for the exception and each cause/context under it, outermost first.

    Independent of vllm_doctor.compat.common.describe_exception on purpose: the ground-truth
    harness judges the doctor, so it imports none of the doctor's code."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = str(current)
        if len(message) > 800:
            message = message[:800] + " [...]"
        parts.append(f"{type(current).__module__}.{type(current).__qualname__}: {message}")
        current = current.__cause__ or current.__context__
    return "\n<- caused by ".join(parts)[:ERROR_MESSAGE_CHARS]


def _model_class(llm: Any, engine_mode: str) -> str:
    if engine_mode == "inprocess":
        worker = llm.llm_engine.model_executor.driver_worker.worker
        return qualified_class_name(worker.model_runner.model)
    return llm.collective_rpc("harness_model_class")[0]


def child_main(model: str, engine_mode: str, script: str | None) -> dict[str, Any]:
    result: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result["ok"] = False
    try:
        if engine_mode == "script":
            # The author's own launch script, run as `python serve.py MODEL`: runpy makes it
            # __main__, so spawned engine processes re-import it as __mp_main__ like they would.
            assert script is not None
            sys.argv = [script, model]
            runpy.run_path(script, run_name="__main__")
        else:
            from vllm import LLM, SamplingParams

            kwargs = dict(ENGINE_KWARGS)
            if engine_mode == "multiprocess":
                kwargs["worker_extension_cls"] = WORKER_EXTENSION
            llm = LLM(model=model, **kwargs)
            outputs = llm.generate([PROMPT], SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
            result["generated_text"] = outputs[0].outputs[0].text
            result["model_class"] = _model_class(llm, engine_mode)
        result["ok"] = True
    except BaseException as exc:
        result["error_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
        result["error_message"] = describe_exception(exc)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one engine, print one JSON line")
    parser.add_argument("--model", required=True)
    parser.add_argument("--mode", required=True, choices=["inprocess", "multiprocess", "script"])
    parser.add_argument("--script")
    args = parser.parse_args(argv)
    result = child_main(args.model, args.mode, args.script)
    sys.stdout.flush()
    print("\n" + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
