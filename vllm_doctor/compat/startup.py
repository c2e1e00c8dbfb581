"""Where vLLM failed while starting an engine, read from the exception's own traceback.

vLLM builds an engine in one call (``LLM(...)``); what failed is only visible in the frames of
the exception it raised. In the doctor's single-process engine those frames are vLLM's own, so
the phase is read from the *outermost* vLLM function that names one (a graph capture runs
dummy forwards too: the capture, not the dummy run, is the phase). Standard library only.
"""

from __future__ import annotations

import traceback
from typing import Any

from vllm_doctor.compat.common import exception_chain

# vLLM function name -> phase (V1 and V2 model runners, vLLM 0.26-0.32); generic orchestrators
# (``_initialize_kv_caches``, ``__init__``) are deliberately absent
PHASE_OF_FUNCTION: dict[str, str] = {
    "load_model": "load",
    "determine_available_memory": "profile run",
    "profile_run": "profile run",
    "get_kv_cache_config": "KV cache allocation",
    "get_kv_cache_configs": "KV cache allocation",
    "check_enough_kv_cache_memory": "KV cache allocation",
    "_check_enough_kv_cache_memory": "KV cache allocation",
    "initialize_from_config": "KV cache allocation",
    "initialize_kv_cache": "KV cache allocation",
    "initialize_kv_cache_tensors": "KV cache allocation",
    "compile_or_warm_up_model": "graph capture and warm-up",
    "capture_model": "graph capture",
    "_capture_cudagraphs": "graph capture",
    "capture_cudagraphs": "graph capture",
}
PHASES = ("load", "profile run", "KV cache allocation", "graph capture", "graph capture and warm-up", "first step")


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """Frames of ``exc`` and of every exception under it, outermost first."""
    out: list[traceback.FrameSummary] = []
    for e in exception_chain(exc):  # the last exception's frames start at the top; a cause's, where it was caught
        out.extend(traceback.extract_tb(e.__traceback__))
    return out


def startup_phase(exc: BaseException) -> dict[str, Any]:
    """``{"phase", "function", "compiling"}`` for an exception raised while vLLM started."""
    frames = _frames(exc)
    matches = [(PHASE_OF_FUNCTION[f.name], f) for f in frames if "/vllm/" in f.filename and f.name in PHASE_OF_FUNCTION]
    # a capture is the most specific phase: vLLM runs it from inside other phases (warm-up, or the
    # KV cache set-up of the V2 runner), so it wins wherever it stands
    text = " ".join(str(e) for e in exception_chain(exc))
    capture = [m for m in matches if m[0] == "graph capture"]
    if capture:
        matches = capture
    elif "graph capture" in text or "StreamCapture" in text:
        matches = [("graph capture", matches[0][1])] if matches else []
    phase, function = None, None
    if matches:
        phase, f = matches[0]
        function = f"{f.name} ({_short(f.filename)}:{f.lineno})"
    if phase is None and ("graph capture" in text or "StreamCapture" in text):
        phase = "graph capture"
    compiling = any("/torch/_dynamo/" in f.filename or "/torch/_inductor/" in f.filename for f in frames)
    return {"phase": phase or "engine start-up", "function": function, "compiling": compiling}


def _short(path: str) -> str:
    i = path.rfind("/vllm/")
    return path[i + 1 :] if i >= 0 else path
