"""Code that runs INSIDE vLLM's processes: the worker extension and the general plugin.

Nothing here is imported by the doctor's own process except to name the extension class.
Every worker-side reading of vLLM objects goes through :mod:`vllm_doctor.engine.worker_view`,
which probes capabilities (``hasattr``) instead of version numbers; everything a method returns
through ``collective_rpc`` is a plain JSON-able dict.
"""

EXTENSION_QUALNAME = "vllm_doctor.engine.extension.DoctorWorkerExtension"

# the forward profiler's sampling (vllm_doctor.engine.profiler), here so that the doctor's side
# can name the defaults without importing torch: detailed timing (CUDA events on GPU, per-layer
# timing) on the first SAMPLE_WARMUP_STEPS steps of each phase, then on every N-th
DEFAULT_SAMPLE_EVERY = 8
SAMPLE_WARMUP_STEPS = 8
