"""The doctor's two ``vllm.general_plugins`` entry points, side by side (pyproject.toml names both).

vLLM's ``load_general_plugins`` imports this module and calls both functions in every process it
starts (the API server or the script that builds ``vllm.LLM``, the engine core, each worker),
maybe several times in one process. So each is a thin switch: it reads the environment and
returns at once unless the user opted in, importing nothing beyond :mod:`vllm_doctor.constants`;
only then it imports the code that does the work, where that code lives:

- :func:`register` (entry point ``vllm_doctor``, ``VLLM_DOCTOR=1``): the worker side,
  :func:`vllm_doctor.engine.plugin.register`: each process records itself, the process that builds
  the engine config gives it the doctor's worker extension, a process that holds a worker opens
  the private channel;
- :func:`register_metrics` (entry point ``vllm_doctor_metrics``, ``VLLM_DOCTOR=1`` and
  ``VLLM_DOCTOR_METRICS=1``): the doctor's series in ``/metrics``,
  :func:`vllm_doctor.live.exporter.register`, which starts its reader only in a ``vllm serve``
  API server (never in the engine core, a worker or a script's ``vllm.LLM``).

Two entry points, not one: ``VLLM_PLUGINS`` (vLLM's list of the plugins to load) can leave the
/metrics series out and keep the worker side. This module imports ``engine`` and ``live`` only
inside these functions, so neither package imports the other (docs/design.md).
"""

from __future__ import annotations

from vllm_doctor.constants import DOCTOR_ENV, METRICS_ENV, env_switch

__all__ = ["register", "register_metrics"]


def register() -> None:
    """The ``vllm_doctor`` entry point: the worker side, a no-op unless ``VLLM_DOCTOR=1``."""
    if not env_switch(DOCTOR_ENV):
        return
    from vllm_doctor.engine.plugin import register as worker_side

    worker_side()


def register_metrics() -> None:
    """The ``vllm_doctor_metrics`` entry point: the /metrics exporter, a no-op unless both
    ``VLLM_DOCTOR=1`` and ``VLLM_DOCTOR_METRICS=1`` (the exporter then checks that this process
    is the API server)."""
    if not (env_switch(DOCTOR_ENV) and env_switch(METRICS_ENV)):
        return
    from vllm_doctor.live.exporter import register as exporter

    exporter()
