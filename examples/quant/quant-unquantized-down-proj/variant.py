"""One projection is built without quant_config: down_proj of every layer stays an unquantized
(bfloat16) RowParallelLinear while the checkpoint holds int8 `down_proj.weight` + float32
`down_proj.weight_scale`, as every other projection's."""

EXPECT_CODE = "VD314"  # tests/unit/test_quant_checks_replies.py
ENGINE_MODE = "inprocess"
DESCRIPTION = "down_proj built without quant_config in a W8A8 int8 checkpoint"


def apply(ctx):
    ctx.edit(
        "model.py",
        "            output_size=hidden_size,\n            bias=False,\n            quant_config=quant_config,\n",
        "            output_size=hidden_size,\n            bias=False,\n",
    )
