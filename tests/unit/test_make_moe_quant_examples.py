"""examples/make_examples.py --moe --quant: the MoE and quantized families' fixtures themselves.

No engine here (tests/engine/test_moe_quant_ground_truth.py records what vLLM does with them).
"""

from __future__ import annotations

import filecmp
import importlib.metadata
import json
from pathlib import Path

import pytest

from tests.conftest import make_examples

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
MOE = ["moe-ok", *sorted(p.name for p in (EXAMPLES / "moe").iterdir() if (p / "variant.py").is_file())]
QUANT = ["quant-ok", *sorted(p.name for p in (EXAMPLES / "quant").iterdir() if (p / "variant.py").is_file())]
# the finding each MoE variant is built to get (tests/unit/test_moe_checks_replies.py asserts it)
MOE_CODES = {
    "moe-ok": None,
    "moe-missing-expert": "VD311",
    "moe-swapped-w1-w3": "VD312",
    "moe-router-not-loaded": "VD301",
    "moe-experts-not-divisible-by-tp": "VD305",  # an info, at --tensor-parallel-size 2
    # the quantized variants the static checks catch (tests/unit/test_quant_checks_replies.py); the
    # probes and quant-layer-runs-unquantized (an engine-stage check, VD407): none
    "quant-unquantized-down-proj": "VD314",
    "quant-missing-scales": "VD315",
    "quant-method-mismatch": "VD316",
    "quant-gptq-names": "VD317",
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_examples(tmp_path_factory.mktemp("families"), *MOE, *QUANT)


def _weights(built: Path, name: str) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(str(built / name / "model" / "model.safetensors"))


def _config(built: Path, name: str) -> dict:
    return json.loads((built / name / "model" / "config.json").read_text())


@pytest.mark.parametrize("name", MOE + QUANT)
def test_layout_and_entry_point(built: Path, name: str) -> None:
    out = built / name
    meta = json.loads((out / "variant.json").read_text())
    assert meta["name"] == name
    assert meta["expect_code"] == MOE_CODES.get(name)
    if not name.endswith("-ok"):
        family = "moe" if name in MOE else "quant"
        assert (EXAMPLES / family / name / "README.md").read_text().strip()
    for filename in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / "model" / filename).is_file(), filename
    found = [
        (ep.name, ep.value)
        for dist in importlib.metadata.distributions(path=[str(out / "site")])
        for ep in dist.entry_points
        if ep.group == "vllm.general_plugins"
    ]
    entry = "tiny_moe" if name in MOE else "tiny_doctor"
    package = "tiny_moe_model" if name == "moe-ok" else "tiny_doctor_" + name.replace("-", "_")
    assert found == [(entry, f"{package}:register")]


def test_moe_ok_is_the_plugin_unchanged_with_mixtral_tensor_names(built: Path) -> None:
    site_pkg = built / "moe-ok" / "site" / "tiny_moe_model"
    src = EXAMPLES / "tiny_moe_plugin" / "tiny_moe_model"
    for path in sorted(src.glob("*.py")):
        assert filecmp.cmp(path, site_pkg / path.name, shallow=False), path.name
    config = _config(built, "moe-ok")
    assert config["architectures"] == ["TinyMoeForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 2)
    weights = _weights(built, "moe-ok")
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}.block_sparse_moe."
        assert weights[p + "gate.weight"].shape == (4, hidden)
        for e in range(4):
            assert weights[f"{p}experts.{e}.w1.weight"].shape == (inter, hidden)
            assert weights[f"{p}experts.{e}.w3.weight"].shape == (inter, hidden)
            assert weights[f"{p}experts.{e}.w2.weight"].shape == (hidden, inter)


def test_moe_missing_expert_lacks_exactly_its_three_tensors(built: Path) -> None:
    missing = set(_weights(built, "moe-ok")) - set(_weights(built, "moe-missing-expert"))
    p = "model.layers.1.block_sparse_moe.experts.3."
    assert missing == {p + "w1.weight", p + "w2.weight", p + "w3.weight"}


def test_moe_experts_not_divisible_by_tp(built: Path) -> None:
    name = "moe-experts-not-divisible-by-tp"
    meta = json.loads((built / name / "variant.json").read_text())
    assert meta["engine_kwargs"] == {"tensor_parallel_size": 2}
    assert _config(built, name)["num_local_experts"] == 3
    weights = _weights(built, name)
    assert weights["model.layers.0.block_sparse_moe.gate.weight"].shape[0] == 3
    assert not any(".experts.3." in n for n in weights)


def test_quant_ok_checkpoint_is_w8a8_int8_of_the_text_example(built: Path) -> None:
    qc = _config(built, "quant-ok")["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "int-quantized"
    group = qc["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"]["dynamic"] is True
    quant = _weights(built, "quant-ok")
    # the unquantized text example's weights: the int8 ones dequantize to within half a step
    from examples.make_examples import MODEL_DIMS, random_llama_weights

    original = random_llama_weights(MODEL_DIMS)
    for name, weight in original.items():
        if name.split(".")[-2] in PROJECTIONS:
            q, scale = quant[name], quant[name.removesuffix(".weight") + ".weight_scale"]
            assert q.dtype == torch.int8 and scale.dtype == torch.float32
            assert scale.shape == (weight.shape[0], 1)
            assert ((q.float() * scale - weight.float()).abs() <= scale / 2 + 1e-6).all(), name
        else:
            assert torch.equal(quant[name], weight), name  # embedding, norms, lm_head untouched


def test_quant_missing_scales_lacks_exactly_layer_1s_scales(built: Path) -> None:
    missing = set(_weights(built, "quant-ok")) - set(_weights(built, "quant-missing-scales"))
    assert missing == {
        f"model.layers.1.{'self_attn' if p in ('q_proj', 'k_proj', 'v_proj', 'o_proj') else 'mlp'}.{p}.weight_scale"
        for p in PROJECTIONS
    }


def test_quant_unquantized_down_proj_drops_only_that_quant_config(built: Path) -> None:
    ok = (built / "quant-ok" / "site" / "tiny_doctor_quant_ok" / "model.py").read_text()
    broken = (
        built / "quant-unquantized-down-proj" / "site" / "tiny_doctor_quant_unquantized_down_proj" / "model.py"
    ).read_text()
    assert ok.count("quant_config=") - broken.count("quant_config=") == 1
    assert _weights(built, "quant-ok").keys() == _weights(built, "quant-unquantized-down-proj").keys()
