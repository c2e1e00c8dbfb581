"""The parity comparison (vllm_doctor.analysis.parity) on plain data, and the worker-side
layer-output rule (vllm_doctor.engine.hidden.layer_output). The real engine runs are in
tests/engine/test_pytest_for_model_authors.py."""

from __future__ import annotations

import torch
from torch import nn

from vllm_doctor.analysis.parity import (
    LayerCheck,
    ParityResult,
    PromptMismatch,
    compare_hidden,
    compare_outputs,
    compare_parts,
    first_difference,
    hint_for,
    localise,
    tolerances,
)
from vllm_doctor.engine.hidden import HiddenCapture, layer_output


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
    result = ParityResult("m", "HF", "float32", atol, rtol, 1, 1, 5, mismatches, largest)
    localise(result, [LayerCheck(0, 0, rows, first)])
    text = result.message()
    assert not result.ok and result.first_divergent_layer == 1 and result.layers == rows
    assert result.layers_on == {"prompt": 0, "step": 0, "phase": "prefill"}
    assert "prefill of prompt 0: layer 1's output differs first (max rel err 0.1 > rtol 0.001)" in text
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


# ---- the step the layers are compared on (issue 25, item 5) ----------------------------------

REF3 = {"0": [[1.0, 2.0]], "1": [[2.0, 4.0]], "2": [[3.0, 1.0]]}
DECODE_BUG = {"0": [[1.0, 2.0]], "1": [[2.0, 6.0]], "2": [[3.5, 1.0]]}  # layer 1 wrong on the step


def mismatch(prompt: int, step: int) -> PromptMismatch:
    return PromptMismatch(prompt, step, "logprob", f"differs at {prompt}/{step}", 0.01)


def result_with(*mismatches: PromptMismatch) -> ParityResult:
    atol, rtol = tolerances("float32")
    return ParityResult("m", "HF", "float32", atol, rtol, 2, 4, 5, list(mismatches), 0.01)


def check(prompt: int, step: int, ours: dict, first_position: int = 0, **kw: str) -> LayerCheck:
    rows, first = compare_hidden(ours, REF3, {}, rtol=1e-3, first_position=first_position)
    return LayerCheck(prompt, step, rows, first, **kw)


def test_the_first_difference_is_the_earliest_step_then_the_lowest_prompt() -> None:
    assert first_difference([]) is None
    assert first_difference([mismatch(0, 3), mismatch(1, 2)]) == mismatch(1, 2)
    assert first_difference([mismatch(1, 0), mismatch(0, 5)]) == mismatch(1, 0)  # a prefill first
    assert first_difference([mismatch(2, 1), mismatch(1, 1)]) == mismatch(1, 1)


def test_a_decode_step_row_is_reported_at_its_prompt_position_without_a_position_0() -> None:
    rows, first = compare_hidden(DECODE_BUG, REF3, {}, rtol=1e-3, first_position=11)
    assert first == 1 and [r.worst_position for r in rows] == [11, 11, 11]
    assert all(r.position0_rel is None for r in rows)
    # one row at position 11 is no evidence of a positional bug, whatever its error
    assert "positional" not in (hint_for(rows, first, 1e-3, "decode") or "")


def test_a_decode_only_bug_is_named_on_its_decode_step_with_the_prefill_as_context() -> None:
    result = result_with(mismatch(0, 3), mismatch(1, 3))
    prefill, decode = check(0, 0, REF3), check(0, 3, DECODE_BUG, 10, reference_path="its KV cache (past_key_values)")
    localise(result, [prefill, decode])
    assert (prefill.diverging, decode.diverging) == (False, True)
    assert result.first_divergent_layer == 1 and result.layers == decode.layers
    assert result.layers_on == {"prompt": 0, "step": 3, "phase": "decode"}
    text = result.message()
    assert "decode step 3 of prompt 0: layer 1's output differs first (max rel err 0.5 > rtol 0.001)" in text
    assert "vLLM: one decode step through its KV cache; the reference: its KV cache (past_key_values)" in text
    assert "prefill of prompt 0 (the logprobs agree there): every decoder layer's output matches" in text
    assert "after the last layer" not in text
    assert "matches on the prefill of prompt 0 and differs on a decode step" in (result.hint or "")
    assert result.summary() == "first divergent layer 1 (decode step 3 of prompt 0), max |logprob diff| 0.01"
    data = result.to_dict()
    assert data["first_difference"] == {"prompt": 0, "step": 3, "phase": "decode"}
    assert [(c["prompt"], c["step"], c["phase"], c["diverging"]) for c in data["layer_checks"]] == [
        (0, 0, "prefill", False), (0, 3, "decode", True),
    ]  # fmt: skip


def test_layers_matching_on_a_step_where_the_logprobs_agree_conclude_nothing() -> None:
    """Only the prefill was compared (the decode-step capture failed): no "after the last layer"."""
    result = result_with(mismatch(0, 2))
    result.capture_note = "the hooks did not see the decode step"
    localise(result, [check(0, 0, REF3)])
    assert result.first_divergent_layer is None and result.layers == [] and result.layers_on is None
    assert result.hint is None and result.summary() == "first divergent layer not found, max |logprob diff| 0.01"
    text = result.message()
    assert "after the last layer" not in text
    assert (
        "layer outputs were not compared on the decode step 2 of prompt 0, where the logprobs first differ "
        "(the hooks did not see the decode step): no conclusion about the layers"
    ) in text
    assert "prefill of prompt 0 (the logprobs agree there): every decoder layer's output matches" in text


def test_layers_matching_on_the_diverging_step_put_the_difference_after_the_last_layer() -> None:
    result = result_with(mismatch(0, 2))
    localise(result, [check(0, 0, REF3), check(0, 2, REF3, 9)])
    assert result.first_divergent_layer is None and result.layers_on == {"prompt": 0, "step": 2, "phase": "decode"}
    assert result.summary().startswith("every layer matches, the difference is after the last layer")
    text = result.message()
    assert (
        "every decoder layer's output matches within rtol 0.001 on the decode step 2 of prompt 0, where the "
        "logprobs first differ (worst 0): the difference is after the last layer"
    ) in text


def test_a_prefill_difference_in_another_prompt_is_localised_on_that_prompts_prefill() -> None:
    result = result_with(mismatch(1, 0), mismatch(0, 4))
    localise(result, [check(0, 0, REF3), check(1, 0, DECODE_BUG)])
    assert result.layers_on == {"prompt": 1, "step": 0, "phase": "prefill"} and result.first_divergent_layer == 1
    text = result.message()
    assert "prefill of prompt 1: layer 1's output differs first" in text
    assert "prefill of prompt 0 (the logprobs agree there)" in text
    # a prefill divergence gets the shape hints, not the decode-only one
    assert "decode step" not in (result.hint or "") and "load_weights" in (result.hint or "")


def test_a_layer_that_differs_on_an_agreeing_step_is_shown_but_is_not_the_verdict() -> None:
    result = result_with(mismatch(0, 1))
    result.capture_note = "the second capture could not run: time-out"
    localise(result, [check(0, 0, DECODE_BUG)])
    assert result.first_divergent_layer is None
    assert "prefill of prompt 0 (the logprobs agree there): layer 1's output already differs" in result.message()


def test_when_the_runs_agree_the_prefill_comparison_is_the_verdict() -> None:
    result = result_with()
    localise(result, [check(0, 0, REF3)])
    assert result.ok and result.layers_on == {"prompt": 0, "step": 0, "phase": "prefill"}
    assert "every decoder layer's output matches within rtol 0.001 (worst 0)" in result.message()


class TwoLayers(nn.Module):
    """A decoder stand-in: ``model.layers`` of two (hidden, residual)-returning layers."""

    class Layer(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([self.Layer(), self.Layer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden, residual = layer(x)
            x = hidden + residual
        return x


def test_the_decode_capture_records_the_step_after_the_prefill_only() -> None:
    model = TwoLayers()
    capture = HiddenCapture(model, tokens=4, max_values=10_000, decode=True)
    capture.arm()
    model(torch.ones(1, 3))  # a decode step of some earlier request (fewer rows, no prefill seen)
    model(torch.ones(4, 3))  # our prefill: seen, not recorded
    assert capture.records == {} and capture.skipped_forwards == 2
    model(torch.full((1, 3), 2.0))  # the decode step: recorded, then every hook removed
    model(torch.full((1, 3), 5.0))
    out = capture.result()
    assert out["complete"] and out["decode"] is True
    assert out["layers"] == {"0": [[6.0, 6.0, 6.0]], "1": [[18.0, 18.0, 18.0]]}
    assert capture.handles == []


def test_the_prefill_capture_records_the_first_forward_of_enough_tokens() -> None:
    model = TwoLayers()
    capture = HiddenCapture(model, tokens=2, max_values=10_000)
    capture.arm()
    model(torch.ones(1, 3))  # a decode step: skipped
    model(torch.ones(2, 3))
    out = capture.result()
    assert out["complete"] and out["decode"] is False and out["layers"]["0"] == [[3.0, 3.0, 3.0]] * 2


def test_the_references_decode_step_through_its_cache_is_its_full_forwards_last_position() -> None:
    """compat.hf.step_layer_outputs: a transformers Llama through past_key_values, and a model that
    keeps no cache through a full forward, give each layer's output of the token fed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from vllm_doctor.compat.hf import layer_outputs, step_layer_outputs

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    context, token = [5, 9, 13, 40, 7], 21
    cached, path, _ = step_layer_outputs(model, context, token, "cpu")
    full, _ = layer_outputs(model, [*context, token], "cpu")
    assert path == "its KV cache (past_key_values)" and sorted(cached) == ["0", "1"]
    for key in cached:
        assert len(cached[key]) == 1
        assert torch.allclose(torch.tensor(cached[key][0]), torch.tensor(full[key][-1]), atol=1e-5)

    class NoCache(nn.Module):  # a plain reference: forward(input_ids) only
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor) -> object:
            return self.inner(input_ids=input_ids, use_cache=False)

    plain, path, _ = step_layer_outputs(NoCache(model), context, token, "cpu")
    assert path == "a full forward, its last position (it keeps no KV cache)"
    assert all(torch.allclose(torch.tensor(plain[k][0]), torch.tensor(full[k][-1]), atol=1e-6) for k in plain)


# ---- with images: the vision tower and the projector before the decoder layers ---------------

TOWER = {"vision tower": [[1.0, 2.0], [3.0, 4.0]], "projector": [[5.0, 6.0]]}
NAMES = {"vision tower": "vision_tower", "projector": "multi_modal_projector"}


def with_parts(ours: dict) -> LayerCheck:
    layers = check(0, 0, DECODE_BUG)  # layer 1 differs too: downstream of any encoder difference
    layers.encoder = compare_parts(ours, TOWER, NAMES)
    return layers


def test_the_first_divergent_part_is_the_tower_then_the_projector_then_a_decoder_layer() -> None:
    wrong_tower = {"vision tower": [[1.0, 2.0], [3.0, 5.0]], "projector": [[5.0, 7.0]]}
    wrong_projector = {"vision tower": TOWER["vision tower"], "projector": [[5.0, 6.5]]}
    cases = [(wrong_tower, "vision tower"), (wrong_projector, "projector"), (TOWER, "decoder layer 1")]
    for ours, expected in cases:
        result = result_with(mismatch(0, 0))
        localise(result, [with_parts(ours)])
        assert result.first_divergent == expected, result.message()
    tower, projector = compare_parts(wrong_tower, TOWER, NAMES)
    assert (tower.part, tower.name, tower.rows, tower.max_abs) == ("vision tower", "vision_tower", 2, 1.0)
    assert tower.max_rel == 1.0 / 4.0 and projector.part == "projector"


def test_a_tower_that_differs_is_the_verdict_with_its_table_and_fix() -> None:
    result = result_with(mismatch(0, 0))
    localise(result, [with_parts({"vision tower": [[1.0, 2.0], [3.0, 5.0]], "projector": [[5.0, 7.0]]})])
    text = result.message()
    assert "prefill of prompt 0: the vision tower's output differs first (max rel err 0.25 > rtol 0.001; " in text
    assert "vision_tower  <-" in text and "first divergent layer" not in text  # the layers see another input
    assert result.hint is not None and "load_weights" in result.hint
    assert result.summary().startswith("first divergent: the vision tower (prefill of prompt 0)")
    assert result.to_dict()["layer_checks"][0]["first_divergent"] == "vision tower"


class ToyVL(nn.Module):
    """A multimodal-looking model: a tower and a projector outside the language model's layers."""

    supports_multimodal = True

    def __init__(self) -> None:
        super().__init__()
        self.vision_tower = nn.Linear(3, 2)
        self.multi_modal_projector = nn.Linear(2, 3)
        self.language_model = TwoLayers()

    def get_language_model(self) -> nn.Module:
        return self.language_model

    def embed_multimodal(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixel_values))


def test_the_encoder_capture_records_the_towers_input_and_both_parts_outputs() -> None:
    model = ToyVL()
    capture = HiddenCapture(model, tokens=2, max_values=10_000, encoder=True, all_rows=True)
    armed = capture.arm()
    assert armed["encoder"] == NAMES
    assert [t.name for t in capture.layers] == ["language_model.layers.0", "language_model.layers.1"]
    pixels = torch.arange(6.0).reshape(2, 3)
    embeds = model.embed_multimodal(pixels)
    model.language_model(torch.ones(5, 3))  # the prefill, longer than the ids: every row kept
    out = capture.result()
    assert out["complete"] and out["encoder_complete"] and capture.handles == []
    assert out["pixel_values"] == pixels.tolist()
    assert out["encoder"]["projector"] == embeds.tolist() and len(out["layers"]["0"]) == 5
