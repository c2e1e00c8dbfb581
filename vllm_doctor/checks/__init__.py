"""The check catalogue. Families are imported explicitly so the order is stable."""

from vllm_doctor.checks import (  # noqa: F401  (registers checks)
    contract,
    engine,
    registry,
    weights,
)
from vllm_doctor.checks.base import (
    CATALOGUE,
    GATES,
    TOPICS,
    Check,
    Emit,
    check,
    codes_for,
    needs_import,
    reads_startup_error,
    run_checks,
    select_codes,
)

__all__ = [
    "CATALOGUE",
    "GATES",
    "TOPICS",
    "Check",
    "Emit",
    "check",
    "codes_for",
    "needs_import",
    "reads_startup_error",
    "run_checks",
    "select_codes",
]
