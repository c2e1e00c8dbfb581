"""``vllm-doctor profile --twin ARCH`` whose layout cannot fit is an input error: one line, exit 2,
before any engine starts (the doctor's command line, in a subprocess as a user runs it). What
``--twin auto`` makes of its two engines is tests/unit/test_twin_replies.py's, on their recorded replies.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO, make_examples, run_doctor, variant_env

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]
PORT = "slow-port" if (REPO / "examples" / "perf" / "slow-port" / "variant.py").is_file() else "ok"


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("twin-examples"), PORT)


def test_a_twin_whose_layout_cannot_fit_is_one_line_and_exit_2(examples: Path, tmp_path: Path) -> None:
    proc = run_doctor(["profile", str(examples / PORT / "model"), "--out", str(tmp_path / "p"),
                       "--twin", "Qwen3MoeForCausalLM"], variant_env(examples, PORT), timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "does not fit" in line]
    assert len(errors) == 1 and "Qwen3MoeForCausalLM needs num_experts and moe_intermediate_size" in errors[0], proc.stderr
    assert "engine stage" not in proc.stderr and not (tmp_path / "p" / "report.json").exists()
