"""VD502 on a real engine whose KV cache is too small: vLLM preempts, the doctor counts it
(the counting on plain data: tests/unit/test_preemption_counts.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vd502_on_a_real_engine_whose_kv_cache_is_too_small(tmp_path: Path) -> None:
    """Four 200-token generations in a 3-block (384-token) KV cache: vLLM must preempt."""
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.fixtures.preemption_child", str(out)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert out.exists(), proc.stderr[-4000:]
    data = json.loads(out.read_text())
    (f,) = data["vd502"]
    assert f["outcome"] == "warn"
    assert f["evidence"]["preempted"] >= 1 and f["evidence"]["peak_usage"] == 1.0
    assert data["generated"] == [200, 200, 200, 200]  # preemption costs time, not tokens
