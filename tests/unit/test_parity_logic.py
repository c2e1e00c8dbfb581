"""The parity comparison (vllm_doctor.analysis.parity) on plain data, and the worker-side
layer-output rule (vllm_doctor.engine.hidden.layer_output). The real engine runs are in
tests/engine/test_pytest_for_model_authors.py."""

from __future__ import annotations

import torch

from vllm_doctor.analysis.parity import ParityResult, compare_hidden, compare_outputs, hint_for, tolerances
from vllm_doctor.engine.hidden import layer_output


def run(tokens: list[int], steps: list[dict[int, float]]) -> dict:
    return {"token_ids": tokens, "logprobs": [{str(k): v for k, v in s.items()} for s in steps]}


def test_same_tokens_and_values_pass() -> None:
    ours = [run([5, 6], [{5: -0.1, 7: -3.0}, {6: -0.2, 8: -2.0}])]
    ref = [run([5, 6], [{5: -0.1000004, 7: -3.0}, {6: -0.2, 8: -2.0000009}])]
    mismatches, largest = compare_outputs(ours, ref, atol=1e-3, top_k=2)
    assert mismatches == [] and 0 < largest < 1e-5


def test_same_tokens_with_logprobs_beyond_tolerance_fail() -> None:
    ours = [run([5, 6], [{5: -0.1, 7: -3.0}, {6: -0.2, 8: -2.0}])]
    ref = [run([5, 6], [{5: -0.1, 7: -3.0}, {6: -0.205, 8: -2.0}])]
    (m,), largest = compare_outputs(ours, ref, atol=1e-3, top_k=2)
    assert (m.prompt, m.step, m.kind) == (0, 1, "logprob") and abs(largest - 0.005) < 1e-9
    assert "same token 6, but logprob of token 6 is -0.200000 in vLLM vs -0.205000" in m.detail


def test_a_near_tie_flip_inside_each_others_top_k_passes_and_stops_the_prompt() -> None:
    # vLLM's check_logprobs_close rule: both picks in the other's top-k -> fine, then stop
    ours = [run([5, 9, 1], [{5: -0.6931, 9: -0.6932}, {9: -0.1}, {1: -0.1}])]
    ref = [run([9, 2, 2], [{9: -0.6931, 5: -0.6932}, {2: -0.1}, {2: -0.1}])]
    mismatches, _ = compare_outputs(ours, ref, atol=1e-3, top_k=2)
    assert mismatches == []


def test_a_pick_outside_the_others_top_k_fails() -> None:
    ours = [run([5], [{5: -0.1, 6: -3.0}])]
    ref = [run([9], [{9: -0.1, 6: -3.0}])]
    (m,), _ = compare_outputs(ours, ref, atol=1e-3, top_k=2)
    assert m.kind == "token" and m.detail == "vLLM picked 5, the reference 9: not in each other's top-2"


def test_first_divergent_layer_and_positional_hint() -> None:
    ref = {"0": [[1.0, 2.0], [1.0, 2.0]], "1": [[2.0, 4.0], [2.0, 4.0]], "2": [[3.0, 1.0], [3.0, 1.0]]}
    ours = {"0": [[1.0, 2.0], [1.0, 2.0]], "1": [[2.0, 4.0], [2.5, 4.0]], "2": [[3.0, 1.0], [3.9, 1.0]]}
    rows, first = compare_hidden(ours, ref, {"1": "model.layers.1"}, rtol=1e-3)
    assert first == 1 and [r.layer for r in rows] == [0, 1, 2]
    assert rows[1].max_abs == 0.5 and rows[1].max_rel == 0.5 / 4.0 and rows[1].worst_position == 1
    assert rows[1].position0_rel == 0.0
    assert "positional bug" in (hint_for(rows, first, 1e-3) or "")


def test_small_error_everywhere_hints_a_numerical_detail_large_one_the_weights() -> None:
    ref = {"0": [[1.0, 2.0], [1.0, 2.0]]}
    small, first = compare_hidden({"0": [[1.01, 2.0], [1.0, 2.01]]}, ref, {}, rtol=1e-3)
    assert first == 0 and "epsilon" in (hint_for(small, first, 1e-3) or "")
    large, first = compare_hidden({"0": [[-1.0, 2.0], [1.0, 0.0]]}, ref, {}, rtol=1e-3)
    assert "load_weights" in (hint_for(large, first, 1e-3) or "")


def test_failure_message_has_the_table_up_to_the_first_divergent_layer() -> None:
    ref = {"0": [[1.0, 2.0]], "1": [[2.0, 4.0]], "2": [[3.0, 1.0]]}
    ours = {"0": [[1.0, 2.0]], "1": [[2.0, 4.4]], "2": [[3.9, 1.0]]}
    rows, first = compare_hidden(ours, ref, {"0": "model.layers.0", "1": "model.layers.1"}, rtol=1e-3)
    atol, rtol = tolerances("float32")
    ours_out, ref_out = [run([5], [{5: -0.1}])], [run([5], [{5: -0.2}])]
    mismatches, largest = compare_outputs(ours_out, ref_out, atol, 5)
    result = ParityResult("m", "HF", "float32", atol, rtol, 1, 1, 5, mismatches, largest, rows, first)
    result.hint = hint_for(rows, first, rtol)
    text = result.message()
    assert not result.ok
    assert "first divergent layer: 1 (model.layers.1)" in text
    table = text[text.index("layer  max abs err") :].splitlines()
    assert [line.split()[0] for line in table[1:3]] == ["0", "1"] and table[2].endswith("<-")
    assert "fix:" in text


def test_layer_output_adds_the_deferred_residual() -> None:
    hidden, residual = torch.ones(2, 3), torch.full((2, 3), 2.0)
    assert torch.equal(layer_output((hidden, residual)), torch.full((2, 3), 3.0))  # vLLM's pair form
    assert torch.equal(layer_output(hidden), hidden)  # a layer that adds its residual itself
    assert torch.equal(layer_output((hidden, None)), hidden)
    assert layer_output("not a tensor") is None
