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
    Check,
    Emit,
    check,
    needs_import,
    run_checks,
    select_codes,
)

__all__ = ["CATALOGUE", "GATES", "Check", "Emit", "check", "needs_import", "run_checks", "select_codes"]
