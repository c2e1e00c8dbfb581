"""``profile --twin``'s pure parts: finding the in-tree twin from a checkpoint's names and shapes
and config.json's sizes, the twin's config and model directory, the A/B arithmetic (ratios, the
largest gap, the kinds that cannot be separated) and its text and HTML. Plain data, no vLLM."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.weights import write_raw_safetensors
from vllm_doctor.analysis.records import TwinAB, TwinKind, TwinKindPhase, TwinPhase, read_report
from vllm_doctor.analysis.twin import NoTwin, TwinMatch, find_twin, twin_config
from vllm_doctor.analysis.twin_compare import compare_runs, fmt_ratio, largest_gap, roofline_text
from vllm_doctor.errors import DoctorInputError
from vllm_doctor.facts import wire
from vllm_doctor.report.html import render_html, twin_section
from vllm_doctor.report.profile import render_twin

DIMS = {"hidden": 128, "inter": 256, "layers": 2, "heads": 4, "kv": 2, "head_dim": 32, "vocab": 512}
CONFIG: dict[str, Any] = {
    "architectures": ["MyPortForCausalLM"],
    "model_type": "my_port",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def llama_tensors(bias: bool = False, qk_norm: bool = False, lm_head: bool = True) -> dict[str, list[int]]:
    """An HF Llama checkpoint's names and shapes at DIMS (Qwen2's q/k/v biases, Qwen3's q/k norms)."""
    h, i, q, kv, d, v = DIMS["hidden"], DIMS["inter"], DIMS["heads"] * DIMS["head_dim"], DIMS["kv"] * DIMS["head_dim"], DIMS["head_dim"], DIMS["vocab"]
    out = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    if lm_head:
        out["lm_head.weight"] = [v, h]
    for n in range(DIMS["layers"]):
        p = f"model.layers.{n}."
        out |= {
            p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
            p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h], p + "mlp.down_proj.weight": [h, i],
            p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
        }
        if bias:
            out |= {p + "self_attn.q_proj.bias": [q], p + "self_attn.k_proj.bias": [kv], p + "self_attn.v_proj.bias": [kv]}
        if qk_norm:
            out |= {p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d]}
    return out


# ---- matching -------------------------------------------------------------------------------------


def test_an_hf_llama_layout_under_its_own_model_type_is_llama_with_the_same_weights() -> None:
    got = find_twin(llama_tensors(), CONFIG)
    assert isinstance(got, TwinMatch)
    assert (got.architecture, got.model_type, got.how, got.weights) == ("LlamaForCausalLM", "llama", "auto", "same")
    assert got.notes == []


def test_qkv_biases_make_it_qwen2_and_qk_norms_qwen3() -> None:
    qwen2 = find_twin(llama_tensors(bias=True), CONFIG)
    assert isinstance(qwen2, TwinMatch) and (qwen2.architecture, qwen2.weights) == ("Qwen2ForCausalLM", "same")
    qwen3 = find_twin(llama_tensors(qk_norm=True), CONFIG)
    assert isinstance(qwen3, TwinMatch) and (qwen3.architecture, qwen3.weights) == ("Qwen3ForCausalLM", "same")


def test_own_module_names_and_fused_projections_match_by_shape_with_dummy_weights() -> None:
    renamed: dict[str, list[int]] = {}
    for name, shape in llama_tensors().items():
        name = name.replace("model.layers.", "transformer.blocks.").replace("self_attn.", "attn.")
        if name.endswith("q_proj.weight"):  # q, k and v stored as one fused tensor
            renamed[name.replace("q_proj", "wqkv")] = [shape[0] + 2 * DIMS["kv"] * DIMS["head_dim"], shape[1]]
        elif not name.endswith(("k_proj.weight", "v_proj.weight")):
            renamed[name.replace("gate_proj", "w1").replace("up_proj", "w3").replace("down_proj", "w2")] = shape
    got = find_twin(renamed, CONFIG)
    assert isinstance(got, TwinMatch)
    assert (got.architecture, got.weights) == ("LlamaForCausalLM", "dummy")
    assert "load_format=dummy" in got.notes[0]


def _vision_tensors() -> dict[str, list[int]]:
    """A tower with more layered tensors than the decoder (CLIP-L's 24 layers against a 2-layer
    decoder here; 384 against 288 at LLaVA-1.5-7B's shape): the decoder is not the largest group."""
    out = {"vision_tower.embeddings.patch_embedding.weight": [64, 3, 8, 8], "multi_modal_projector.linear_1.weight": [128, 64]}
    for n in range(24):
        out |= {f"vision_tower.encoder.layers.{n}.self_attn.{p}_proj.weight": [64, 64] for p in "qkv"}
    return out


@pytest.mark.parametrize(
    ("layout", "prefix"),
    [
        # transformers < 4.52: a causal LM under language_model.
        ({f"language_model.{n}": s for n, s in llama_tensors().items()}, "language_model."),
        # transformers >= 4.52: the decoder under model.language_model., the LM head at the root
        ({(n if n == "lm_head.weight" else "model.language_model." + n.removeprefix("model.")): s
          for n, s in llama_tensors().items()}, "model.language_model."),
    ],
)  # fmt: skip
def test_a_multimodal_checkpoints_twin_is_its_decoders(layout: dict[str, list[int]], prefix: str) -> None:
    """The tiny vision-language port's layouts: the language model's tensors under a text model's
    names match LlamaForCausalLM; the tower and the projector are nobody's. Random weights on
    both runs (the port's names are not the twin's) and a note that says what is compared."""
    got = find_twin(layout | _vision_tensors(), CONFIG | {"vision_hidden_size": 64, "image_token_index": 3})
    assert isinstance(got, TwinMatch) and got.architecture == "LlamaForCausalLM"
    assert got.decoder_prefix == prefix and got.weights == "dummy"
    assert any("the twin is its language model's" in n and "text prompts (no images)" in n for n in got.notes)
    # a text checkpoint is its own decoder
    text = find_twin(llama_tensors(), CONFIG)
    assert isinstance(text, TwinMatch) and text.decoder_prefix is None and text.weights == "same"


def test_config_aliases_are_read_as_the_usual_sizes() -> None:
    aliased = {k: v for k, v in CONFIG.items() if k not in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}
    aliased |= {"n_embd": 128, "n_layer": 2, "n_head": 4, "ffn_dim": 256}
    got = find_twin(llama_tensors(), aliased)
    assert isinstance(got, TwinMatch) and got.architecture == "LlamaForCausalLM"
    assert got.sizes.sources["hidden_size"] == "n_embd"
    config = twin_config(got, aliased)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"], config["intermediate_size"]) == (128, 2, 4, 256)


def test_experts_in_a_dense_config_have_no_twin_and_say_why_in_one_line() -> None:
    tensors = llama_tensors()
    for n in range(DIMS["layers"]):
        for name in ("gate_proj", "up_proj", "down_proj"):
            del tensors[f"model.layers.{n}.mlp.{name}.weight"]
        for e in range(4):
            tensors[f"model.layers.{n}.mlp.experts.{e}.w1.weight"] = [256, 128]
    got = find_twin(tensors, CONFIG)
    assert isinstance(got, NoTwin) and not got.bad_input
    assert "\n" not in got.reason
    assert got.reason.startswith(
        "no in-tree twin: the tensor layout matches none of LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
        "Qwen3MoeForCausalLM"
    ), got.reason
    assert "model.layers.0.mlp.experts.* has no counterpart" in got.reason


def test_a_qwen3_moe_checkpoint_with_its_config_is_qwen3_moe() -> None:
    tensors = llama_tensors(qk_norm=True)
    config = CONFIG | {"num_experts": 4, "moe_intermediate_size": 64, "num_experts_per_tok": 2}
    for n in range(DIMS["layers"]):
        for name in ("gate_proj", "up_proj", "down_proj"):
            del tensors[f"model.layers.{n}.mlp.{name}.weight"]
        tensors[f"model.layers.{n}.mlp.gate.weight"] = [4, 128]
        for e in range(4):
            p = f"model.layers.{n}.mlp.experts.{e}."
            tensors |= {p + "gate_proj.weight": [64, 128], p + "up_proj.weight": [64, 128], p + "down_proj.weight": [128, 64]}
    got = find_twin(tensors, config)
    assert isinstance(got, TwinMatch) and (got.architecture, got.weights) == ("Qwen3MoeForCausalLM", "same")
    twin = twin_config(got, config)
    assert (twin["model_type"], twin["num_experts"], twin["moe_intermediate_size"], twin["num_experts_per_tok"]) == ("qwen3_moe", 4, 64, 2)


def _mixtral_tensors() -> dict[str, list[int]]:
    """Mixtral's Hugging Face layout (the tiny MoE example's): block_sparse_moe.gate and each
    expert's w1/w3 (gate/up, intermediate_size rows) and w2 (down)."""
    tensors = llama_tensors()
    for n in range(DIMS["layers"]):
        for name in ("gate_proj", "up_proj", "down_proj"):
            del tensors[f"model.layers.{n}.mlp.{name}.weight"]
        tensors[f"model.layers.{n}.block_sparse_moe.gate.weight"] = [4, 128]
        for e in range(4):
            p = f"model.layers.{n}.block_sparse_moe.experts.{e}."
            tensors |= {p + "w1.weight": [256, 128], p + "w3.weight": [256, 128], p + "w2.weight": [128, 256]}
    return tensors


def test_a_mixtral_checkpoint_is_mixtral_with_its_expert_keys() -> None:
    config = CONFIG | {"num_local_experts": 4, "num_experts_per_tok": 2, "model_type": "tiny_doctor_moe"}
    got = find_twin(_mixtral_tensors(), config)
    assert isinstance(got, TwinMatch) and (got.architecture, got.weights) == ("MixtralForCausalLM", "same"), got
    twin = twin_config(got, config)
    assert (twin["model_type"], twin["num_local_experts"], twin["intermediate_size"], twin["num_experts_per_tok"]) == (
        "mixtral", 4, 256, 2)
    assert "num_experts" not in twin and "moe_intermediate_size" not in twin
    # the same layout under a port's own module names: the structure still fits, on dummy weights
    renamed = {k.replace("block_sparse_moe", "moe").replace(".w1.", ".fc_gate."): v for k, v in _mixtral_tensors().items()}
    got = find_twin(renamed, config)
    assert isinstance(got, TwinMatch) and (got.architecture, got.weights) == ("MixtralForCausalLM", "dummy"), got
    # a dense config: no expert count, no Mixtral
    assert isinstance(find_twin(_mixtral_tensors(), CONFIG), NoTwin)


def test_a_qwen2_moe_checkpoint_with_a_shared_expert_is_qwen2_moe() -> None:
    config = CONFIG | {"num_experts": 4, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96,
                       "num_experts_per_tok": 2, "model_type": "my_qwen_moe"}
    tensors = llama_tensors(bias=True)
    for n in range(DIMS["layers"]):
        for name in ("gate_proj", "up_proj", "down_proj"):
            del tensors[f"model.layers.{n}.mlp.{name}.weight"]
        tensors[f"model.layers.{n}.mlp.gate.weight"] = [4, 128]
        for e in range(4):
            p = f"model.layers.{n}.mlp.experts.{e}."
            tensors |= {p + "gate_proj.weight": [64, 128], p + "up_proj.weight": [64, 128], p + "down_proj.weight": [128, 64]}
        p = f"model.layers.{n}.mlp.shared_expert."
        tensors |= {p + "gate_proj.weight": [96, 128], p + "up_proj.weight": [96, 128], p + "down_proj.weight": [128, 96]}
        tensors[f"model.layers.{n}.mlp.shared_expert_gate.weight"] = [1, 128]
    got = find_twin(tensors, config)
    assert isinstance(got, TwinMatch) and (got.architecture, got.weights) == ("Qwen2MoeForCausalLM", "same"), got
    twin = twin_config(got, config)
    assert (twin["model_type"], twin["num_experts"], twin["moe_intermediate_size"],
            twin["shared_expert_intermediate_size"], twin["num_experts_per_tok"]) == ("qwen2_moe", 4, 64, 96, 2)
    # without the shared expert's size in config.json there is no Qwen2-MoE twin
    no_shared = {k: v for k, v in config.items() if k != "shared_expert_intermediate_size"}
    assert isinstance(find_twin(tensors, no_shared), NoTwin)


def test_a_forced_architecture_still_checks_the_shapes_and_says_what_disagrees() -> None:
    wrong_heads = CONFIG | {"num_attention_heads": 8}  # q_proj would need 8 x 32 = 256 rows, it has 128
    got = find_twin(llama_tensors(), wrong_heads, forced="LlamaForCausalLM")
    assert isinstance(got, NoTwin) and got.bad_input
    assert got.reason == (
        "--twin LlamaForCausalLM does not fit this checkpoint: model.layers.0.self_attn.q_proj.weight is [128, 128]; "
        "LlamaForCausalLM needs [num_attention_heads x head_dim = 256, hidden_size = 128]"
    )
    moe = find_twin(llama_tensors(), CONFIG, forced="Qwen3MoeForCausalLM")
    assert isinstance(moe, NoTwin) and moe.bad_input and "\n" not in moe.reason
    assert moe.reason.startswith("--twin Qwen3MoeForCausalLM does not fit this checkpoint: Qwen3MoeForCausalLM needs "
                                 "num_experts and moe_intermediate_size in config.json, which has none"), moe.reason


def test_a_forced_architecture_the_doctor_has_no_layout_for_is_bad_input() -> None:
    got = find_twin(llama_tensors(), CONFIG, forced="GPT2LMHeadModel")
    assert isinstance(got, NoTwin) and got.bad_input
    assert got.reason.startswith("--twin GPT2LMHeadModel: the doctor has no checkpoint layout for it (it knows LlamaForCausalLM")


def test_mistral_shares_llamas_layout_and_is_chosen_only_when_forced() -> None:
    auto = find_twin(llama_tensors(), CONFIG)
    forced = find_twin(llama_tensors(), CONFIG | {"sliding_window": 4096}, forced="MistralForCausalLM")
    assert isinstance(auto, TwinMatch) and auto.architecture == "LlamaForCausalLM"
    assert isinstance(forced, TwinMatch) and forced.how == "forced"
    assert twin_config(forced, CONFIG | {"sliding_window": 4096})["sliding_window"] == 4096


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"num_hidden_layers": 3}, "LlamaForCausalLM needs model.layers.2.self_attn.q_proj.weight (q projection); the checkpoint has none"),
        ({"hidden_act": "gelu"}, "config.json's hidden_act is 'gelu'; LlamaForCausalLM supports 'silu'"),
    ],
)
def test_sizes_and_settings_the_twin_cannot_take_are_named(change: dict[str, Any], reason: str) -> None:
    got = find_twin(llama_tensors(), CONFIG | change, forced="LlamaForCausalLM")
    assert isinstance(got, NoTwin) and reason in got.reason, got


def test_no_tensors_and_missing_sizes_are_one_line_reasons() -> None:
    empty = find_twin({}, CONFIG)
    assert isinstance(empty, NoTwin) and "no readable safetensors tensors" in empty.reason
    sizeless = find_twin(llama_tensors(), {"architectures": ["X"]})
    assert isinstance(sizeless, NoTwin) and sizeless.reason.startswith("no in-tree twin: config.json gives no hidden_size")


def test_rotary_caches_are_nobodys_weights() -> None:
    tensors = llama_tensors() | {"model.layers.0.self_attn.rotary_emb.inv_freq": [16]}
    got = find_twin(tensors, CONFIG)
    assert isinstance(got, TwinMatch) and got.weights == "same"


def test_the_twin_config_takes_the_ports_sizes_rotary_ids_and_dtype_under_the_twins_names() -> None:
    tied = CONFIG | {"tie_word_embeddings": True, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    got = find_twin(llama_tensors(lm_head=False), tied)
    assert isinstance(got, TwinMatch)
    config = twin_config(got, tied)
    assert config == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512,
        "tie_word_embeddings": True, "intermediate_size": 256, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
        "rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "bos_token_id": 1,
        "eos_token_id": 2, "dtype": "bfloat16", "attention_bias": False, "mlp_bias": False,
    }


# ---- the twin's model directory ------------------------------------------------------------------


def _model_dir(root: Path) -> Path:
    d = root / "port"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    write_raw_safetensors(d / "model.safetensors", {n: ("BF16", s) for n, s in llama_tensors().items()})
    (d / "tokenizer.json").write_text('{"model": {}}')
    (d / "tokenizer_config.json").write_text("{}")
    secret = root / "secret.txt"
    secret.write_text("not the doctor's to read")
    os.symlink(secret, d / "special_tokens_map.json")  # leads outside the model directory: never opened
    return d


def test_the_twin_dir_holds_the_twins_config_the_tokenizer_and_links_to_the_same_weights(tmp_path: Path) -> None:
    from vllm_doctor.stages.twin import build_twin_dir, plan_twin

    port = _model_dir(tmp_path)
    plan = plan_twin(str(port), "auto")
    assert plan.match is not None and plan.match.weights == "same"
    made = tmp_path / "twin"
    out = Path(build_twin_dir(plan, make_dir=lambda _prefix: (made.mkdir(), str(made))[1]))
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (out / "model.safetensors").is_symlink() and os.readlink(out / "model.safetensors") == str((port / "model.safetensors").resolve())
    assert (out / "tokenizer.json").read_text() == '{"model": {}}' and not (out / "tokenizer.json").is_symlink()


class _Started(Exception):
    pass


def test_the_twins_links_to_the_ports_checkpoint_do_not_stop_its_engine_and_no_other_link_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin directory's checkpoint is the doctor's own links to the port's (vetted) files: the
    engine guard lets them through for that directory only (a checkpoint linking out of a model
    directory stops the engine, VD306; profile --twin's second run was stopped by it)."""
    from vllm_doctor.stages import engine
    from vllm_doctor.stages.twin import build_twin_dir, plan_twin

    def started(*_args: Any, **_kwargs: Any) -> Any:
        raise _Started

    monkeypatch.setattr(engine, "run_engine_stage", started)
    port = _model_dir(tmp_path)
    made = tmp_path / "twin"
    twin = build_twin_dir(plan_twin(str(port), "auto"), make_dir=lambda _prefix: (made.mkdir(), str(made))[1])
    with pytest.raises(_Started):
        engine.diagnose_engine(twin, links_into=str(port))
    blocked = engine.diagnose_engine(twin)  # any other caller: a checkpoint linking out stops the engine
    assert "a checkpoint file links outside the model directory (VD306)" in blocked.facts["engine_failure"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert "VD306" in engine.diagnose_engine(twin, links_into=str(elsewhere)).facts["engine_failure"]


def test_a_forced_architecture_that_does_not_fit_is_an_input_error_before_any_engine(tmp_path: Path) -> None:
    from vllm_doctor.stages.twin import plan_twin

    port = _model_dir(tmp_path)
    with pytest.raises(DoctorInputError, match=r"^--twin Qwen2ForCausalLM does not fit this checkpoint: Qwen2ForCausalLM needs "
                                               r"model\.layers\.0\.self_attn\.q_proj\.bias"):
        plan_twin(str(port), "Qwen2ForCausalLM")


def test_the_cli_exits_2_with_the_one_line_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_doctor.cli import main
    from vllm_doctor.stages import engine

    def no_engine(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("an engine was started for a --twin that cannot fit")

    monkeypatch.setattr(engine, "run_engine_stage", no_engine)
    port = _model_dir(tmp_path)
    assert main(["profile", str(port), "--out", str(tmp_path / "out"), "--twin", "Qwen3MoeForCausalLM", "-q"]) == 2
    err = capsys.readouterr().err
    assert "--twin Qwen3MoeForCausalLM does not fit this checkpoint" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "report.json").exists()


# ---- the A/B ---------------------------------------------------------------------------------------


def _modules(kinds: dict[str, tuple[float, float]], layer_kind: bool = True) -> list[dict[str, Any]]:
    """Per-layer table rows: kind -> (prefill s, decode s) summed over the timed steps (2 + 4)."""
    out = [{"name": k, "kind": k, "layer": None, "prefill_calls": 2, "prefill_s": p, "decode_calls": 4, "decode_s": d}
           for k, (p, d) in kinds.items()]
    if layer_kind:
        out.append({"name": "model.layers.0", "kind": "layer", "layer": 0, "prefill_calls": 2, "prefill_s": 0.0,
                    "decode_calls": 4, "decode_s": 0.0})
    return out


def _engine(step: dict[str, float], kinds: dict[str, tuple[float, float]], forward: dict[str, float],
            share: float | None = None) -> dict[str, Any]:
    steps = [{"phase": "prefill", "layers_timed": True, "forward_s": forward["prefill"], "step_s": step["prefill"]}] * 2
    steps += [{"phase": "decode", "layers_timed": True, "forward_s": forward["decode"], "step_s": step["decode"]}] * 4
    steps += [{"phase": "decode", "layers_timed": False, "forward_s": None, "step_s": step["decode"]}] * 6
    phases = {
        "prefill": {"steps": 2, "tokens": 64, "step_s_mean": step["prefill"], "forward_s_mean": forward["prefill"],
                    "tokens_per_s": 32 / step["prefill"]},
        "decode": {"steps": 10, "tokens": 40, "step_s_mean": step["decode"], "forward_s_mean": forward["decode"],
                   "tokens_per_s": 4 / step["decode"]},
    }
    roof = {"available": True, "device": {"bandwidth_bytes_s": 4.81e12 if share is not None else None},
            "phases": {"decode": {"bytes_per_s": 1e12, "bandwidth_share": share, "above_peak": False}}}
    return {"clock": "cuda_events", "steps": steps, "phases": phases, "layers": {"modules": _modules(kinds)}, "roofline": roof}


EAGER_KINDS = {"embedding": (0.002, 0.004), "attention": (0.02, 0.04), "mlp": (0.02, 0.08), "norm": (0.004, 0.008), "logits": (0.002, 0.004)}
COMPILED_KINDS = {"embedding": (0.004, 0.004), "attention": (0.004, 0.008), "dense": (0.01, 0.02), "logits": (0.002, 0.004)}


def _side(engine: dict[str, Any], tok_s: float, compiled: bool) -> dict[str, Any]:
    state = {"compilation_mode": "VLLM_COMPILE" if compiled else "NONE", "compiled_modules": ["model"] if compiled else [],
             "cudagraphs": compiled}
    return {"engine": engine, "workload": {"prompts": 4, "input_len": 16, "output_len": 10, "output_tokens_per_s": tok_s}, "compile": state}


def test_both_uncompiled_compare_every_module_kind_and_name_the_largest_gap() -> None:
    # per timed step: port decode MLP 0.08 / 4 = 20 ms, the twin's 0.02 / 4 = 5 ms: 4x, x 10 decode steps = 150 ms
    port = _engine({"prefill": 0.03, "decode": 0.04}, EAGER_KINDS, {"prefill": 0.025, "decode": 0.035}, share=0.23)
    twin_kinds = dict(EAGER_KINDS, mlp=(0.02, 0.02))
    twin = _engine({"prefill": 0.03, "decode": 0.025}, twin_kinds, {"prefill": 0.025, "decode": 0.02}, share=0.41)
    ab = wire.write(compare_runs(_side(port, 100.0, False), _side(twin, 160.0, False), "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []}))
    assert ab["compiled"] == {"port": False, "twin": False}
    assert ab["throughput_ratio"] == pytest.approx(1.6)
    assert ab["phases"]["decode"]["step_ratio"] == pytest.approx(0.04 / 0.025)
    assert ab["phases"]["decode"]["throughput_ratio"] == pytest.approx(0.04 / 0.025)
    assert list(ab["kinds"]) == ["embedding", "attention", "mlp", "norms", "other", "logits"]
    mlp = ab["kinds"]["mlp"]["phases"]["decode"]
    assert (mlp["port_s"], mlp["twin_s"], mlp["ratio"]) == pytest.approx((0.02, 0.005, 4.0))
    # other: the timed steps' forward minus the kinds inside it (decode: 35 ms - 33 ms = 2 ms for the port)
    assert ab["kinds"]["other"]["phases"]["decode"]["port_s"] == pytest.approx(0.035 - (0.004 + 0.04 + 0.08 + 0.008) / 4)
    assert ab["not_separable"] == ["rotary: timed inside the attention on both sides (the profiler has no rotary span)"]
    gap = ab["largest_gap"]
    assert (gap["phase"], gap["kind"], gap["ratio"], gap["excess_s"]) == ("decode", "mlp", pytest.approx(4.0), pytest.approx(0.15))
    assert gap["text"] == ("decode MLP 4.00x slower than vLLM's LlamaForCausalLM (20.00 ms vs 5.00 ms per step; about "
                           "150.00 ms over the workload's 10 decode step(s))")
    assert roofline_text("decode", wire.read(TwinPhase, ab["phases"]["decode"])) == "port: decode 23 % of 4.81 TB/s; twin: 41 %"
    for value in _numbers(ab):
        assert math.isfinite(value)


def test_an_uncompiled_port_against_a_compiled_twin_compares_the_decoder_and_the_logits_only() -> None:
    port = _engine({"prefill": 0.03, "decode": 0.04}, EAGER_KINDS, {"prefill": 0.025, "decode": 0.035})
    twin = _engine({"prefill": 0.01, "decode": 0.01}, COMPILED_KINDS, {"prefill": 0.009, "decode": 0.008})
    ab = wire.write(compare_runs(_side(port, 100.0, False), _side(twin, 400.0, True), "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []}))
    assert ab["compiled"] == {"port": False, "twin": True}
    assert ab["cuda_graphs"] == {"port": False, "twin": True}
    assert list(ab["kinds"]) == ["decoder", "logits"]
    # the decoder is the timed steps' forward on both sides
    assert ab["kinds"]["decoder"]["phases"]["decode"]["port_s"] == pytest.approx(0.035)
    assert ab["kinds"]["decoder"]["phases"]["decode"]["twin_s"] == pytest.approx(0.008)
    (why,) = ab["not_separable"]
    assert why.startswith("attention, mlp, norms, rotary, embedding: the port is timed per module (run eagerly), the twin at "
                          "its attention calls (torch.compile or CUDA graphs)")
    assert ab["largest_gap"]["kind"] == "decoder" and ab["largest_gap"]["phase"] == "decode"
    assert roofline_text("decode", wire.read(TwinPhase, ab["phases"]["decode"])) == "port: decode 1 TB/s; twin: 1 TB/s (peak unknown)"


def test_an_eager_sides_kinds_never_add_up_past_its_forward() -> None:
    """Eager mode times the modules inside a layer on detailed steps, each behind two of the
    doctor's marks: their spans can sum past the forward they ran in (seen on the CPU: decoder stack
    4.86 ms beside a forward of 2.71 ms, 9.72x against a forward 5.43x). The forward is the whole:
    the kinds are scaled to it and the A/B says so; the decoder's ratio is the forward's."""
    port = _engine({"prefill": 0.03, "decode": 0.04}, EAGER_KINDS, {"prefill": 0.025, "decode": 0.02})
    twin = _engine({"prefill": 0.01, "decode": 0.01}, COMPILED_KINDS, {"prefill": 0.009, "decode": 0.008})
    ab = wire.write(compare_runs(_side(port, 100.0, False), _side(twin, 400.0, True), "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []}))
    decoder = ab["kinds"]["decoder"]["phases"]["decode"]
    assert decoder["port_s"] == pytest.approx(0.02)  # not the kinds' 33 ms
    assert decoder["ratio"] == pytest.approx(ab["phases"]["decode"]["forward_ratio"])
    inside = (0.004 + 0.04 + 0.08 + 0.008) / 4
    assert ab["kinds_scaled"] == [
        f"port decode: its modules' spans summed to {inside / 0.02:.2f}x its forward on the same steps (the doctor's "
        "marks around each module, run eagerly); its kinds are scaled to that forward, the whole they are part of"
    ]
    # eager on both sides: the parts keep their shares and add up to the forward
    eager_twin = _engine({"prefill": 0.03, "decode": 0.025}, EAGER_KINDS, {"prefill": 0.025, "decode": 0.035})
    both = wire.write(compare_runs(_side(port, 100.0, False), _side(eager_twin, 160.0, False), "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []}))
    parts = sum(both["kinds"][k]["phases"]["decode"]["port_s"] for k in ("embedding", "attention", "mlp", "norms"))
    assert parts == pytest.approx(0.02)
    assert both["kinds"]["mlp"]["phases"]["decode"]["port_s"] == pytest.approx(0.02 / 4 * 0.08 / 0.033 * 1)
    assert [line.split(":")[0] for line in both["kinds_scaled"]] == ["port decode"]
    assert "  scaled        port decode: its modules' spans summed to" in render_twin(wire.read(TwinAB, ab))


def test_both_compiled_compare_attention_ops_and_the_dense_spans() -> None:
    port = _engine({"prefill": 0.01, "decode": 0.01}, COMPILED_KINDS, {"prefill": 0.009, "decode": 0.009})
    ab = wire.write(compare_runs(_side(port, 400.0, True), _side(port, 400.0, True), "Qwen2ForCausalLM", {"how": "forced", "weights": "dummy", "notes": []}))
    assert list(ab["kinds"]) == ["embedding", "attention", "dense", "other", "logits"]
    assert all(k["ratio"] == pytest.approx(1.0) for k in ab["kinds"].values() if k["twin_s"] > 0)
    assert ab["not_separable"][0].startswith("mlp, norms: inside the span between two attention ops")
    assert ab["largest_gap"]["text"] == ("no gap: the port is as fast as vLLM's Qwen2ForCausalLM or faster in every phase "
                                         "and kind compared")


def test_without_per_layer_timing_the_phases_still_compare_and_the_gap_is_a_step() -> None:
    port = _engine({"prefill": 0.03, "decode": 0.04}, {}, {"prefill": 0.025, "decode": 0.035})
    port["layers"]["modules"] = []
    twin = _engine({"prefill": 0.03, "decode": 0.02}, {}, {"prefill": 0.025, "decode": 0.015})
    twin["layers"]["modules"] = []
    ab = wire.write(compare_runs(_side(port, 100.0, False), _side(twin, 200.0, True), "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []}))
    assert ab["kinds"] == {}
    assert ab["not_separable"] == ["every kind: no per-layer timing on the port and the twin (per-layer timing off)"]
    assert (ab["largest_gap"]["phase"], ab["largest_gap"]["kind"]) == ("decode", None)
    assert ab["largest_gap"]["text"].startswith("decode step 2.00x slower than vLLM's LlamaForCausalLM")


def test_largest_gap_weighs_the_time_lost_not_the_ratio_alone() -> None:
    kinds = {
        "embedding": TwinKind(phases={"decode": TwinKindPhase(port_s=0.0004, twin_s=0.0001, ratio=4.0)}),  # 4x, 0.3 ms a step
        "mlp": TwinKind(phases={"decode": TwinKindPhase(port_s=0.02, twin_s=0.01, ratio=2.0)}),  # 2x, 10 ms a step
    }
    gap = largest_gap({"decode": TwinPhase(port_steps=10)}, kinds, "LlamaForCausalLM")
    assert (gap.kind, gap.ratio) == ("mlp", 2.0)


def test_ratios_are_none_not_infinite_where_a_side_has_no_time() -> None:
    port = _engine({"prefill": 0.03, "decode": 0.04}, EAGER_KINDS, {"prefill": 0.025, "decode": 0.035})
    twin = _engine({"prefill": 0.03, "decode": 0.04}, dict(EAGER_KINDS, embedding=(0.0, 0.0)), {"prefill": 0.025, "decode": 0.035})
    ab = wire.write(compare_runs(_side(port, 0.0, False), _side(twin, 100.0, False), "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []}))
    assert ab["throughput_ratio"] is None
    assert ab["kinds"]["embedding"]["phases"]["decode"]["ratio"] is None
    assert fmt_ratio(None) == "n/a" and fmt_ratio(2.4) == "2.40x" and fmt_ratio(76.4) == "76x"


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


# ---- text and HTML ---------------------------------------------------------------------------------


def _ab() -> TwinAB:
    port = _engine({"prefill": 0.03, "decode": 0.04}, EAGER_KINDS, {"prefill": 0.025, "decode": 0.035}, share=0.23)
    twin = _engine({"prefill": 0.01, "decode": 0.01}, COMPILED_KINDS, {"prefill": 0.009, "decode": 0.008}, share=0.41)
    return compare_runs(_side(port, 100.0, False), _side(twin, 400.0, True), "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []})


def test_the_text_section_names_both_runs_the_ratios_and_the_largest_gap() -> None:
    text = render_twin(TwinAB.of(_ab()))
    lines = text.splitlines()
    assert lines[0] == ("twin A/B: the port against vLLM's LlamaForCausalLM (found from the checkpoint's layout; the same "
                        "weights), same workload, same mode; times on the device clock (CUDA events)")
    assert "  execution     port uncompiled, twin compiled (torch.compile, CUDA graphs)" in lines
    assert "  throughput    port 100 tok/s, twin 400 tok/s (output tokens over the whole workload): twin/port = 4.00x" in lines
    assert any(line.startswith("  decode        step 40.00 ms vs 10.00 ms = 4.00x") for line in lines)
    assert "  roofline      port: decode 23 % of 4.81 TB/s; twin: 41 %" in lines
    assert lines[-1].startswith("  largest gap   decode decoder stack 4.38x slower than vLLM's LlamaForCausalLM")


def test_no_twin_is_one_line_in_text_and_html() -> None:
    reason = "no in-tree twin: the tensor layout matches none of LlamaForCausalLM (x: y)"
    assert render_twin(TwinAB(none=reason)) == f"twin A/B: {reason}"
    assert reason in twin_section(TwinAB(none=reason))


def test_the_html_section_draws_side_by_side_bars_offline() -> None:
    html = render_html(read_report({"target": "/m", "findings": [], "profiles": {"engine": {}, "twin": _ab()}}))
    section = html[html.index('<h2 id="twin">'):]
    assert section.count('fill="#e15759"') == section.count('fill="#4e79a7"') >= 4  # a port bar beside each twin bar
    assert "decode decoder stack 4.38x slower than vLLM&#x27;s LlamaForCausalLM" in section
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_cuda_graphs_of_an_uncompiled_port_do_not_count_as_compiled() -> None:
    # on a GPU vLLM captures FULL CUDA graphs of a model without @support_torch_compile
    port = _side(_engine({"prefill": 0.01, "decode": 0.01}, COMPILED_KINDS, {"prefill": 0.009, "decode": 0.009}), 400.0, False)
    port["compile"]["cudagraphs"] = True
    twin = _side(_engine({"prefill": 0.01, "decode": 0.01}, COMPILED_KINDS, {"prefill": 0.009, "decode": 0.009}), 400.0, True)
    ab = wire.write(compare_runs(port, twin, "LlamaForCausalLM", {"how": "auto", "weights": "same", "notes": []}))
    assert (ab["compiled"], ab["cuda_graphs"]) == ({"port": False, "twin": True}, {"port": True, "twin": True})
    assert "  execution     port uncompiled (in CUDA graphs), twin compiled (torch.compile, CUDA graphs)" in render_twin(TwinAB.of(ab)).splitlines()
