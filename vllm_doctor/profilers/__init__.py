"""Pure summaries of what the worker-side profiler measured (no vLLM, no torch)."""
