"""Greedy tokens and their logprobs from a real vLLM engine, for ground truth on silent failures.

tests/engine_harness.py says whether an engine starts and generates; a broken MoE or quantized
port usually does both and computes something else. This runs

    python tests/engine_tokens.py --model DIR [--engine-kwargs JSON]

in a fresh process (the environment of `engine_harness.engine_env`: the variant's site on the
path, the engine core in process unless a variant asks for more processes, e.g. tensor
parallel workers) and prints one JSON line:

    {ok, error_type, error_message, generated_text, model_class,
     phase,        # "ran" | "engine start" | "load" | "first request"
     token_ids,    # per prompt: the greedy token ids
     logprobs,     # per prompt: the logprob of each chosen token (NaN stays NaN)
     error_frames} # a failure's innermost frames, "file.py:line:function"

`phase` of a failure: "load" when the traceback passes through a `load_weights` or
`load_model` frame, "engine start" for any other failure while `LLM(...)` is built,
"first request" when `LLM(...)` was built and `generate` failed.
Importable without vLLM.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.engine_harness import (  # noqa: E402
    ENGINE_KWARGS,
    RESULT_KEYS,
    EngineJob,
    _split_result,
    describe_exception,
    engine_env,
    exception_lines,
    qualified_class_name,
)

PROMPTS = ("hello world", "the doctor is in", "my name of the world and")
MAX_TOKENS = 12
LOAD_FRAMES = ("load_weights", "load_model")


def failure_phase(exc: BaseException, engine_built: bool) -> str:
    if engine_built:
        return "first request"
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(frame.name in LOAD_FRAMES for frame in traceback.extract_tb(current.__traceback__)):
            return "load"
        current = current.__cause__ or current.__context__
    return "engine start"


def child_main(model: str, extra_kwargs: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result.update(ok=False, phase=None, token_ids=None, logprobs=None)
    engine_built = False
    try:
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, seed=0, **{**ENGINE_KWARGS, **extra_kwargs})
        engine_built = True
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
        outputs = llm.generate(list(PROMPTS), params)
        completions = [o.outputs[0] for o in outputs]
        result["token_ids"] = [list(c.token_ids) for c in completions]
        result["logprobs"] = [
            [float(step[token].logprob) for token, step in zip(c.token_ids, c.logprobs, strict=True)]
            for c in completions
        ]
        result["generated_text"] = completions[0].text
        driver = getattr(llm.llm_engine.model_executor, "driver_worker", None)
        if driver is not None:  # one worker in this process (not with tensor parallel workers)
            result["model_class"] = qualified_class_name(driver.worker.model_runner.model)
        result["ok"] = True
        result["phase"] = "ran"
    except BaseException as exc:
        result["error_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
        result["error_message"] = describe_exception(exc)
        result["phase"] = failure_phase(exc, engine_built)
        # where it was raised: the innermost frames of the outermost exception
        frames = traceback.extract_tb(exc.__traceback__)[-4:]
        result["error_frames"] = [f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in frames]
    return result


def run_tokens(
    name: str,
    variant_dir: Path,
    work_dir: Path,
    extra_kwargs: dict[str, Any] | None = None,
    timeout_s: float = 300,
) -> dict[str, Any]:
    """Run one variant (OUT/NAME of make_examples.py) in a fresh engine process, with the
    extra LLM(...) arguments and environment its variant.json names (and ``extra_kwargs``)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    meta = json.loads((variant_dir / "variant.json").read_text())
    job = EngineJob(name=name, model_dir=variant_dir / "model", site_dir=variant_dir / "site", engine_mode="inprocess")
    env = engine_env(job, work_dir) | meta.get("engine_env", {})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--model", str(job.model_dir)]
    cmd += ["--engine-kwargs", json.dumps(meta.get("engine_kwargs", {}) | (extra_kwargs or {}))]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=work_dir, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout_s,
        )
        output, returncode = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        returncode = None
    (work_dir / "engine.log").write_text(output)
    result, log_lines = _split_result(output)
    if result is None:
        result = {k: None for k in RESULT_KEYS} | {
            "ok": False,
            "error_type": "HarnessError",
            "error_message": f"engine subprocess printed no result (exit code {returncode})",
            "phase": None,
            "token_ids": None,
            "logprobs": None,
        }
    result.update(
        name=name,
        returncode=returncode,
        seconds=round(time.perf_counter() - start, 1),
        log_tail="\n".join(log_lines)[-6000:],
        log_exceptions=exception_lines(log_lines),
        log_path=str(work_dir / "engine.log"),
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="greedy tokens of one engine, one JSON line")
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine-kwargs", default="{}")
    args = parser.parse_args(argv)
    result = child_main(args.model, json.loads(args.engine_kwargs))
    sys.stdout.flush()
    print("\n" + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
