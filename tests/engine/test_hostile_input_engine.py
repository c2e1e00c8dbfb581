"""Untrusted model directories: what the doctor never does with them (real vLLM, CPU).

`cd downloaded-model && vllm-doctor check .` must not import a `vllm.py` (or `torch.py`, ...)
lying in that directory: not in the doctor, not in its children (import pass, weights pass,
engine stage), not in the processes vLLM starts below them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]
PLANTED = ("vllm", "torch", "transformers", "safetensors", "numpy", "json", "vllm_doctor")


def test_modules_in_the_current_directory_are_never_imported(tmp_path: Path) -> None:
    from tests.fixtures.engine_models import build_llama_dir

    model = build_llama_dir(tmp_path / "downloaded-model", ["LlamaForCausalLM"])
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in PLANTED:
        (model / f"{name}.py").write_text(
            f"open({str(markers / name)!r}, 'w').write('imported')\nraise SystemExit('planted {name} imported')\n"
        )
    script = Path(sys.executable).with_name("vllm-doctor")
    assert script.exists(), "the console script (pip install -e .) runs the doctor as users run it"
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(
        [str(script), "check", ".", "--engine", "--eager", "--json", "--select", "VD1,VD3,VD401,VD500"],
        cwd=model, env=env, capture_output=True, text=True, timeout=900,
    )
    assert sorted(p.name for p in markers.iterdir()) == [], proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    outcomes = {f["code"]: f["outcome"] for f in report["findings"]}
    assert report["facts"]["registry_source"] == "import"  # the import pass ran
    assert outcomes["VD301"] == "pass" and outcomes["VD500"] == "pass"  # so did the weights pass and the engine
