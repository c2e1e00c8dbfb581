"""The Python API: ``vllm_doctor.check(path)`` from a user's own script or test."""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.model import Report
from vllm_doctor.stages.static import CheckOptions, caller_registry, diagnose


def check(
    model: str,
    *,
    trust_remote_code: bool = False,
    fast: bool = False,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    import_timeout: float = 180.0,
) -> Report:
    """Run the static checks on a model directory and return the :class:`Report`.

    Called from the script that registers your model, it also compares this process's
    registry with a fresh engine process's (VD102: registration invisible to the engine).
    Raises :class:`vllm_doctor.DoctorInputError` for a bad path or unreadable config.json.
    """
    options = CheckOptions(
        trust_remote_code=trust_remote_code,
        fast=fast,
        select=set(select),
        ignore=set(ignore),
        caller_registry=caller_registry(),
        import_timeout=import_timeout,
    )
    return diagnose(model, options)
