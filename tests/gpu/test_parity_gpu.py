"""Parity with Hugging Face on an NVIDIA GPU (``pytest -m gpu tests/gpu/test_parity_gpu.py``).

The example folder an author copies (examples/pytest_for_model_authors/tests) runs with
``--vllm-doctor-device cuda``: the working example passes ``assert_logprobs_close`` and the
rotary-layout port fails naming layer 0. Then an in-tree architecture (vLLM's Llama vs
transformers' ``AutoModelForCausalLM``, no author class) through the Python API. float32
throughout; vLLM and the reference run one after the other on the GPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import make_examples
from tests.engine.test_pytest_for_model_authors import run_author_tests
from tests.gpu.test_engine_gpu import _cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(not _cuda(), reason="no CUDA device"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("gpu-ports"), "ok", "rotary-gptj-layout")


def test_the_working_example_matches_its_reference_on_cuda(built: Path, tmp_path: Path) -> None:
    proc, report = run_author_tests(built, "ok", tmp_path, "-k", "hf_reference", "--vllm-doctor-device", "cuda")
    assert proc.returncode == 0, proc.stdout[-6000:]
    (outcome,) = report["outcomes"]
    parity = outcome["details"]["parity"]
    assert parity["engine"]["device"] == "cuda"
    assert parity["mismatches"] == [] and parity["max_logprob_diff"] < 1e-3


def test_the_rotary_port_fails_at_layer_0_on_cuda(built: Path, tmp_path: Path) -> None:
    proc, report = run_author_tests(
        built, "rotary-gptj-layout", tmp_path, "-k", "hf_reference", "--vllm-doctor-device", "cuda"
    )
    assert proc.returncode == 1, proc.stdout[-6000:]
    assert "first divergent layer: 0 (model.layers.0)" in proc.stdout
    assert report["outcomes"][0]["details"]["parity"]["engine"]["device"] == "cuda"


def test_an_in_tree_llama_matches_auto_model_for_causal_lm_on_cuda(tmp_path: Path) -> None:
    from tests.fixtures.engine_models import build_llama_dir
    from vllm_doctor.api import compare_with_reference

    model = build_llama_dir(tmp_path / "llama", ["LlamaForCausalLM"], dtype="float32")
    result = compare_with_reference(str(model), prompts=[[5, 9, 13, 40, 77, 101, 3, 8]], device="cuda", max_tokens=8)
    assert result.ok, result.message()
    assert result.engine["device"] == "cuda"
