"""Ground truth for custom MLA (multi-head latent attention) ports: what the real vLLM CPU engine
does with each example of make_examples.py's MLA family (tests/fixtures/mla_expected.py).

examples/tiny_mla_plugin is a DeepSeek-V2-Lite-like model (vLLM's MultiHeadLatentAttentionWrapper,
latent 512 + rope 64, a dense MLP); examples/mla/NAME are its broken variants. Each runs once on its
own engine (tests/engine_tokens.py: eager, engine core in process; none of these mistakes is about
the compiled mode). vLLM's words for a hard-coded latent are a tensor-size assertion while it loads;
for a model type it does not know as MLA, a head size nobody configured at the first request; a
prefix that is no place in the model it takes silently. The doctor's side:
tests/unit/test_mla_checks_replies.py (before launch, on recorded pass replies), tests/engine/test_mla_checks_engine.py.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_examples
from tests.engine_harness import host_has_amx
from tests.engine_tokens import PROMPTS
from tests.fixtures import ground_truth
from tests.fixtures.mla_expected import EXPECTED

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("mla-examples"), *EXPECTED)


truth, runs = ground_truth.variant_fixtures("mla", EXPECTED)


def test_the_live_variants_answer_as_recorded(truth: ground_truth.Truth) -> None:
    """vLLM still does with the family's live variants what it did when it was recorded."""
    ground_truth.assert_as_recorded("mla", truth)


def test_every_mla_variant_has_an_expectation() -> None:
    on_disk = {p.name for p in (EXAMPLES / "mla").iterdir() if (p / "variant.py").is_file()}
    assert on_disk | {"mla-ok"} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vllm_behaviour(name: str, truth: ground_truth.Truth) -> None:
    result, expected = truth.answers[name], EXPECTED[name]
    shown = json.dumps({k: v for k, v in result.items() if k not in ("log_tail", "logprobs")}, indent=1)[:3000]
    assert result["phase"] == expected.phase, shown
    if expected.phase == "ran":
        assert len(result["token_ids"]) == len(PROMPTS) and all(result["token_ids"]), shown
        assert result["model_class"].endswith(".model.TinyMlaForCausalLM"), shown
        if expected.same_tokens_as_ok:
            assert result["token_ids"] == truth.beside(name, "mla-ok")["token_ids"], shown
        return
    assert expected.error is not None and expected.error in result["error_message"], shown


def test_vllm_runs_the_example_as_mla(runs: dict[str, dict[str, Any]]) -> None:
    """vLLM picked its MLA backend for the working example and sized the cache for the latent."""
    log = Path(runs["mla-ok"]["log_path"]).read_text()
    # on an AMX host vLLM picks its AMX MLA backend for bf16 (block size 128), elsewhere CPU_MLA
    backend = "AMX_MLA" if host_has_amx() else "CPU_MLA"
    assert f"Using {backend} backend." in log
