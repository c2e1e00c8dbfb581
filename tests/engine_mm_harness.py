"""Ground truth for the multimodal examples: run one variant of examples/make_multimodal.py on a
real vLLM engine in a fresh subprocess, through every phase a user meets, and report each.

    python tests/engine_mm_harness.py --model DIR

prints one JSON line:

    {"start": PHASE, "text": PHASE, "image": PHASE, "image_other": PHASE,
     "vision_embeds_finite": bool | None, "warnings": [...]}
    PHASE = {"ok": bool, "error_type", "error_message", "frames": ["file.py:function" of
             the traceback, outermost first], "token_ids": [...], "logprobs_finite": bool}

- start: `LLM(model=DIR, ...)` (eager, single process, small KV cache, one image per prompt);
  vLLM builds its dummy multimodal inputs and runs the profile pass in here.
- text: a greedy text-only request.
- image / image_other: the same greedy request with two different images (a red square and a
  seeded noise image: a working model answers them differently).
- vision_embeds_finite: the model's own `embed_multimodal` on a fixed pixel tensor, called in
  the engine's process on the loaded model: are the image embeddings finite?

The parent side is tests/engine_harness.py's (`engine_env`, the clean environment); this module
must stay importable without vLLM.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from tests.engine_harness import EngineJob, describe_exception, engine_env

PROMPT_TEXT = "hello world"
PROMPT_IMAGE = "<image> hello world"
MAX_TOKENS = 8
ENGINE_KWARGS: dict[str, Any] = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 * 2**20,
    "max_model_len": 256,
    "limit_mm_per_prompt": {"image": 1},
}
PHASES = ("start", "text", "image", "image_other")


def run_mm_variant(variant_dir: Path, work_dir: Path, timeout_s: float = 300) -> dict[str, Any]:
    """Run OUT/NAME of make_multimodal.py in a fresh in-process engine; the child's JSON plus
    the engine log's path. Never raises for an engine failure."""
    work_dir.mkdir(parents=True, exist_ok=True)
    job = EngineJob(
        name=variant_dir.name,
        model_dir=variant_dir / "model",
        site_dir=variant_dir / "site",
        engine_mode="inprocess",
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--model", str(job.model_dir)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=work_dir,
            env=engine_env(job, work_dir),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, returncode = f"{exc.stdout or ''}{exc.stderr or ''}\n[harness] timed out", None
    result: dict[str, Any] = {"harness_error": f"no result line (exit code {returncode})"}
    log_lines = output.splitlines()
    for i in range(len(log_lines) - 1, -1, -1):
        if log_lines[i].startswith('{"start"'):
            result = json.loads(log_lines.pop(i))
            break
    log_path = work_dir / "engine.log"  # everything the engine printed, less the result line
    log_path.write_text("\n".join(log_lines) + "\n")
    result["log_path"] = str(log_path)
    return result


# --- child side ---------------------------------------------------------------------------


def _failed(exc: BaseException) -> dict[str, Any]:
    frames = [f"{Path(frame.filename).name}:{frame.name}" for frame in traceback.extract_tb(exc.__traceback__)]
    return {
        "ok": False,
        "error_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "error_message": describe_exception(exc),
        "frames": frames,
    }


def _images() -> tuple[Any, Any]:
    import numpy as np
    from PIL import Image

    red = Image.new("RGB", (32, 32), color=(255, 0, 0))
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    return red, noise


def _generate(llm: Any, request: Any) -> dict[str, Any]:
    import math

    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
    try:
        completion = llm.generate([request], params, use_tqdm=False)[0].outputs[0]
    except BaseException as exc:
        return _failed(exc)
    values = [lp.logprob for step in completion.logprobs or [] for lp in step.values()]
    return {
        "ok": True,
        "token_ids": list(completion.token_ids),
        "text": completion.text,
        "logprobs_finite": all(math.isfinite(v) for v in values),
    }


def _vision_embeds_finite(llm: Any) -> bool | None:
    import torch

    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    if not hasattr(model, "embed_multimodal"):
        return None
    size = model.config.vision_image_size
    pixels = torch.linspace(-1, 1, 3 * size * size).reshape(1, 3, size, size)
    with torch.no_grad():
        embeds = model.embed_multimodal(pixel_values=pixels)
    return bool(all(torch.isfinite(e.float()).all() for e in embeds))


def child_main(model: str) -> dict[str, Any]:
    result: dict[str, Any] = dict.fromkeys(PHASES)
    result["vision_embeds_finite"] = None
    try:
        from vllm import LLM

        llm = LLM(model=model, **ENGINE_KWARGS)
    except BaseException as exc:
        result["start"] = _failed(exc)
        return result
    result["start"] = {"ok": True}
    red, noise = _images()
    result["text"] = _generate(llm, PROMPT_TEXT)
    result["image"] = _generate(llm, {"prompt": PROMPT_IMAGE, "multi_modal_data": {"image": red}})
    result["image_other"] = _generate(llm, {"prompt": PROMPT_IMAGE, "multi_modal_data": {"image": noise}})
    try:
        result["vision_embeds_finite"] = _vision_embeds_finite(llm)
    except BaseException as exc:
        result["vision_embeds_error"] = describe_exception(exc)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one multimodal variant, print one JSON line")
    parser.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    result = child_main(args.model)
    sys.stdout.flush()
    print("\n" + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
