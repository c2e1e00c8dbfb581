"""Ground truth for custom hybrid (Mamba 2 + attention) models: what the real vLLM CPU engine
does with each example of make_examples.py's hybrid family (tests/fixtures/hybrid_expected.py).

examples/tiny_hybrid_plugin is a Nemotron-H-like model (vLLM's MambaMixer2 and Attention,
pattern M*M-); examples/hybrid/NAME are its broken variants. Each runs once on its own engine
(tests/engine_tokens.py: eager, engine core in process). vLLM's messages for these mistakes name
neither the class nor the interface: a bare AssertionError, a TypeError about None; VD214 and
VD215 name the layer and what is missing (the doctor's side, before launch:
tests/unit/test_hybrid_checks_replies.py, on recorded pass replies).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import make_examples
from tests.engine_tokens import PROMPTS
from tests.fixtures import ground_truth
from tests.fixtures.hybrid_expected import EXPECTED

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("hybrid-examples"), *EXPECTED)


truth, runs = ground_truth.variant_fixtures("hybrid", EXPECTED)


def test_the_live_variants_answer_as_recorded(truth: ground_truth.Truth) -> None:
    """vLLM still does with the family's live variants what it did when it was recorded."""
    ground_truth.assert_as_recorded("hybrid", truth)


def test_every_hybrid_variant_has_an_expectation() -> None:
    on_disk = {p.name for p in (EXAMPLES / "hybrid").iterdir() if (p / "variant.py").is_file()}
    assert on_disk | {"hybrid-ok"} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vllm_behaviour(name: str, truth: ground_truth.Truth) -> None:
    result, expected = truth.answers[name], EXPECTED[name]
    shown = json.dumps({k: v for k, v in result.items() if k != "log_tail"}, indent=1)[:3000]
    assert result["phase"] == expected.phase, shown
    if expected.phase == "ran":
        assert len(result["token_ids"]) == len(PROMPTS) and all(result["token_ids"]), shown
        assert result["model_class"] == "tiny_hybrid_model.model.TinyHybridForCausalLM", shown
        return
    assert expected.error is not None and expected.error in result["error_message"], shown
