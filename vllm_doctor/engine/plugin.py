"""The doctor's ``vllm.general_plugins`` entry point: a no-op unless ``VLLM_DOCTOR=1``.

vLLM calls :func:`register` in every process it starts (front end, engine core, workers).
Without ``VLLM_DOCTOR=1`` it returns at once and imports nothing. With it, each process:

- logs one line naming itself (pid, parent, command), so ``vllm serve`` logs show the process
  tree the doctor will talk to;
- records itself as ``proc-<pid>.json`` in ``VLLM_DOCTOR_DIR`` (default
  ``$TMPDIR/vllm-doctor-<uid>``), written atomically: the anatomy of a served engine, readable
  by ``vllm-doctor`` from outside.

It never changes what vLLM computes. To call the doctor's worker methods in a served engine,
also pass ``--worker-extension-cls vllm_doctor.engine.extension.DoctorWorkerExtension`` and, for
vLLM's ``/collective_rpc`` endpoint, ``VLLM_SERVER_DEV_MODE=1``.
"""

from __future__ import annotations

import os

ENV_FLAG = "VLLM_DOCTOR"
_registered = False


def active() -> bool:
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


def record_dir() -> str:
    base = os.environ.get("VLLM_DOCTOR_DIR")
    if base:
        return base
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"vllm-doctor-{os.getuid()}")


def register() -> None:
    """Entry point called by vLLM's ``load_general_plugins`` (may run several times per process)."""
    global _registered
    if not active() or _registered:
        return
    _registered = True
    try:
        _announce()
    except Exception:
        pass


def _announce() -> None:
    import json
    import logging
    import sys
    import time

    from vllm_doctor.report.io import write_text_atomic

    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": [a[:200] for a in sys.argv[:12]],
        "started": time.time(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
    }
    path = os.path.join(record_dir(), f"proc-{os.getpid()}.json")
    write_text_atomic(path, json.dumps(record, indent=1) + "\n")
    logging.getLogger("vllm_doctor").warning(
        "vllm-doctor plugin active in pid %d (parent %d): recorded in %s", os.getpid(), os.getppid(), path
    )
