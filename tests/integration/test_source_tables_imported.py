"""The fast pass reads vLLM's model registry from source (no import); it must equal the registry
vLLM builds when imported (in a subprocess). The source reader itself: tests/unit/test_source_tables.py."""

from __future__ import annotations

import subprocess
import sys

from vllm_doctor.compat.source_tables import read_vllm_registry_tables


def _live(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_vllm_registry_table_read_from_source_equals_the_imported_registry() -> None:
    tables = read_vllm_registry_tables()
    assert tables is not None
    live = _live(
        "from vllm.model_executor.models.registry import ModelRegistry as R\n"
        "print('\\n'.join(sorted(f'{a}={m.module_name}:{m.class_name}' for a, m in R.models.items())))"
    ).splitlines()
    ours = sorted(f"{a}={m}:{c}" for a, (m, c) in tables.builtin.items())
    assert ours == live
    assert "TransformersForCausalLM" in tables.transformers_backend_archs
