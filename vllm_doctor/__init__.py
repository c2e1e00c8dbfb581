"""vllm-doctor: find out why vLLM will not find, build, load or run your custom model."""

from __future__ import annotations

__version__ = "0.1.0"

from vllm_doctor.api import check
from vllm_doctor.attach import EngineDoctor, ExtensionMissing, attach, engine_kwargs
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import CheckMeta, Finding, Outcome, Report, Severity, Stage

__all__ = [
    "CheckMeta",
    "DoctorInputError",
    "EngineDoctor",
    "ExtensionMissing",
    "Finding",
    "Outcome",
    "Report",
    "Severity",
    "Stage",
    "__version__",
    "attach",
    "check",
    "engine_kwargs",
]
