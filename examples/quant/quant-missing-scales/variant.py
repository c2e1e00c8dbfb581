"""The checkpoint lacks every `weight_scale` of layer 1 (q/k/v/o/gate/up/down): the int8 weights
are there, their per-channel scales are not (e.g. a conversion script that wrote the scales of
one layer under another name, or dropped a shard)."""

EXPECT_CODE = "VD315"  # tests/unit/test_quant_checks_replies.py
ENGINE_MODE = "inprocess"
DESCRIPTION = "W8A8 int8 checkpoint without the weight_scale tensors of layer 1"
MISSING_LAYER = 1


def apply(ctx):
    prefix = f"model.layers.{MISSING_LAYER}."
    missing = [n for n in ctx.weights if n.startswith(prefix) and n.endswith(".weight_scale")]
    assert len(missing) == 7, missing
    for name in missing:
        del ctx.weights[name]
