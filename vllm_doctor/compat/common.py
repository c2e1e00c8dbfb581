"""Small helpers every gateway uses (standard library only, no vLLM or torch import)."""

from __future__ import annotations

import inspect
import traceback
from typing import Any


def qualname(obj: Any) -> str:
    """``module.QualName`` of a class, or of an object's class."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def format_exc(exc: BaseException, limit: int | None = None) -> str:
    """The whole traceback of ``exc`` as text (its last ``limit`` characters when given)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:] if limit else text


def hf_text_config(model_config: Any) -> Any:
    """The language model's HF config of a vLLM ``ModelConfig`` (``hf_text_config`` since vLLM
    0.6, else ``hf_config``)."""
    return getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception under it (cause, else context), outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    chain: list[BaseException] = []
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


# never the model's own line: vLLM, torch, transformers, the doctor, pydantic, the stdlib's process plumbing
_LIBRARY_PARTS = (
    "/vllm/",
    "/torch/",
    "/transformers/",
    "/vllm_doctor/",
    "/site-packages/pydantic",
    "<frozen ",
    "/multiprocessing/",
    "/concurrent/",
)


def is_library_file(filename: str) -> bool:
    """True for a frame's file that is not the model author's code (see :data:`_LIBRARY_PARTS`)."""
    name = filename.replace("\\", "/")
    return any(part in name for part in _LIBRARY_PARTS)


def user_frame(exc: BaseException) -> str | None:
    """``file:line in function`` of the deepest frame of the root cause that is not vLLM's, torch's,
    transformers' or the doctor's own code (the model's line); None when there is none."""
    root = exception_chain(exc)[-1]
    frames = traceback.extract_tb(root.__traceback__)
    if not frames:
        return None
    own = [f for f in frames if not is_library_file(f.filename)]
    if not own:  # vLLM's own code refused the model: its message says why, a vLLM line would not
        return None
    frame = own[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def describe_exception(exc: BaseException, limit: int = 4000) -> str:
    """``Type: message`` of ``exc`` and of each cause under it, outermost first. An exception
    without a message (a bare ``assert`` in vLLM) is named by the line that raised it:
    ``AssertionError (no message) at vllm/.../abstract.py:67 in get_kv_cache_spec: assert ...``."""
    return "\n<- caused by ".join(_one_exception(e) for e in exception_chain(exc))[:limit]


def _one_exception(exc: BaseException) -> str:
    text = str(exc).strip()
    if text:
        return f"{type(exc).__name__}: {text}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return f"{type(exc).__name__} (no message)"
    frame = frames[-1]
    path = frame.filename
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    line = f": {frame.line.strip()}" if frame.line else ""
    return f"{type(exc).__name__} (no message) at {path}:{frame.lineno} in {frame.name}{line}"


def is_fused_moe(module: Any) -> bool:
    """Does the module hold a fused-MoE layer's experts: vLLM's ``FusedMoE`` (``RoutedExperts``
    since 0.31), or any module whose ``weight_loader`` takes an ``expert_id``?"""
    if any(c.__name__ in ("FusedMoE", "RoutedExperts") for c in type(module).__mro__):
        return True
    loader = getattr(module, "weight_loader", None)
    if not callable(loader):
        return False
    try:
        return "expert_id" in inspect.signature(loader).parameters
    except (TypeError, ValueError):
        return False
