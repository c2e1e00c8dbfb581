"""The roofline's byte and FLOP count, the device peaks, and a rate above a peak (a doctor bug).

Plain data: Llama-3-8B's shapes counted by hand; the worker records as a real worker sends
them (their ``to_json`` dicts); the H200's memory interface as torch reports it
(``torch.cuda.get_device_properties``: a 6016-bit bus at 3.201 GHz, 4.81 TB/s).
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_doctor.analysis.engine import summarize
from vllm_doctor.analysis.records import Roofline, RooflinePhase, RooflineWorkload
from vllm_doctor.analysis.roofline import (
    DecoderShape,
    StepWorkload,
    device_peaks,
    dtype_bytes,
    expected_experts,
    phase_text,
    rates,
    step_bytes,
    step_flops,
)
from vllm_doctor.facts.anatomy import Anatomy, WorkerIdentity
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.kv import HfShape, KvCache, KvGroup, KvSpec
from vllm_doctor.facts.memory import MemoryFacts
from vllm_doctor.facts.placement import DevicePlace, Placement
from vllm_doctor.model import Report
from vllm_doctor.report.profile import render_roofline

LLAMA3_8B = DecoderShape(
    hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
    tied_embeddings=False, weight_bytes=2, kv_bytes=2,
)
# By hand, per layer: q 4096*4096 = 16,777,216; k and v 2*4096*1024 = 8,388,608;
# o 16,777,216 -> attention 41,943,040. MLP 3*4096*14336 = 176,160,768. Two norms 8,192.
# Layer: 218,112,000; 32 layers: 6,979,584,000. Embedding 128256*4096 = 525,336,576, the untied
# LM head as much, the final norm 4,096: 8,030,261,248 parameters = 16,060,522,496 bytes in bf16.
HAND_LAYER = 218_112_000
HAND_PARAMS = 8_030_261_248
HAND_WEIGHT_BYTES = 16_060_522_496
# the H200 as torch describes it: 2 x 6016 / 8 bytes x 3.201e9 transfers/s = 4.815 TB/s
H200_BANDWIDTH = 2 * 6016 / 8 * 3_201_000e3


def test_llama3_8b_parameters_and_weight_bytes_match_the_hand_count() -> None:
    assert LLAMA3_8B.layer_params == HAND_LAYER
    assert LLAMA3_8B.params == HAND_PARAMS
    assert LLAMA3_8B.resident_weight_bytes == HAND_WEIGHT_BYTES  # ~16.06e9 bytes incl. embeddings
    # K and V of 32 layers x 8 heads x 128 in bf16: 131,072 bytes per token
    assert LLAMA3_8B.kv_bytes_per_token == 131_072


def test_a_decode_step_counts_weights_once_kv_per_context_and_flops_per_token() -> None:
    # 128 sequences, one new token each, 384 tokens of context each
    work = StepWorkload(tokens=128, seqs=128, context=128 * 384)
    b = step_bytes(LLAMA3_8B, work)
    # every matrix once except the untied input embedding table (only the 128 rows gathered):
    # (6,979,584,000 + 4,096 + 525,336,576) * 2 + 128 * 4096 * 2
    assert b.weights == (6_979_584_000 + 4_096 + 525_336_576) * 2 + 128 * 4096 * 2 == 15_010_897_920
    assert b.kv_read == 49_152 * 131_072 == 6_442_450_944
    assert b.kv_write == 128 * 131_072
    # per token and layer: QKV 4096 + 6144, attention 2 x 4096, O 4096 + 4096, gate/up 4096 + 28672,
    # activation 28672 + 14336, down 14336 + 4096, two norms 4 x 4096, two residual adds 6 x 4096
    # = 161,792 elements; + the final norm (2 x 4096 per token) + the logits (4096 in, 128256 out per sequence)
    assert b.activations == (161_792 * 32 * 128 + 2 * 4096 * 128 + 128 * (4096 + 128_256)) * 2
    assert b.total == pytest.approx(b.weights + b.kv_read + b.kv_write + b.activations)
    f = step_flops(LLAMA3_8B, work)
    # GEMMs: 2 x 128 tokens x 32 x (41,943,040 + 176,160,768); logits: 2 x 128 x 128256 x 4096
    assert f.gemm == 2 * 128 * 32 * (41_943_040 + 176_160_768)
    assert f.lm_head == 2 * 128 * 128_256 * 4096
    # attention: 4 x 32 layers x 32 heads x 128 x (one query over 384 context tokens) x 128 sequences
    assert f.attention == 4 * 32 * 32 * 128 * 384 * 128


def test_a_causal_prefill_reads_half_its_square() -> None:
    one = step_flops(LLAMA3_8B, StepWorkload(tokens=1024, seqs=1, context=1024))
    # sum over the 1024 queries of the keys each sees (1..1024) = 1024 * 1025 / 2
    assert one.attention == 4 * 32 * 32 * 128 * (1024 * 1025 / 2)


def test_h200_peaks_from_the_device_and_the_dense_datasheet() -> None:
    p = device_peaks("NVIDIA H200", "cuda", 6016, 3_201_000, "torch.bfloat16")
    assert p.bandwidth == pytest.approx(H200_BANDWIDTH) and p.bandwidth == pytest.approx(4.815e12, rel=1e-3)
    assert p.bandwidth_source.startswith("device")
    assert p.flops == 989.5e12 and p.flops_dtype == "bf16"  # dense, not the 1,979 sparse figure
    assert device_peaks("NVIDIA H100 PCIe", "cuda", None, None, "torch.float16").flops == 756.5e12
    assert device_peaks("NVIDIA H100 80GB HBM3", "cuda", None, None, "torch.bfloat16").bandwidth == 3.35e12
    assert device_peaks("NVIDIA A10", "cuda", None, None, "torch.bfloat16").flops == 125e12
    assert device_peaks("NVIDIA A100-SXM4-80GB", "cuda", None, None, "torch.bfloat16").flops == 312e12
    unknown = device_peaks("Some GPU 9000", "cuda", None, None, "torch.bfloat16")
    assert unknown.flops is None and unknown.bandwidth is None and "peak unknown" in unknown.flops_source
    cpu = device_peaks(None, "cpu", None, None, "torch.bfloat16")
    assert cpu.bandwidth is None and cpu.flops is None
    assert dtype_bytes("torch.float8_e4m3fn") == 1 and dtype_bytes("torch.float32") == 4 and dtype_bytes("x") is None


def test_the_h200_decode_of_the_8b_shape_reads_as_a_share_of_its_peak() -> None:
    """A run measured on the H200 (vLLM 0.26, Llama-3-8B's shapes, dummy weights, 128 prompts x 128
    tokens in / 256 out, default mode): 2.29 s for one prefill and 255 decode steps, 7.5 ms per
    decode step."""
    peaks = device_peaks("NVIDIA H200", "cuda", 6016, 3_201_000, "torch.bfloat16")
    work = StepWorkload(tokens=128, seqs=128, context=128 * 256)
    b, f = step_bytes(LLAMA3_8B, work), step_flops(LLAMA3_8B, work)
    r = rates(b, f, 7.5e-3, peaks)
    assert not r.above_peak and r.problems == []
    moved = b.weights + b.kv_read + b.kv_write  # the activations stay out of the share
    assert r.bytes_per_s == pytest.approx(moved / 7.5e-3)
    assert r.bytes_per_s_with_activations == pytest.approx(b.total / 7.5e-3)
    assert r.bandwidth_share == pytest.approx(moved / 7.5e-3 / H200_BANDWIDTH)
    assert 0.4 < r.bandwidth_share < 0.6 and r.bound == "memory"
    text = phase_text("decode", RooflinePhase(**vars(r), bytes=b), peaks.to_record())
    assert text.startswith(f"decode {100 * (r.bandwidth_share or 0):.0f} % of 4.81 TB/s (")
    assert "weights 15 GB + KV 4.31 GB per step" in text


def test_a_rate_above_the_peak_is_flagged_never_printed_as_a_share() -> None:
    """The host time of an asynchronous step (2.46 ms for 15 GB of weights) needs 6.1 TB/s: the
    H200 moves 4.8. The share is withheld and the entry says the step time is wrong."""
    peaks = device_peaks("NVIDIA H200", "cuda", 6016, 3_201_000, "torch.bfloat16")
    work = StepWorkload(tokens=128, seqs=128, context=128 * 256)
    b, f = step_bytes(LLAMA3_8B, work), step_flops(LLAMA3_8B, work)
    r = rates(b, f, 2.46e-3, peaks)
    assert r.above_peak and r.bandwidth_share is None
    assert r.problems[0].startswith("rate above the device's peak: the weights alone need 6.10 TB/s")
    assert r.problems[0].endswith("the step time is wrong")
    text = phase_text("decode", RooflinePhase(**vars(r), bytes=b), peaks.to_record())
    assert "ABOVE the device's peak: the step time is wrong" in text and "%" not in text
    # compute: a prefill of 8192 tokens in 1 ms would be 1,000+ TFLOP/s, above the dense 989.5
    big = StepWorkload(tokens=8192, seqs=8, context=8192)
    rc = rates(step_bytes(LLAMA3_8B, big), step_flops(LLAMA3_8B, big), 1e-3, peaks)
    assert rc.above_peak and rc.compute_share is None and any("TFLOP/s" in p for p in rc.problems)


def _worker(step_s: float, device: DevicePlace, memory_bytes: int = HAND_WEIGHT_BYTES) -> WorkerFacts:
    hf = HfShape(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_size=4096,
                 intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False, model_type="llama")
    kv = KvCache(groups=[KvGroup(["l0"], KvSpec(type="FullAttentionSpec", block_size=16, dtype="torch.bfloat16"))],
                 hf_config=hf, tensor_parallel_size=1)
    steps = [{"index": i, "t": 0.01 * i, "phase": "decode", "decode_tokens": 128, "decode_reqs": 128,
              "total_tokens": 128, "kv_blocks_used": 128 * 16, "step_s": step_s, "forward_s": step_s,
              "layers_timed": i < 2} for i in range(4)]
    layer = {"name": "model.layers.0", "kind": "layer", "layer": 0, "decode_calls": 2, "decode_s": 2 * step_s / 40}
    profile: dict[str, Any] = {"profiling": True, "clock": "cuda_events", "steps": steps, "layers": [layer]}
    return WorkerFacts(rank=0, parts={
        "kv": kv.to_json(),
        "placement": Placement(device=device, model_dtype="torch.bfloat16").to_json(),
        "memory": MemoryFacts(device=device.device, parameter_bytes=memory_bytes).to_json(),
        "anatomy": Anatomy(WorkerIdentity(rank=0, tensor_parallel_size=1)).to_json(),
        "profile": profile,
    })


H200 = DevicePlace(device="cuda:0", type="cuda", name="NVIDIA H200", memory_bus_width_bits=6016,
                   memory_clock_khz=3_201_000)


def test_the_engine_summary_carries_the_roofline_per_phase_and_per_timed_layer() -> None:
    s = summarize(EngineFacts(workers=[_worker(7.5e-3, H200)]))
    roof = s.roofline
    assert roof.available and roof.model.params == HAND_PARAMS and roof.model.weights_source == "config"
    assert roof.device.bandwidth_bytes_s == pytest.approx(H200_BANDWIDTH)
    decode = roof.phases["decode"]
    assert decode.workload == RooflineWorkload(tokens=128, seqs=128, context_tokens=128 * 16 * 16)
    assert decode.step_s == pytest.approx(7.5e-3) and 0 < decode.bandwidth_share < 1
    (layer,) = roof.layers
    assert layer.layer == 0 and layer.phase == "decode" and layer.time_s == pytest.approx(7.5e-3 / 40)
    assert layer.bytes.weights == HAND_LAYER * 2 and not layer.above_peak
    assert not roof.above_peak
    text = render_roofline(s)
    assert text.startswith("  roofline      decode ") and "% of 4.81 TB/s" in text


def test_a_wrong_step_time_in_the_summary_is_flagged_and_rendered_as_a_problem() -> None:
    s = summarize(EngineFacts(workers=[_worker(2.46e-3, H200)]))
    roof = s.roofline
    assert roof.above_peak and roof.phases["decode"].bandwidth_share is None
    assert "the step time is wrong" in render_roofline(s)


def test_cpu_rates_are_shown_without_a_share_and_quantized_weights_use_the_measured_bytes() -> None:
    cpu = DevicePlace(device="cpu", type="cpu")
    s = summarize(EngineFacts(workers=[_worker(0.5, cpu, memory_bytes=HAND_WEIGHT_BYTES // 4)]))
    roof = s.roofline
    decode = roof.phases["decode"]
    assert decode.bytes_per_s > 0 and decode.bandwidth_share is None and not decode.above_peak
    assert roof.model.weights_source == "measured" and roof.notes
    # the measured bytes minus the untied embedding table the step does not read whole
    assert roof.model.weights_read_bytes == HAND_WEIGHT_BYTES // 4 - 525_336_576 * 2
    assert "peak unknown" in render_roofline(s)


def test_a_model_without_its_sizes_says_why() -> None:
    w = _worker(7.5e-3, H200)
    w.put("kv", KvCache(hf_config=HfShape(num_hidden_layers=2, moe=True)).to_json())
    w.put("memory", MemoryFacts(device="cuda:0", parameter_bytes=10**6, moe_layers=2, moe_experts=4).to_json())
    assert summarize(EngineFacts(workers=[w])).roofline == Roofline(
        available=False, reason="a mixture of experts whose config gives no expert count, top-k and expert MLP size"
    )
    w.put("kv", KvCache(hf_config=HfShape(num_hidden_layers=2)).to_json())
    assert "does not give hidden_size" in str(summarize(EngineFacts(workers=[w])).roofline.reason)


def test_the_html_report_shows_the_roofline_and_marks_a_rate_above_the_peak() -> None:
    from vllm_doctor.report.html import render_html

    ok = render_html(Report("t", profiles={"engine": summarize(EngineFacts(workers=[_worker(7.5e-3, H200)]))}))
    assert 'id="roofline"' in ok and "device NVIDIA H200: peak 4.81 TB/s (device: 2 x 6016 bits" in ok
    assert "989.5 TFLOP/s dense bf16" in ok and "<td>54 %</td>" in ok
    bad = render_html(Report("t", profiles={"engine": summarize(EngineFacts(workers=[_worker(2.46e-3, H200)]))}))
    assert '<td class="bad">rate above the device&#x27;s peak: the weights alone need 6.10 TB/s' in bad


def test_tops_model_panel_draws_a_roofline_line_that_fits_its_width() -> None:
    import dataclasses
    from pathlib import Path

    from vllm_doctor.live.record import ReplaySource
    from vllm_doctor.live.sources import model_summary
    from vllm_doctor.tui.panels import model_panel

    frame = ReplaySource(Path(__file__).resolve().parents[1] / "data" / "top" / "loaded.jsonl.gz").poll()

    def panel(step_s: float, width: int) -> list[str]:
        summary = model_summary(Report("t", profiles={"engine": summarize(EngineFacts(workers=[_worker(step_s, H200)]))}))
        return model_panel(dataclasses.replace(frame, model=summary), width).plain.splitlines()

    wide = [line for line in panel(7.5e-3, 96) if line.startswith("roofline ")]
    assert wide == ["roofline decode 54 % of 4.81 TB/s (2.58 TB/s: weights 15 GB + KV 4.31 GB)"]
    # the model panel at 160x48 has 51 columns: the bytes are left out, nothing is cut
    assert [line for line in panel(7.5e-3, 51) if line.startswith("roofline ")] == [
        "roofline decode 54 % of 4.81 TB/s (2.58 TB/s)"
    ]
    assert "roofline decode 7.85 TB/s: above peak, step time wrong" in panel(2.46e-3, 60)


# ---- a mixture of experts: the routed roofline -----------------------------------------------

# Mixtral-8x7B's sizes: 8 experts of 3 x 4096 x 14336 = 176,160,768 parameters each, top-2,
# a router of 4096 x 8 per layer, vocabulary 32000 (untied)
MIXTRAL = HfShape(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_size=4096,
                  intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False, model_type="mixtral",
                  moe=True, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336)
EXPERT_PARAMS = 3 * 4096 * 14336
# per layer: attention 41,943,040 (as Llama-3-8B's), two norms 8,192, the router 32,768
MIXTRAL_EVERY_STEP = 32 * (41_943_040 + 8_192 + 32_768) + 4_096 + 32000 * 4096  # + the LM head and final norm


def test_expected_distinct_experts_under_uniform_routing() -> None:
    assert expected_experts(8, 2, 1) == pytest.approx(2)  # one token: its top-k
    assert expected_experts(4, 2, 2) == pytest.approx(4 * (1 - 0.5**2))  # 3 of 4
    assert expected_experts(8, 2, 128) == pytest.approx(8)  # a prefill: all of them
    assert expected_experts(8, 2, 0) == 0 and expected_experts(0, 2, 5) == 0
    assert expected_experts(4, 6, 3) == pytest.approx(4)  # top-k above the count: all
    assert all(expected_experts(8, 2, t) < expected_experts(8, 2, t + 1) for t in range(1, 40))


def _moe_worker(memory: MemoryFacts) -> WorkerFacts:
    kv = KvCache(groups=[KvGroup(["l0"], KvSpec(type="FullAttentionSpec", block_size=16, dtype="torch.bfloat16"))],
                 hf_config=MIXTRAL, tensor_parallel_size=1)
    steps = [{"index": 0, "t": 0.0, "phase": "prefill", "prefill_tokens": 128, "prefill_reqs": 1, "total_tokens": 128,
              "kv_blocks_used": 8, "step_s": 0.05, "forward_s": 0.05, "layers_timed": True}]
    steps += [{"index": i, "t": 0.01 * i, "phase": "decode", "decode_tokens": 1, "decode_reqs": 1, "total_tokens": 1,
               "kv_blocks_used": 9, "step_s": 0.02, "forward_s": 0.02, "layers_timed": True} for i in range(1, 4)]
    layer = {"name": "model.layers.0", "kind": "layer", "layer": 0, "decode_calls": 3, "decode_s": 3 * 0.02 / 40}
    return WorkerFacts(rank=0, parts={
        "kv": kv.to_json(),
        "placement": Placement(device=H200, model_dtype="torch.bfloat16").to_json(),
        "memory": memory.to_json(),
        "anatomy": Anatomy(WorkerIdentity(rank=0, tensor_parallel_size=1)).to_json(),
        "profile": {"profiling": True, "clock": "cuda_events", "steps": steps, "layers": [layer]},
    })


def test_a_mixtral_decode_step_of_one_sequence_reads_two_experts_a_prefill_all_eight() -> None:
    roof = summarize(EngineFacts(workers=[_moe_worker(MemoryFacts(device="cuda:0"))])).roofline
    assert roof.available and roof.model.weights_source == "routed experts, config"
    experts = roof.model.experts
    assert experts is not None and (experts.moe_layers, experts.experts, experts.top_k) == (32, 8, 2)
    assert experts.expert_bytes == EXPERT_PARAMS * 2 and "uniform routing" in str(experts.assumption)
    # Mixtral-8x7B: 46.7 B parameters resident, 12.9 B active for one token (with its embedding row)
    assert 46.6e9 < roof.model.params < 46.8e9
    decode, prefill = roof.phases["decode"], roof.phases["prefill"]
    assert decode.routed_experts == pytest.approx(2) and prefill.routed_experts == pytest.approx(8, rel=1e-6)
    embedding_row = 4096 * 2
    assert decode.bytes.weights == pytest.approx((MIXTRAL_EVERY_STEP + 32 * 2 * EXPERT_PARAMS) * 2 + embedding_row)
    assert 12.8e9 < (decode.bytes.weights - embedding_row) / 2 + 32000 * 4096 < 13.0e9
    assert prefill.bytes.weights == pytest.approx((MIXTRAL_EVERY_STEP + 32 * 8 * EXPERT_PARAMS) * 2 + 128 * embedding_row)
    assert 0 < decode.bandwidth_share < 1 and not roof.above_peak  # 25 GB in 20 ms: about a quarter of the H200's
    # the FLOPs count the 2 experts each token runs, not all 8
    assert decode.flops.gemm == pytest.approx(2 * 32 * (41_943_040 + 2 * EXPERT_PARAMS))
    (layer,) = roof.layers
    assert layer.bytes.weights == pytest.approx((41_943_040 + 8_192 + 32_768 + 2 * EXPERT_PARAMS) * 2)
    text = render_roofline(summarize(EngineFacts(workers=[_moe_worker(MemoryFacts(device="cuda:0"))])))
    assert "routed experts" in text and "of 8 (top-2; prefill 8, decode 2)" in text and "uniform routing" in text


def test_the_routed_roofline_takes_one_experts_bytes_from_the_workers_fused_moe_parameters() -> None:
    # the worker holds the experts in FP8 (half the config's bf16 count): its bytes are used
    expert_bytes = 32 * 8 * EXPERT_PARAMS
    total = (MIXTRAL_EVERY_STEP + 32000 * 4096) * 2 + expert_bytes  # + the input embedding table
    mem = MemoryFacts(device="cuda:0", parameter_bytes=total, moe_layers=32, moe_experts=8,
                      expert_parameter_bytes=expert_bytes)
    roof = summarize(EngineFacts(workers=[_moe_worker(mem)])).roofline
    assert roof.model.weights_source == "routed experts, measured" and roof.model.experts.expert_bytes == EXPERT_PARAMS
    decode = roof.phases["decode"]
    assert decode.bytes.weights == pytest.approx((MIXTRAL_EVERY_STEP * 2 + 2 * 32 * EXPERT_PARAMS) + 4096 * 2)


def test_w8a8_gemms_are_held_to_the_8_bit_peak_weight_only_ones_to_the_models_dtype() -> None:
    """An FP8 W8A8 8B prefill on the H200 computes ~1.3 PFLOP/s: above the bf16 dense peak (989.5
    TFLOP/s), below the fp8 one (1,979). Seen on the H200 before the fix as "ABOVE the device's peak"."""
    import json
    from pathlib import Path

    from vllm_doctor.analysis.roofline import gemm_dtype
    from vllm_doctor.facts.quant import QuantFacts, QuantLayer

    assert device_peaks("NVIDIA H200", "cuda", None, None, "fp8").flops == 1979e12
    assert device_peaks("NVIDIA H200", "cuda", None, None, "int8").flops == 1979e12
    assert device_peaks("NVIDIA A100-SXM4-80GB", "cuda", None, None, "fp8").flops is None  # no fp8 tensor cores

    def worker(*layers: QuantLayer) -> WorkerFacts:
        w = WorkerFacts(rank=0)
        w.put("quant", QuantFacts(method="compressed-tensors", layers=list(layers)).to_json())
        return w

    fp8 = QuantLayer(name="model.layers.0.mlp.down_proj", method="CompressedTensorsLinearMethod",
                     scheme="CompressedTensorsW8A8Fp8", quantized=True)  # fmt: skip
    int8 = QuantLayer(name="model.layers.0.mlp.down_proj", method="CompressedTensorsLinearMethod",
                      scheme="CompressedTensorsW8A8Int8", quantized=True)  # fmt: skip
    native = QuantLayer(name="model.layers.0.mlp.down_proj", method="Fp8LinearMethod", quantized=True)
    lm_head = QuantLayer(name="lm_head", method="UnquantizedLinearMethod", quantized=False)
    assert gemm_dtype(worker(fp8, lm_head)) == "fp8" and gemm_dtype(worker(native)) == "fp8"
    assert gemm_dtype(worker(int8, lm_head)) == "int8"
    assert gemm_dtype(worker(fp8, int8)) is None  # mixed: no single 8-bit column
    recorded = Path(__file__).resolve().parents[1] / "data" / "quant" / "quant-w4a16.doctor_quant.json"
    w4a16 = WorkerFacts(rank=0)
    w4a16.put("quant", json.loads(recorded.read_text()))
    assert gemm_dtype(w4a16) is None  # weight-only: the GEMMs run in the model's dtype
    assert gemm_dtype(WorkerFacts(rank=0)) is None
