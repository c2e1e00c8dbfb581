"""The weights pass, child side: build the model on the meta device in a FRESH process and
drive its real ``load_weights`` with the checkpoint's names, shapes and dtypes
(compat/weights.py).

Run only through :mod:`vllm_doctor.stages.child` (task ``weights``). The parent side,
:mod:`vllm_doctor.stages.weights`, starts it and returns at once, so the weights pass runs
while the import pass runs (two processes, each importing vLLM once).
"""

from __future__ import annotations

from typing import Any


def child_task(request: dict[str, Any], _progress: Any) -> dict[str, Any]:
    """The child's side (run through :mod:`vllm_doctor.stages.child`): the meta-device load."""
    try:
        from vllm_doctor.compat.weights import meta_load

        return meta_load(request)
    except BaseException as exc:  # the doctor's own bug: reported as the pass's "internal" stage
        return {"error": {"stage": "internal", "summary": f"{type(exc).__name__}: {exc}", "traceback": ""}}
