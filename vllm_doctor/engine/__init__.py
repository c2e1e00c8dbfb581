"""Code that runs INSIDE vLLM's processes: the worker extension and the general plugin.

Nothing here is imported by the doctor's own process except to name the extension class.
Every worker-side reading of vLLM objects goes through :mod:`vllm_doctor.compat.worker`,
which probes capabilities (``hasattr``) instead of version numbers; everything a method returns
through ``collective_rpc`` is a plain JSON-able dict. This package imports nothing of the
doctor's own side (checks, reports, stages): see the import table in docs/design.md.
"""

from vllm_doctor.constants import DEFAULT_SAMPLE_EVERY, EXTENSION_QUALNAME, SAMPLE_WARMUP_STEPS

__all__ = ["DEFAULT_SAMPLE_EVERY", "EXTENSION_QUALNAME", "SAMPLE_WARMUP_STEPS"]
