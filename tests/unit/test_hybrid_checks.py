"""VD214 (a hybrid's state interfaces), VD215 (its layer pattern) and VD216 (an MLA port's latent,
and vLLM's reading of the model as MLA) on plain data: the weights pass's record of the built mixers
and the class's declarations, as the real pass sends them for examples/hybrid and examples/mla
(tests/engine/test_hybrid_ground_truth.py, tests/engine/test_mla_ground_truth.py run those on the engine)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_doctor.checks import run_checks
from vllm_doctor.checks.base import MAX_REPEATED
from vllm_doctor.checks.hybrid import expected_family, pattern_problems
from vllm_doctor.facts.static import Facts
from vllm_doctor.model import Outcome

CONFIG = {"architectures": ["TinyHybridForCausalLM"], "hybrid_override_pattern": "M*M-", "num_hidden_layers": 4}
DECLARED = {
    "is_hybrid": True,
    "has_inner_state": True,
    "is_attention_free": False,
    "methods": {"get_mamba_state_shape_from_config": True, "get_mamba_state_dtype_from_config": True},
}


def mixers(pattern: str = "M*M-") -> list[dict[str, Any]]:
    out = []
    for i, kind in enumerate(pattern):
        if kind == "M":
            out.append({"prefix": f"model.layers.{i}.mixer", "path": f"model.layers.{i}.mixer", "kind": "mamba",
                        "family": "state", "class": "MambaMixer2"})  # fmt: skip
        elif kind == "*":
            out.append({"prefix": f"model.layers.{i}.attn", "path": f"model.layers.{i}.attn", "kind": "attention",
                        "family": "attention", "class": "Attention"})  # fmt: skip
    return out


def facts(config: dict[str, Any] = CONFIG, built: str | None = "M*M-", **declared: Any) -> Facts:
    load = {"mixers": mixers(built), "state_interfaces": DECLARED | declared} if built is not None else None
    return Facts(model_dir="/m", config=config, weight_load=load)


def test_the_working_hybrid_passes_both() -> None:
    vd214, vd215 = run_checks(facts(), ["VD214", "VD215"])
    assert (vd214.outcome, vd215.outcome) == (Outcome.PASS, Outcome.PASS)
    assert vd214.message.startswith("2 state mixer(s) beside 1 attention layer(s): the class declares IsHybrid")


def test_a_hybrid_without_is_hybrid_or_its_state_methods_is_named() -> None:
    (f,) = run_checks(facts(is_hybrid=False), ["VD214"])
    assert f.outcome is Outcome.FAIL and f.subject == "model.layers.0.mixer"
    assert f.message.endswith("its class lacks IsHybrid (it has attention too)")
    no_shape = facts(methods={"get_mamba_state_shape_from_config": False, "get_mamba_state_dtype_from_config": True})
    (f,) = run_checks(no_shape, ["VD214"])
    assert f.outcome is Outcome.FAIL and "the class method get_mamba_state_shape_from_config" in f.message
    # a model of Mamba mixers only needs IsAttentionFree (vLLM's Mamba2ForCausalLM)
    (f,) = run_checks(facts(built="MM", is_hybrid=False, is_attention_free=True), ["VD214"])
    assert f.outcome is Outcome.PASS
    (f,) = run_checks(facts(built="**", is_hybrid=False), ["VD214"])
    assert f.outcome is Outcome.NOT_APPLICABLE


def test_a_layer_built_as_another_kind_than_the_pattern_says() -> None:
    (f,) = run_checks(facts(built="MMM-"), ["VD215"])
    assert f.outcome is Outcome.FAIL and f.subject == "model.layers.1"
    assert (
        f.message
        == "layer 1: hybrid_override_pattern says attention, the model builds a Mamba / linear-attention mixer there"
    )
    (f,) = run_checks(facts(built="M*MM"), ["VD215"])
    assert (
        f.message
        == "layer 3: hybrid_override_pattern says an MLP, the model builds a Mamba / linear-attention mixer there"
    )


def test_a_malformed_pattern_is_a_finding_without_a_build() -> None:
    bad = {**CONFIG, "hybrid_override_pattern": "M*X-"}
    (f,) = run_checks(facts(bad, built=None), ["VD215"])
    assert f.outcome is Outcome.FAIL and f.subject == "config.json:hybrid_override_pattern[2]"
    assert f.message == "hybrid_override_pattern[2] is 'X': no layer kind (M Mamba 2, * attention, - MLP, E MoE)"
    short = {**CONFIG, "num_hidden_layers": 6}
    assert [p["message"] for p in pattern_problems(short)] == [
        "hybrid_override_pattern names 4 layer(s), num_hidden_layers is 6"
    ]
    (f,) = run_checks(facts({"architectures": ["LlamaForCausalLM"]}), ["VD215"])
    assert f.outcome is Outcome.NOT_APPLICABLE


def test_a_pattern_wrong_on_every_layer_costs_the_report_a_constant() -> None:
    """A pattern of thousands of layers, each built as another kind (or each an unknown letter):
    MAX_REPEATED findings and one summary, not one finding per layer (10,000 within VD309's bound)."""
    n = 2000
    config = {**CONFIG, "num_hidden_layers": n, "hybrid_override_pattern": "*" * n}
    found = run_checks(facts(config, built="M" * n), ["VD215"])
    assert len(found) == MAX_REPEATED + 1 and all(f.outcome is Outcome.FAIL for f in found)
    assert found[-1].message.startswith(f"... and {n - MAX_REPEATED} more layers where hybrid_override_pattern")
    unknown = {**config, "hybrid_override_pattern": "X" * n}
    assert len(run_checks(facts(unknown, built=None), ["VD215"])) <= MAX_REPEATED + 1


@pytest.mark.parametrize(
    ("entry", "family"),
    [("full_attention", "attention"), ("sliding_attention", "attention"), ("linear_attention", "state"),
     ("mamba", "state"), ("conv", "state"), ("hybrid", None)],
)  # fmt: skip
def test_layer_type_names(entry: str, family: str | None) -> None:
    """Qwen3-Next's, Gemma 3's, Jamba's and LFM2's layer type names, as vLLM's own models build them."""
    assert expected_family("layer_types", entry) == (True, family)


def test_layer_types_of_an_in_tree_hybrid_match_what_it_builds() -> None:
    """Qwen3-Next: three Gated DeltaNet layers and a full attention layer, layer_types as config.json gives them."""
    config = {"layer_types": ["linear_attention"] * 3 + ["full_attention"], "num_hidden_layers": 4}
    (f,) = run_checks(facts(config, built="MMM*"), ["VD215"])
    assert f.outcome is Outcome.PASS


def _mla_facts(kv_lora_rank: int, rope: int, **load: Any) -> Facts:
    config = {"architectures": ["MyMlaForCausalLM"], "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    layers = [{"prefix": f"model.layers.{i}.self_attn.attn", "path": f"model.layers.{i}.self_attn.mla_attn.mla_attn",
               "kind": "mla", "family": "mla", "class": "MLAAttention", "kv_lora_rank": kv_lora_rank,
               "qk_rope_head_dim": rope, "head_size": kv_lora_rank + rope} for i in range(2)]  # fmt: skip
    return Facts(model_dir="/m", config=config, weight_load={"mixers": layers, "state_interfaces": DECLARED} | load)


def test_an_mla_layer_caches_config_jsons_latent() -> None:
    (f,) = run_checks(_mla_facts(512, 64), ["VD216"])
    assert f.outcome is Outcome.PASS and f.message == "2 MLA layer(s) cache config.json's latent (kv_lora_rank 512, qk_rope_head_dim 64)"
    bad = run_checks(_mla_facts(512, 32), ["VD216"])
    assert [x.subject for x in bad] == ["model.layers.0.self_attn.mla_attn.mla_attn", "model.layers.1.self_attn.mla_attn.mla_attn"]
    assert bad[0].message.endswith("MLA latent with qk_rope_head_dim 32 (config.json: 64)")
    (f,) = run_checks(facts(), ["VD216"])
    assert f.outcome is Outcome.NOT_APPLICABLE


def test_an_mla_model_vllm_does_not_read_as_mla() -> None:
    """examples/mla/mla-model-type-unknown: a model_type outside vLLM's MLA list (no convertor
    registered) builds its MLA layers, and vLLM sizes their metadata by hidden_size / heads; vLLM
    0.32's first request fails (tests/fixtures/mla_expected.py)."""
    unread = {"model_type": "my_mla", "use_mla": False, "head_size": 32}
    (f,) = run_checks(_mla_facts(512, 64, attention_reading=unread), ["VD216"])
    assert f.outcome is Outcome.FAIL and f.subject == "model.layers.0.self_attn.mla_attn.mla_attn"
    assert f.message == (
        "model.layers.0.self_attn.mla_attn.mla_attn: the model builds 2 MLA layer(s), but vLLM does not read model_type "
        "'my_mla' as an MLA model (ModelConfig.use_mla is false): it sizes their attention metadata by a head of 32, "
        "not the latent's 576 (kv_lora_rank 512 + qk_rope_head_dim 64); vLLM 0.32 fails the first request with "
        "'Head dimension 32 is not supported by MLA.'"
    )
    # with a hard-coded latent too: both, the latent per layer
    both = run_checks(_mla_facts(512, 32, attention_reading=unread), ["VD216"])
    assert [x.outcome for x in both] == [Outcome.FAIL] * 3
    # vLLM reads it as MLA: the latent is compared, nothing else
    read = {"model_type": "my_mla", "use_mla": True, "head_size": 576}
    (f,) = run_checks(_mla_facts(512, 64, attention_reading=read), ["VD216"])
    assert f.outcome is Outcome.PASS
    # vLLM's own class (VLLM_MLA_DISABLE is vLLM's choice) and a pass that could not ask: no finding
    own = _mla_facts(512, 64, attention_reading=unread, model={"class": "vllm.model_executor.models.x.DeepseekV2ForCausalLM"})
    assert [x.outcome for x in run_checks(own, ["VD216"])] == [Outcome.PASS]
    assert [x.outcome for x in run_checks(_mla_facts(512, 64, attention_reading={}), ["VD216"])] == [Outcome.PASS]


def test_a_vllm_exception_without_a_message_is_named_by_its_line() -> None:
    """vLLM's bare `assert mamba_block_size is not None` (a hybrid without IsHybrid): the engine
    stage's error text names the type and the line, never an empty string (which crashed it)."""
    from vllm_doctor.compat.common import describe_exception

    def get_kv_cache_spec() -> None:
        mamba_block_size = None
        if mamba_block_size is None:  # a bare assert as vLLM's (pytest would add a message to one here)
            raise AssertionError

    try:
        get_kv_cache_spec()
    except AssertionError as exc:
        text = describe_exception(exc)
    assert text.startswith("AssertionError (no message) at ") and "in get_kv_cache_spec: raise AssertionError" in text
    assert describe_exception(ValueError("said")) == "ValueError: said"


def test_a_mixer_registered_under_another_name_is_vd217_before_launch() -> None:
    """VD217 reads the meta-device build's forward context: each mixer's prefix beside its place."""
    (ok,) = run_checks(facts(), ["VD217"])
    assert ok.outcome is Outcome.PASS and "3 token mixer(s)" in ok.message
    wrong = facts()
    wrong.weight_load["mixers"][1]["prefix"] = "layers.1.attn"  # no place in the model: the model's prefix dropped
    (warn,) = run_checks(wrong, ["VD217"])
    assert warn.outcome is Outcome.WARN and warn.subject == "model.layers.1.attn"
    assert warn.message == "attention registered as 'layers.1.attn' sits at 'model.layers.1.attn'"
    mla = facts()
    mla.weight_load["mixers"] = [{"prefix": "model.layers.0.self_attn.attn", "path": "model.layers.0.self_attn.mla_attn.mla_attn",
                                  "kind": "mla", "family": "mla", "class": "MLAAttention"}]  # fmt: skip
    assert [f.outcome for f in run_checks(mla, ["VD217"])] == [Outcome.PASS]  # vLLM's wrapper names it so
    own = facts()
    own.weight_load["mixers"][1]["prefix"] = "somewhere.else"
    own.weight_load["model"] = {"class": "vllm.model_executor.models.hrm.HrmForCausalLM"}
    assert [f.outcome for f in run_checks(own, ["VD217"])] == [Outcome.PASS]  # vLLM names its own layers
