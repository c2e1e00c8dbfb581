"""Which layers run quantized (doctor_quant): the summary, VD407 and the roofline's quantized bytes,
read from replies recorded from vLLM 0.32's CPU engine (tests/data/quant/*.doctor_quant.json:
quant-ok and quant-w4a16 of examples/make_examples.py --quant). The real engine runs are in
tests/engine/test_quant_engine.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_doctor.analysis.quant import quant_summary
from vllm_doctor.analysis.roofline import quantized_weights
from vllm_doctor.checks import run_checks
from vllm_doctor.facts.engine import EngineFacts, WorkerFacts
from vllm_doctor.facts.quant import QuantFacts, QuantLayer
from vllm_doctor.model import Outcome

DATA = Path(__file__).resolve().parents[1] / "data" / "quant"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.doctor_quant.json").read_text())


def facts_of(reply: dict[str, Any]) -> EngineFacts:
    return EngineFacts(workers=[WorkerFacts(rank=0, parts={"quant": reply})])


def test_the_summary_of_quant_ok_names_the_scheme_the_storage_and_the_ignored_lm_head() -> None:
    s = quant_summary(QuantFacts.of(recorded("quant-ok")))
    assert s is not None
    assert (s.method, s.linear_layers, s.quantized_linear_layers) == ("compressed-tensors", 8, 8)
    (g,) = s.groups
    # the CPU kernel (oneDNN) took the int8 weights out of the modules: bytes from shape x bits
    assert (g.method, g.weight_dtype, g.weight_bytes, g.in_kernel) == ("W8A8Int8", "int8", 294912, True)
    assert [(x.name, x.kind, x.ignored) for x in s.unquantized] == [("lm_head", "lm_head", True)]
    assert s.text == (
        "compressed-tensors W8A8Int8 on 8 of 8 linear layers (int8 weights, 295 kB + 16.4 kB of scales, held by "
        "vLLM's CPU kernel: bytes from shape x bits); lm_head unquantized (ignored by the config)"
    )


def test_packed_int4_weights_read_as_int4() -> None:
    s = quant_summary(QuantFacts.of(recorded("quant-w4a16")))
    assert s is not None
    (g,) = s.groups
    assert (g.method, g.weight_dtype, g.weight_bytes, g.in_kernel) == ("WNA16", "int4 packed in int32", 147456, False)


def test_no_quantization_config_no_summary() -> None:
    assert quant_summary(QuantFacts()) is None
    (f,) = run_checks(facts_of(QuantFacts().to_json()), ["VD407"])
    assert f.outcome == Outcome.NOT_APPLICABLE


def test_vd407_passes_quant_ok() -> None:
    (f,) = run_checks(facts_of(recorded("quant-ok")), ["VD407"])
    assert f.outcome == Outcome.PASS
    assert f.message == "8 of 8 linear layers run compressed-tensors W8A8Int8"


def unquantize(reply: dict[str, Any], leaf: str) -> dict[str, Any]:
    """The reply with ``leaf`` built without quant_config (what vLLM reports for such a layer)."""
    out = copy.deepcopy(reply)
    for layer in out["layers"]:
        if layer["name"].endswith("." + leaf):
            layer.update(method="UnquantizedLinearMethod", scheme=None, quantized=False,
                         weight_dtype="torch.bfloat16", weight_bits=None, weight_in_kernel=False)
    return out


def test_vd407_names_the_layers_their_dtype_and_the_method_the_others_run() -> None:
    (f,) = run_checks(facts_of(unquantize(recorded("quant-ok"), "o_proj")), ["VD407"])
    assert f.outcome == Outcome.FAIL
    assert f.message == (
        "2 of 8 linear layers run unquantized (UnquantizedLinearMethod, bfloat16 weights) while 6 run "
        "compressed-tensors W8A8Int8, and the config's ignore list ['lm_head'] does not name them: "
        "model.layers.0.self_attn.o_proj, model.layers.1.self_attn.o_proj"
    )
    assert f.subject == "rank 0 / model.layers.0.self_attn.o_proj"
    assert f.evidence["layers"] == ["model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"]


@pytest.mark.parametrize(
    ("ignore", "flagged"),
    [
        (["lm_head", "o_proj"], 0),  # a leaf name
        (["lm_head", "re:.*self_attn\\.o_proj$"], 0),  # compressed-tensors' regex form
        (["lm_head", "model.layers.0.self_attn.o_proj"], 1),  # one path: the other layer stays flagged
    ],
)
def test_vd407_leaves_out_what_the_ignore_list_names(ignore: list[str], flagged: int) -> None:
    reply = unquantize(recorded("quant-ok"), "o_proj") | {"ignore": ignore}
    q = QuantFacts.of(reply)
    assert len(q.unexpected_unquantized()) == flagged


def test_a_fused_layer_is_ignored_only_when_every_shard_is() -> None:
    q = QuantFacts(method="compressed-tensors", ignore=["q_proj", "k_proj"])
    qkv = QuantLayer(name="model.layers.0.self_attn.qkv_proj", kind="linear", shards=["q_proj", "k_proj", "v_proj"])
    assert not q.ignored(qkv)
    assert QuantFacts(method="x", ignore=["q_proj", "k_proj", "v_proj"]).ignored(qkv)


def test_the_roofline_counts_the_weights_the_cpu_kernel_holds() -> None:
    worker = WorkerFacts(rank=0, parts={"quant": recorded("quant-ok")})
    held, text = quantized_weights(worker)
    assert held == 294912
    assert text == (
        "int8 (compressed-tensors W8A8Int8) in 8 of 8 linear layers, 295 kB + 16.4 kB of scales (295 kB held by "
        "vLLM's CPU kernel, counted from shape x bits); the other weights bfloat16"
    )
    assert quantized_weights(WorkerFacts(rank=0)) == (0, None)
