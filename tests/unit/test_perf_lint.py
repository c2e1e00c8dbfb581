"""The performance lint's pure parts: the forward-path source scan and the VD6xx checks over
plain module-tree records (the module trees of real builds: tests/integration/test_perf_lint.py)."""

from __future__ import annotations

import textwrap
from typing import Any

from vllm_doctor.analysis.records import TwinAB
from vllm_doctor.checks import codes_for, run_checks
from vllm_doctor.checks.perf import LintFacts
from vllm_doctor.compat.perf_source import scan_class
from vllm_doctor.facts.perf import ModelClass, PerfAnatomy, Projection, SourceFinding

SLOW = textwrap.dedent(
    """
    import torch

    def helper(x, heads):
        return [x[:, h] for h in range(heads)]

    class Attn(torch.nn.Module):
        def __init__(self):
            for h in range(self.num_heads):  # __init__ is not the forward path
                pass

        def rotate(self, x):
            out = []
            for h in range(self.num_heads):
                out.append(x[:, h])
            return out

        def forward(self, positions, x):
            for layer in self.layers:
                x = layer(x)
            for i in range(self.start_layer, self.end_layer):
                x = self.layers[i](x)
            q = self.rotate(self.q_proj(x))
            parts = helper(x, 4)
            for seq in range(len(positions)):
                pass
            y = self.down_proj(x.float())
            z = torch.matmul(q.to(torch.float32), x)
            w = x.float() @ x
            n = x.float().pow(2).mean(-1)  # a norm's reduction: not an island
            return torch.nn.functional.scaled_dot_product_attention(q, x, x)

        def load_weights(self, weights):
            for name, w in weights:
                for h in range(self.num_heads):
                    pass
    """
)


def scanned() -> list[SourceFinding]:
    return scan_class(SLOW, "Attn", filename="m.py", containers={"layers"}, projections={"down_proj"})


def test_the_scan_follows_forward_into_its_methods_and_module_functions_only() -> None:
    loops = [f for f in scanned() if f.kind == "loop"]
    where = sorted((f.function, f.detail) for f in loops)
    assert where == [("forward", "tokens or sequences"), ("helper", "heads"), ("rotate", "heads")]
    rotate = next(f for f in loops if f.function == "rotate")
    assert rotate.code == "for h in range(self.num_heads):" and rotate.file == "m.py"
    assert SLOW.splitlines()[rotate.line - 1].strip() == rotate.code


def test_module_container_and_layer_loops_are_how_decoders_run_and_are_not_reported() -> None:
    assert not [f for f in scanned() if "layer" in f.code]


def test_float32_casts_are_reported_where_they_feed_a_projection_or_a_matmul() -> None:
    casts = sorted(f.code for f in scanned() if f.kind == "float32")
    assert casts == ["w = x.float() @ x", "y = self.down_proj(x.float())", "z = torch.matmul(q.to(torch.float32), x)"]


def test_hand_written_attention_is_named_by_its_call() -> None:
    (f,) = [f for f in scanned() if f.kind == "attention"]
    assert f.detail == "scaled_dot_product_attention" and f.function == "forward"


def test_a_source_that_does_not_parse_or_lacks_the_class_gives_nothing() -> None:
    assert scan_class("def (:", "Attn") == []
    assert scan_class(SLOW, "Missing") == []
    assert scan_class("class A:\n    def f(self):\n        for h in range(self.num_heads): pass\n", "A") == []


def test_line_numbers_are_shifted_to_the_file_when_the_source_is_a_fragment() -> None:
    (f,) = [f for f in scan_class(SLOW, "Attn", first_line=101) if f.function == "rotate"]
    assert f.line == next(x.line for x in scanned() if x.function == "rotate") + 100


# --- the checks over plain records -----------------------------------------------------------


def lin(name: str, i: int, o: int, kind: str = "plain-linear", dtype: str = "bfloat16") -> Projection:
    return Projection(name, "torch.nn.modules.linear.Linear" if kind.startswith("plain") else "vllm.X", kind, i, o, dtype)


def anatomy(projections: list[Projection], **kw: Any) -> PerfAnatomy:
    base: dict[str, Any] = dict(
        root_class="pkg.model.MyForCausalLM",
        dtype="bfloat16",
        hidden_size=4096,
        vocab_size=128256,
        num_hidden_layers=2,
        source="meta-device build",
        projections=tuple(projections),
        attention_layers=("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"),
        compiled_modules=("model",),
    )
    base.update(kw)
    return PerfAnatomy(**base)


def slow_layers() -> list[Projection]:
    out = [lin("model.embed_tokens", 128256, 4096, "plain-embedding")]
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        out += [lin(f"{a}.q_proj", 4096, 4096), lin(f"{a}.k_proj", 4096, 1024), lin(f"{a}.v_proj", 4096, 1024)]
        out += [lin(f"{a}.o_proj", 4096, 4096), lin(f"{m}.gate_proj", 4096, 14336), lin(f"{m}.up_proj", 4096, 14336)]
        out += [lin(f"{m}.down_proj", 14336, 4096), lin(f"{m}.router", 4096, 8)]
    return out


def fused_layers() -> list[Projection]:
    out = [lin("model.embed_tokens", 128256, 4096, "vllm-embedding"), lin("lm_head", 128256, 4096, "vllm-embedding")]
    for i in range(2):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        out += [lin(f"{a}.qkv_proj", 4096, 6144, "vllm-linear"), lin(f"{a}.o_proj", 4096, 4096, "vllm-linear")]
        out += [lin(f"{m}.gate_up_proj", 4096, 28672, "vllm-linear"), lin(f"{m}.down_proj", 14336, 4096, "vllm-linear")]
    return out


def findings(perf: PerfAnatomy | None, twin: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in run_checks(LintFacts(perf, twin=TwinAB.of(twin) if twin else None), codes_for("performance")):
        out.setdefault(f.code, []).append(f)
    return out


def test_every_lint_passes_a_fused_compiled_model_built_of_vllms_layers() -> None:
    got = findings(anatomy(fused_layers()))
    assert set(got) == {"VD601", "VD602", "VD603", "VD604", "VD605", "VD606"}
    assert all(f.outcome.value == "pass" for fs in got.values() for f in fs), got


def test_separate_projections_are_one_finding_per_module_pattern_naming_the_fused_layer() -> None:
    got = findings(anatomy(slow_layers()))["VD601"]
    by_subject = {f.subject: f for f in got}
    assert set(by_subject) == {"model.layers.*.self_attn", "model.layers.*.mlp"}
    attn = by_subject["model.layers.*.self_attn"]
    assert "q_proj, k_proj, v_proj as 3 separate GEMMs (x2 layers)" in attn.message
    assert "QKVParallelLinear (qkv_proj)" in attn.message and attn.outcome.value == "warn"
    assert "MergedColumnParallelLinear (gate_up_proj)" in by_subject["model.layers.*.mlp"].message


def test_vllms_own_model_keeps_its_own_layout() -> None:
    """vLLM's Laguna keeps gate_proj and up_proj apart on purpose (NVFP4's per-layer global scales):
    the lint holds ports to vLLM's layout, not vLLM's own classes (found by tools/sweep_kinds.py)."""
    (f,) = findings(anatomy(slow_layers(), root_class="vllm.model_executor.models.laguna.LagunaForCausalLM"))["VD601"]
    assert f.outcome.value == "not_applicable" and "vLLM's own model" in f.message


def test_projections_fed_different_inputs_are_not_fusable() -> None:
    layers = [lin("x.q_proj", 4096, 4096), lin("x.k_proj", 1024, 1024), lin("x.v_proj", 1024, 1024)]
    assert findings(anatomy(layers))["VD601"][0].outcome.value == "pass"


def test_plain_torch_layers_are_named_with_their_vllm_layer_and_a_small_router_is_not() -> None:
    got = {f.subject: f for f in findings(anatomy(slow_layers()))["VD602"]}
    assert set(got) == {"model", "model.layers.*.self_attn", "model.layers.*.mlp"}
    assert "router" not in got["model.layers.*.mlp"].message  # 4096 -> 8: replicated in vLLM too
    assert "down_proj: RowParallelLinear" in got["model.layers.*.mlp"].hint
    assert "embed_tokens (128256 -> 4096) is plain torch.nn.Embedding" in got["model"].message
    assert "VocabParallelEmbedding" in got["model"].hint


def test_an_uncompiled_model_gets_the_measured_cost_when_the_twin_ran() -> None:
    twin = {
        "architecture": "LlamaForCausalLM",
        "compiled": {"port": False, "twin": True},
        "phases": {"decode": {"step_ratio": 2.1}, "prefill": {"step_ratio": 2.9}},
        "kinds": {"MLP": {"port_s": 3.0, "twin_s": 1.0, "ratio": 3.0}},
    }
    perf = anatomy(slow_layers(), compiled_modules=())
    (alone,) = findings(perf)["VD603"]
    assert alone.outcome.value == "warn" and "measured" not in alone.message
    (measured,) = findings(perf, twin)["VD603"]
    assert "measured against vLLM's LlamaForCausalLM (compiled), same workload: prefill step 2.90x, decode step 2.10x" in measured.message
    mlp = next(f for f in findings(perf, twin)["VD601"] if f.subject.endswith("mlp"))
    assert "measured (profile --twin): mlp time 3.00x vLLM's LlamaForCausalLM" in mlp.message
    assert mlp.evidence["measured"]["ratio"] == 3.0


def test_compiled_on_both_sides_the_projections_are_measured_in_the_dense_span_not_the_attention_op() -> None:
    dense = "between two attention ops: output projection, norms, MLP, next QKV and rotary"
    twin = {
        "architecture": "LlamaForCausalLM",
        "kinds": {"attention": {"covers": "the attention op", "ratio": 0.99}, "dense": {"covers": dense, "ratio": 6.17}},
    }
    got = findings(anatomy(slow_layers()), twin)["VD601"]
    attn = next(f for f in got if f.subject.endswith("self_attn"))
    assert attn.message.endswith(f"measured (profile --twin): {dense} 6.17x vLLM's LlamaForCausalLM")
    assert attn.evidence["measured"]["kind"] == "dense"


def test_a_loop_carries_the_op_probe_count_per_call() -> None:
    loop = SourceFinding("loop", "pkg.model.Attn", "rotate", 66, "/site/pkg/model.py", "for h in range(heads):", "heads")
    classes = (ModelClass("pkg.model.Attn", "/site/pkg/model.py", 2, "model.layers.0.self_attn"),)
    perf = anatomy(fused_layers(), source_findings=(loop,), model_classes=classes)
    (plain,) = findings(perf)["VD604"]
    assert plain.message == "Attn.rotate loops over heads in Python (pkg/model.py:66: for h in range(heads):)"
    (counted,) = findings(perf.with_op_counts({"pkg.model.Attn": 240}, "decode"))["VD604"]
    assert counted.message.endswith("measured: the op probe counted 120 aten ops per Attn call in one decode step")


def test_float32_islands_count_only_in_a_low_precision_model() -> None:
    island = [*fused_layers(), lin("model.layers.0.mlp.down_proj", 14336, 4096, "vllm-linear", "float32")]
    (f,) = findings(anatomy(island))["VD605"]
    assert f.outcome.value == "warn" and "float32 inside a bfloat16 model" in f.message
    (na,) = findings(anatomy(island, dtype="float32"))["VD605"]
    assert na.outcome.value == "not_applicable"


def test_attention_without_vllms_layer_is_reported_and_sdpa_is_named() -> None:
    (none,) = findings(anatomy(fused_layers(), attention_layers=()))["VD606"]
    assert none.outcome.value == "warn" and "no vLLM attention layer" in none.message
    sdpa = SourceFinding("attention", "pkg.Attn", "forward", 9, "m.py", "o = F.scaled_dot_product_attention(q, k, v)", "scaled_dot_product_attention")
    (f,) = findings(anatomy(fused_layers(), attention_layers=(), source_findings=(sdpa,)))["VD606"]
    assert "computes attention with scaled_dot_product_attention" in f.message and "no vLLM attention layer at all" in f.message


def test_attention_inside_a_multimodal_encoder_is_pointed_at_vllms_encoder_attention() -> None:
    """An encoder attends over each image's tokens without a KV cache: the advice is vLLM's encoder
    attention layer (MMEncoderAttention), not the decoder's KV-cached Attention; a decoder's own
    SDPA in the same model still gets the decoder advice; q/k/v in the tower cite vLLM's encoders."""
    tower = "vision_tower.encoder.layers.0.self_attn"
    classes = (
        ModelClass("pkg.VisionAttn", "m.py", 1, tower, None, True),
        ModelClass("pkg.TextAttn", "m.py", 2, "language_model.layers.0.self_attn", None, False),
    )
    sdpa = "o = F.scaled_dot_product_attention(q, k, v)"
    calls = (
        SourceFinding("attention", "pkg.VisionAttn", "forward", 9, "m.py", sdpa, "scaled_dot_product_attention"),
        SourceFinding("attention", "pkg.TextAttn", "forward", 30, "m.py", sdpa, "scaled_dot_product_attention"),
    )
    qkv = [lin(f"{tower}.{n}", 64, 64) for n in ("q_proj", "k_proj", "v_proj")]
    perf = anatomy(
        fused_layers() + qkv,
        source_findings=calls,
        model_classes=classes,
        encoder_modules=("vision_tower", "multi_modal_projector"),
        encoder_attention="vllm.model_executor.layers.attention.MMEncoderAttention",
    )
    got = findings(perf)
    vision, text = got["VD606"]
    assert vision.message.startswith("VisionAttn.forward, in the multimodal encoder (vision_tower), computes attention")
    assert "not vLLM's encoder attention layer (MMEncoderAttention)" in vision.message
    assert vision.hint.startswith("build vllm's MMEncoderAttention(num_heads, head_dim, scale, prefix=")
    assert "not vLLM's Attention, which keeps a KV cache" in vision.hint
    assert text.hint == "build vllm's Attention(..., prefix=f'{prefix}.attn') in __init__ and call self.attn(q, k, v)"
    projector = [lin("multi_modal_projector.linear_1", 1024, 4096), lin("multi_modal_projector.linear_2", 4096, 4096)]
    (plain,) = findings(anatomy(fused_layers() + projector))["VD602"]
    assert "linear_1: ColumnParallelLinear; linear_2: RowParallelLinear" in plain.hint  # as vLLM's llava.py
    (unfused,) = [f for f in got["VD601"] if f.outcome.value == "warn"]
    assert "vLLM's own vision encoders (clip.py, siglip.py) run them as one QKVParallelLinear" in unfused.message
    assert "clip.py" in unfused.hint


def test_without_a_module_tree_every_lint_skips_and_says_why() -> None:
    facts = LintFacts(None, perf_error="the model was not built: KeyError")
    got = run_checks(facts, codes_for("performance"))
    assert {f.outcome.value for f in got} == {"skip"}
    assert all("KeyError" in f.message for f in got)


def test_the_anatomy_survives_its_wire_and_a_reply_of_another_shape() -> None:
    perf = anatomy(slow_layers(), source_findings=(SourceFinding("loop", "a.B", "f", 1, "x.py", "for", "heads"),))
    again = PerfAnatomy.of(perf.to_json())
    assert again == perf
    assert PerfAnatomy.of({"projections": "nonsense", "op_counts": {"a": "x"}}).projections == ()
