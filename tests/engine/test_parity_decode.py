"""Parity localised on the step that diverges (issue 25, item 5), against a real vLLM engine.

The port (tests/fixtures/parity_models.py) is right on every prefill and wrong on decode steps
only: layer 1 of 3 scales its MLP output when the attention metadata says max_query_len == 1.
Comparing layer outputs on the first prompt's prefill (what parity did before) finds every layer
matching; the check must compare them on the decode step where the logprobs first differ and
name layer 1 there. One parity engine serves the module; transformers' LlamaForCausalLM (by
model_type) is the reference, its decode step through past_key_values.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator

import pytest

from tests.conftest import REPO
from tests.fixtures.parity_models import DECODE_BUG_LAYER, build_decode_bug_dir, parity_site
from vllm_doctor.stages.parity import ParityEngine, ParityOptions, engine_options, run_parity

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed"),
]
PROMPTS: list[list[int]] = [[5, 9, 13, 40, 77, 101, 3, 8], [7, 8, 9, 10, 11, 12]]


def _options(max_tokens: int = 4) -> ParityOptions:
    return ParityOptions(prompts=[list(p) for p in PROMPTS], max_tokens=max_tokens, device="cpu")


@pytest.fixture(scope="module")
def decode_bug(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ParityEngine]]:
    """The port's checkpoint and one parity engine on it (its plugin on PYTHONPATH)."""
    root = tmp_path_factory.mktemp("decode-bug")
    model = str(build_decode_bug_dir(root / "model"))
    site = parity_site(root / "site")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p))
        engine = ParityEngine(model, engine_options(_options()))
        try:
            yield model, engine
        finally:
            engine.close()


def test_a_decode_only_bug_is_named_on_its_decode_step(decode_bug: tuple[str, ParityEngine]) -> None:
    model, engine = decode_bug
    result = run_parity(model, _options(), engine=engine)
    assert not result.ok, result.message()
    first = result.first_difference
    assert first is not None and first.step >= 1, result.message()  # a decode step ...
    assert all(m.step >= 1 for m in result.mismatches)  # ... and every prefill's logprobs agree
    assert result.engine["model_class"].endswith("DoctorDecodeBugLlama")

    # the prefill-only comparison (what parity did before) would not have named the layer
    prefill = next(c for c in result.layer_checks if (c.prompt, c.step) == (0, 0))
    assert prefill.first_divergent_layer is None and not prefill.diverging
    assert all(row.max_rel <= result.hidden_rtol for row in prefill.layers)

    # the diverging step's comparison does: a real decode step on both sides
    assert result.layers_on == {"prompt": first.prompt, "step": first.step, "phase": "decode"}
    decode = next(c for c in result.layer_checks if c.diverging)
    assert (decode.prompt, decode.step, decode.phase) == (first.prompt, first.step, "decode")
    assert decode.reference_path == "its KV cache (past_key_values)"
    assert decode.note is None  # the capture run reproduced vLLM's logprobs on that step
    assert result.first_divergent_layer == DECODE_BUG_LAYER
    rows = {row.layer: row for row in result.layers}
    assert sorted(rows) == [0, 1, 2]
    assert rows[0].max_rel <= result.hidden_rtol < rows[DECODE_BUG_LAYER].max_rel
    assert rows[0].position0_rel is None  # one row: the token fed at its prompt position
    assert rows[0].worst_position == len(PROMPTS[first.prompt]) + first.step - 1

    text = result.message()
    assert f"decode step {first.step} of prompt {first.prompt}: layer 1's output differs first" in text
    assert "first divergent layer: 1 (model.layers.1)" in text
    assert "prefill of prompt 0 (the logprobs agree there): every decoder layer's output matches" in text
    assert "after the last layer" not in text
    assert "differs on a decode step" in (result.hint or "")

    data = json.loads(json.dumps(result.to_dict()))  # the result's JSON names the prompt, step and layer
    assert data["first_difference"] == {"prompt": first.prompt, "step": first.step, "phase": "decode"}
    assert data["layers_on"] == data["first_difference"] and data["first_divergent_layer"] == DECODE_BUG_LAYER
    assert [(c["step"], c["phase"], c["diverging"], c["first_divergent_layer"]) for c in data["layer_checks"]] == [
        (0, "prefill", False, None), (first.step, "decode", True, DECODE_BUG_LAYER),
    ]  # fmt: skip


def test_on_prefills_alone_the_same_port_matches(decode_bug: tuple[str, ParityEngine]) -> None:
    """One token per prompt: only prefills run, and the port agrees with the reference everywhere."""
    model, engine = decode_bug
    result = run_parity(model, _options(max_tokens=1), engine=engine)
    assert result.ok, result.message()
    assert result.max_logprob_diff < 1e-4 and result.first_divergent_layer is None
    assert [(c.prompt, c.step) for c in result.layer_checks] == [(0, 0)]
    assert all(row.max_rel < 1e-4 for row in result.layers)
