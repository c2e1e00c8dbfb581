"""The Textual TUI: ``vllm-doctor top`` (live), ``replay`` (a recording) and ``view`` (a report).

A front end: it draws frames that ``vllm_doctor.live`` produces and reports the doctor wrote;
it never imports vLLM, NVML or ``compat``.
"""
