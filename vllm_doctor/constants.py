"""Names shared by the doctor's own process and the code it runs inside vLLM (stdlib only).

Both sides import these from here, so the doctor's side never imports :mod:`vllm_doctor.engine`
(code for vLLM's workers) to learn a name, and the workers never import the doctor's side.
"""

from __future__ import annotations

# what ``worker_extension_cls`` names; vllm_doctor.engine.extension defines the class
EXTENSION_QUALNAME = "vllm_doctor.engine.extension.DoctorWorkerExtension"

# the forward profiler's sampling (vllm_doctor.engine.profiler): detailed timing (CUDA events on
# GPU, per-layer timing) on the first SAMPLE_WARMUP_STEPS steps of each phase, then on every N-th
DEFAULT_SAMPLE_EVERY = 8
SAMPLE_WARMUP_STEPS = 8
