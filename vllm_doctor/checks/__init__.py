"""The check catalogue. Families are imported explicitly so the order is stable."""

from vllm_doctor.checks import (  # noqa: F401  (registers checks)
    contract,
    engine,
    registry,
    weights,
)
from vllm_doctor.checks.base import CATALOGUE, Check, Emit, check

__all__ = ["CATALOGUE", "Check", "Emit", "check"]
