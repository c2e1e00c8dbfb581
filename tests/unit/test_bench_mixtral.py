"""bench/make_bench_model.py --mixtral: the tiny MoE example at Mixtral-8x7B's shape (the lead serves it on an
H200 with load_format=dummy; nothing here starts vLLM)."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(REPO / "bench"))
    import make_bench_model  # type: ignore[import-not-found]

    out = tmp_path_factory.mktemp("bench-mixtral")
    make_bench_model.write_mixtral(out)
    return out


def test_config_is_mixtral_8x7b_for_the_plugin_class(mixtral: Path) -> None:
    config = json.loads((mixtral / "model" / "config.json").read_text())
    assert config["architectures"] == ["TinyMoeForCausalLM"] and config["model_type"] == "tiny_doctor_moe"
    assert {k: config[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_local_experts",
                                   "num_experts_per_tok", "num_attention_heads", "num_key_value_heads", "vocab_size")} == {
        "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8,
        "num_experts_per_tok": 2, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    }  # fmt: skip
    # load_format=dummy: a checkpoint of headers over a hole (its layout, for --twin auto), no data
    (ckpt,) = (mixtral / "model").glob("*.safetensors")
    assert ckpt.stat().st_blocks * 512 < 2**20 < ckpt.stat().st_size
    assert (mixtral / "model" / "tokenizer.json").is_file()
    found = [
        (ep.name, ep.value)
        for dist in importlib.metadata.distributions(path=[str(mixtral / "site")])
        for ep in dist.entry_points
        if ep.group == "vllm.general_plugins"
    ]
    assert found == [("tiny_moe", "tiny_moe_model:register")]
    assert (mixtral / "site" / "tiny_moe_model" / "model.py").is_file()


@pytest.mark.parametrize(("tp", "ep"), [(1, False), (2, False), (8, False), (8, True)])
def test_vd305_splits_it_as_served(mixtral: Path, tp: int, ep: bool) -> None:
    from vllm_doctor.checks import run_checks
    from vllm_doctor.facts.static import Facts

    config = json.loads((mixtral / "model" / "config.json").read_text())
    facts = Facts(model_dir=str(mixtral / "model"), config=config, tensor_parallel_size=tp, enable_expert_parallel=ep)
    findings = run_checks(facts, ["VD305", "VD309"])
    assert [f for f in findings if f.is_problem] == []
