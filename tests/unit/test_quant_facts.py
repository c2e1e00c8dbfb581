"""VD316 and facts/quant_checkpoint.py on config.json + headers alone (no vLLM): the checkpoint's weight
format against the quantization_config's method. The real examples: tests/unit/test_quant_checks_replies.py (recorded passes)."""

from __future__ import annotations

from vllm_doctor.checks import run_checks
from vllm_doctor.facts.checkpoint import CheckpointFacts, FileHeader, TensorHeader
from vllm_doctor.facts.quant_checkpoint import checkpoint_quant
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Outcome

CT_INT8 = {
    "quant_method": "compressed-tensors",
    "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"type": "int", "num_bits": 8}}},
}


def _facts(config: dict, tensors: dict[str, str]) -> Facts:
    f = Facts(model_dir="/nonexistent", config={"architectures": ["X"], **config})
    headers = [TensorHeader(n, dtype, [8, 8], "model.safetensors", (0, 64)) for n, dtype in tensors.items()]
    f.checkpoint = CheckpointFacts(
        "/nonexistent", "safetensors", [FileHeader("model.safetensors", 64, 8, headers, ok=True)]
    )
    return f


def _vd316(config: dict, tensors: dict[str, str]):
    (finding,) = run_checks(_facts(config, tensors), ["VD316"])
    return finding


def test_int8_weights_under_an_int8_config_pass_and_fp8_ones_fail() -> None:
    int8 = {"model.layers.0.mlp.down_proj.weight": "I8", "model.layers.0.mlp.down_proj.weight_scale": "F32"}
    assert _vd316({"quantization_config": CT_INT8}, int8).outcome is Outcome.PASS
    fp8 = {"model.layers.0.mlp.down_proj.weight": "F8_E4M3", "model.layers.0.mlp.down_proj.weight_scale": "F32"}
    found = _vd316({"quantization_config": CT_INT8}, fp8)
    assert found.outcome is Outcome.FAIL
    assert "says compressed-tensors with int8 weights, but the checkpoint holds 1 float8 weights" in found.message


def test_gptq_names_under_fp8_and_quantized_tensors_without_a_config() -> None:
    gptq = {f"model.layers.0.mlp.down_proj.{leaf}": "I32" for leaf in ("qweight", "qzeros", "g_idx")}
    gptq["model.layers.0.mlp.down_proj.scales"] = "F16"
    found = _vd316({"quantization_config": {"quant_method": "fp8"}}, gptq)
    assert found.outcome is Outcome.FAIL and "GPTQ/AWQ-packed 4-bit weights" in found.message
    int8 = {"model.layers.0.mlp.down_proj.weight": "I8", "model.layers.0.mlp.down_proj.weight_scale": "F32"}
    found = _vd316({}, int8)
    assert found.outcome is Outcome.FAIL and "config.json has no quantization_config" in found.message
    assert _vd316({}, {"model.embed_tokens.weight": "BF16"}).outcome is Outcome.NOT_APPLICABLE
    # a method whose weight format this check does not know: a skip, not a guess
    assert _vd316({"quantization_config": {"quant_method": "bitsandbytes"}}, int8).outcome is Outcome.SKIP


def test_checkpoint_quant_reads_the_ignore_list() -> None:
    ckq = checkpoint_quant({"quantization_config": {**CT_INT8, "ignore": ["lm_head", "re:.*mlp.gate$"]}}, [])
    assert ckq.ignored("lm_head") == "lm_head"
    assert ckq.ignored("model.layers.3.mlp.gate") == "re:.*mlp.gate$"
    assert ckq.ignored("model.layers.3.mlp.down_proj") is None
    assert not ckq.quantized  # a config, but no quantized tensor
