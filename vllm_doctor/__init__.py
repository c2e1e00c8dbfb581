"""vllm-doctor: find out why vLLM will not find, build, load or run your custom model.

The root imports nothing eagerly (PEP 562): vLLM imports ``vllm_doctor.plugins`` (the doctor's
``vllm.general_plugins`` entry points) in every engine process, and that must not load the
doctor's checks, probes or reports. The names below are resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "check": "vllm_doctor.api",
    "check_engine": "vllm_doctor.api",
    "profile": "vllm_doctor.api",
    "compare_with_reference": "vllm_doctor.api",
    "ParityResult": "vllm_doctor.api",
    "ParityUnavailable": "vllm_doctor.api",
    "attach": "vllm_doctor.live.attach",
    "EngineDoctor": "vllm_doctor.live.attach",
    "ExtensionMissing": "vllm_doctor.live.attach",
    "engine_kwargs": "vllm_doctor.live.attach",
    "DoctorInputError": "vllm_doctor.errors",
    "CheckMeta": "vllm_doctor.model",
    "Finding": "vllm_doctor.model",
    "Outcome": "vllm_doctor.model",
    "Report": "vllm_doctor.model",
    "Severity": "vllm_doctor.model",
    "Stage": "vllm_doctor.model",
}

__all__ = [
    "CheckMeta",
    "DoctorInputError",
    "EngineDoctor",
    "ExtensionMissing",
    "Finding",
    "Outcome",
    "ParityResult",
    "ParityUnavailable",
    "Report",
    "Severity",
    "Stage",
    "__version__",
    "attach",
    "check",
    "check_engine",
    "compare_with_reference",
    "engine_kwargs",
    "profile",
]

if TYPE_CHECKING:
    from vllm_doctor.api import ParityResult, ParityUnavailable, check, check_engine, compare_with_reference, profile
    from vllm_doctor.errors import DoctorInputError
    from vllm_doctor.live.attach import EngineDoctor, ExtensionMissing, attach, engine_kwargs
    from vllm_doctor.model import CheckMeta, Finding, Outcome, Report, Severity, Stage


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
