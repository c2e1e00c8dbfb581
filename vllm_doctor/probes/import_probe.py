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


def handover_refusal(model_dir: str) -> str | None:
    """Why vLLM is not asked for its verdict on the directory (it loads the config, the processor
    files and the tokenizer, and feeds the multimodal processor dummy images of the config's size):
    a file it would open links outside the directory, is no regular file or is over its size limit
    (VD113, VD306), or config.json's vision tower sizes are over vllm-doctor's bounds (VD309).
    Checked here, in the child, before vLLM sees the directory; opens nothing but config.json."""
    from vllm_doctor.errors import DoctorInputError
    from vllm_doctor.facts.config_bounds import vision_size_problems
    from vllm_doctor.probes import model_files
    from vllm_doctor.probes.model_dir import resolve_model_dir

    refusal = model_files.handover_refusal(model_files.refused_files(model_dir))
    if refusal is not None:
        return refusal
    try:
        config = resolve_model_dir(model_dir).config
    except DoctorInputError as exc:
        return exc.message
    bad = vision_size_problems(config)
    if bad:
        listed = "; ".join(f"{p['key']} = {p['value']}" for p in bad[:3])
        return f"config.json's vision tower sizes are over vllm-doctor's bounds ({listed}; see VD309)"
    return None


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
        refusal = handover_refusal(request["model_dir"])
        if refusal is not None:  # vLLM would open those files (or build from those sizes): not asked
            result["config_verdict_refused"] = refusal
        else:
            t3 = time.monotonic()
            result["config_verdict"] = live.config_verdict(request["model_dir"], bool(request.get("trust_remote_code")))
            result["timings"]["config_verdict"] = time.monotonic() - t3
    result["cuda_initialized"] = live.cuda_initialized()
    return result
