"""The check catalogue. Families are imported explicitly so the order is stable.

Static stage: ``registry``, ``contract``, ``perf`` (the performance lint, also run on the engine
stage's worker facts), and the checkpoint against the model (VD3xx), one module per topic:
``weight_loading``, ``parallel_sizes``, ``checkpoint_files``, ``config_sizes``, ``model_build``,
``moe``, ``towers`` (their shared gates and helpers: ``weights_base``, ``tower_load``). Engine
stage, one module per topic: ``startup``, ``placement``, ``probe``, ``ranks``, ``kv_cache``,
``memory``, ``attention``, ``multimodal_merge``, ``quant_layers`` and ``doctor`` (their shared gates and helpers:
``engine_base``).
"""

from vllm_doctor.checks import (  # noqa: F401  (registers checks)
    attention,
    contract,
    doctor,
    hybrid,
    kv_cache,
    memory,
    model_files,
    multimodal_merge,
    perf,
    placement,
    probe,
    quant_layers,
    ranks,
    registry,
    startup,
)

# isort: off
# VD3xx in code order: the catalogue keeps the order the checks register in
from vllm_doctor.checks import weight_loading, parallel_sizes, checkpoint_files, config_sizes, model_build, moe, towers  # noqa: F401
from vllm_doctor.checks import quantization  # noqa: F401

# what check --fast tells from config.json alone for the checks above that need the import pass
from vllm_doctor.checks import config_only  # noqa: F401

# isort: on
from vllm_doctor.checks.base import (
    CATALOGUE,
    GATES,
    TOPICS,
    Check,
    Emit,
    check,
    codes_for,
    needs_import,
    reads_startup_error,
    run_checks,
    select_codes,
)

__all__ = [
    "CATALOGUE",
    "GATES",
    "TOPICS",
    "Check",
    "Emit",
    "check",
    "codes_for",
    "needs_import",
    "reads_startup_error",
    "run_checks",
    "select_codes",
]
