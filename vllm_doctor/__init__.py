"""vllm-doctor: find out why vLLM will not find, build, load or run your custom model."""

from __future__ import annotations

__version__ = "0.1.0"

from vllm_doctor.api import check
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.model import CheckMeta, Finding, Outcome, Report, Severity, Stage

__all__ = [
    "CheckMeta",
    "DoctorInputError",
    "Finding",
    "Outcome",
    "Report",
    "Severity",
    "Stage",
    "__version__",
    "check",
]
