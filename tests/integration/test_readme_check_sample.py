"""README.md's `check` sample is a real run (issue 47 item 14): the same command on the same
variant (`make demo`'s first) prints the same findings, fixes and skips today. Only the model
directory's location, the timings and how many checks passed or did not apply may differ; on
another vLLM than the sample's, the test skips (what it prints is vLLM's too)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.conftest import CHECK_LIMIT, make_examples, run_doctor, variant_env

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
README = Path(__file__).resolve().parents[2] / "README.md"
NAME = "registered-under-model-type"
PROMPT = f"$ PYTHONPATH=ex/{NAME}/site vllm-doctor check ex/{NAME}/model\n"


def _sample() -> list[str]:
    text = README.read_text(encoding="utf-8")
    return text.split(PROMPT, 1)[1].split("```", 1)[0].splitlines()


def _timings_masked(lines: list[str]) -> list[str]:
    """The lines with the timings and the counts of checks that passed or did not apply masked (a
    check added to the catalogue changes those; the findings, their fixes and the skips stay)."""
    return [re.sub(r"\d+ (n/a|ok|skip)\b", r"N \1", re.sub(r"\d+\.\d+ s", "N s", line)) for line in lines]


def test_the_readme_check_sample_is_what_check_prints(tmp_path: Path) -> None:
    sample = _sample()
    ex = make_examples(tmp_path / "ex", NAME)
    proc = run_doctor(["check", str(ex / NAME / "model"), *CHECK_LIMIT], variant_env(ex, NAME), timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # the sample's directory was /tmp/d1/ex (its first line names it)
    sample_dir = sample[0].removeprefix("vllm-doctor check ").removesuffix(f"/{NAME}/model")
    printed = proc.stdout.replace(str(ex), sample_dir).splitlines()
    if printed[1] != sample[1]:
        pytest.skip(f"the sample was made with {sample[1].strip()}; this is {printed[1].strip()}")
    assert _timings_masked(printed) == _timings_masked(sample)
