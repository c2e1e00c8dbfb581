"""Code that runs INSIDE vLLM's processes: the worker extension and the general plugin.

Nothing here is imported by the doctor's own process except to name the extension class.
Every worker-side reading of vLLM objects goes through :mod:`vllm_doctor.engine.worker_view`,
which probes capabilities (``hasattr``) instead of version numbers; everything a method returns
through ``collective_rpc`` is a plain JSON-able dict.
"""

EXTENSION_QUALNAME = "vllm_doctor.engine.extension.DoctorWorkerExtension"

# the per-layer profiler's sampling (vllm_doctor.engine.profiler), here so that the doctor's side
# can name the defaults without importing torch
DEFAULT_LAYER_EVERY = 4  # after the warm-up, time every 4th step of a phase per layer
LAYER_WARMUP_STEPS = 8  # the first steps of each phase are always timed per layer
