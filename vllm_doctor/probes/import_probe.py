"""The import pass, child side: load vLLM and the plugins in a FRESH process, as an engine
process would, then import and inspect the class registered for each architecture.

Run only through :mod:`vllm_doctor.stages.child` (task ``import``; the parent side is
:func:`vllm_doctor.stages.static.add_import_facts`), so a user's model module that initialises
CUDA, hangs or crashes on import can only take this child down.
"""

from __future__ import annotations

import time
from typing import Any

from vllm_doctor.compat.common import format_exc


def child_task(request: dict[str, Any], _progress: Any) -> dict[str, Any]:
    """The child's side (run through :mod:`vllm_doctor.stages.child`)."""
    result: dict[str, Any] = {"timings": {}}

    t0 = time.monotonic()
    try:
        from vllm_doctor.compat import runtime as live

        version = live.import_vllm()
    except Exception as exc:  # no vLLM, or a broken install
        result["fatal"] = f"cannot import vLLM in a fresh process: {type(exc).__name__}: {exc}"
        return result
    result["timings"]["import_vllm"] = time.monotonic() - t0
    result["vllm_version"] = version
    t1 = time.monotonic()
    result["plugins"] = live.load_general_plugins_observed()
    result["timings"]["plugins"] = time.monotonic() - t1
    result["registry"] = live.registry_snapshot()
    try:
        result["transformers_model_types"] = live.transformers_model_types()
    except Exception as exc:
        result["transformers_model_types_error"] = repr(exc)
    classes: dict[str, Any] = {}
    for arch in request.get("architectures", []):
        target = result["registry"].get(arch)
        if not target or target == "?":
            continue
        t2 = time.monotonic()
        cls, record = live.load_class(target)
        if cls is not None:
            try:
                record["contract"] = live.contract_facts(cls)
            except Exception as exc:
                record["contract_error"] = format_exc(exc)
        record["seconds"] = time.monotonic() - t2
        classes[arch] = record
    result["classes"] = classes
    result["vllm_config_model_types"] = live.vllm_config_model_types()
    if request.get("model_dir"):
        t3 = time.monotonic()
        result["config_verdict"] = live.config_verdict(request["model_dir"], bool(request.get("trust_remote_code")))
        result["timings"]["config_verdict"] = time.monotonic() - t3
    result["cuda_initialized"] = live.cuda_initialized()
    return result
