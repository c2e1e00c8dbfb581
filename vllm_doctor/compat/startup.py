"""Where vLLM failed while starting an engine, read from the exception's own traceback.

vLLM builds an engine in one call (``LLM(...)``); what failed is only visible in the frames of
the exception it raised. In the doctor's single-process engine those frames are vLLM's own, so
the phase is read from the *outermost* vLLM function that names one (a graph capture runs
dummy forwards too: the capture, not the dummy run, is the phase). Standard library only.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

from vllm_doctor.compat.common import exception_chain, is_library_file

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


# ---- a failure inside another process: its traceback is only in the engine's log ----------

# "(EngineCore pid=1) ERROR 11-30 19:28:04 [core.py:1510] " / "(Worker_TP1 pid=2) " / "(EngineCore_DP0 pid=3) "
_PREFIX = re.compile(r"^\((?P<proc>[^()]*?) pid=\d+\) (?:[A-Z]+ \d\d-\d\d [\d:.]+ \[[^\]]*\] ?)?")
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# messages of vLLM's wrappers around a failure that happened elsewhere (another process)
_WRAPPERS = (
    "See root cause above",
    "for the root cause",  # "EngineCore encountered an issue. See stack trace (above) for the root cause."
    "initialization failed",
    "died unexpectedly",
)


def is_wrapper_error(text: str) -> bool:
    """vLLM's front end saying that a core or worker process failed (the cause is in its log)."""
    return any(w in text for w in _WRAPPERS)


def _tracebacks(text: str) -> list[dict[str, Any]]:
    """Every traceback in a log: ``{"proc", "frames": [(file, line, func)], "error"}``, in order."""
    streams: dict[str, list[tuple[int, str]]] = {}  # process -> (line number in the log, text)
    for n, raw in enumerate(text.splitlines()):
        m = _PREFIX.match(raw)
        streams.setdefault(m.group("proc") if m else "", []).append((n, raw[m.end() :] if m else raw))
    found: list[tuple[int, dict[str, Any]]] = []
    for proc, lines in streams.items():
        i = 0
        while i < len(lines):
            if lines[i][1].strip() != "Traceback (most recent call last):":
                i += 1
                continue
            start, frames = lines[i][0], []
            i += 1
            while i < len(lines) and (lines[i][1].startswith(" ") or not lines[i][1].strip()):
                f = _FRAME.match(lines[i][1])
                if f:
                    frames.append((f.group("file"), int(f.group("line")), f.group("func")))
                i += 1
            if i < len(lines) and frames:
                found.append((start, {"proc": proc, "frames": frames, "error": lines[i][1].strip()}))
    return [tb for _, tb in sorted(found, key=lambda x: x[0])]


def root_cause_from_log(text: str) -> dict[str, Any] | None:
    """The failure that vLLM's front end only points to ("See root cause above"): the last
    traceback a worker printed, else the engine core's, that is not itself such a pointer.
    ``{"process", "error", "phase", "function", "where"}`` or None."""
    tracebacks = [tb for tb in _tracebacks(text[-2_000_000:]) if not is_wrapper_error(tb["error"])]
    if not tracebacks:
        return None
    workers = [tb for tb in tracebacks if "Worker" in tb["proc"]]
    core = [tb for tb in tracebacks if "EngineCore" in tb["proc"]]
    tb = (workers or core or tracebacks)[-1]
    frames = tb["frames"]
    phase, function = None, None
    for file, line, func in frames:  # the outermost vLLM function that names a phase
        if "/vllm/" in file and func in PHASE_OF_FUNCTION:
            phase, function = PHASE_OF_FUNCTION[func], f"{func} ({_short(file)}:{line})"
            break
    own = [f for f in frames if not is_library_file(f[0])]
    where = own[-1] if own else None
    error = tb["error"]
    if ":" not in error:  # a bare `assert` in vLLM: say where it stands
        file, line, func = frames[-1]
        error += f" in {func} ({_short(file)}:{line})"
    return {
        "process": tb["proc"] or None,
        "error": error,
        "phase": phase,
        "function": function,
        "where": f"{where[0]}:{where[1]} in {where[2]}" if where else None,
    }
