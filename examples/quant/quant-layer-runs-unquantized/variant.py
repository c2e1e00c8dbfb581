"""o_proj is built without quant_config, and `load_weights` skips checkpoint tensors the model has
no parameter for (`if name not in params_dict: continue`, a habit copied from vLLM's own models,
which skip rotary buffers and pipeline-parallel leftovers that way). The engine loads and runs:
each layer's o_proj is a bfloat16 RowParallelLinear (UnquantizedLinearMethod) that received the
checkpoint's int8 `o_proj.weight` cast to bfloat16 (integers up to 127, no scale), and the
`o_proj.weight_scale` tensors are skipped without a word."""

EXPECT_CODE = None  # an engine-stage check: VD407 (tests/engine/test_moe_quant_ground_truth.py)
ENGINE_MODE = "inprocess"
DESCRIPTION = "o_proj built without quant_config, load_weights skips the scales it has no parameter for"


def apply(ctx):
    ctx.edit(
        "model.py",
        "            output_size=config.hidden_size,\n            bias=False,\n"
        '            quant_config=vllm_config.quant_config,\n            prefix=f"{prefix}.o_proj",\n',
        '            output_size=config.hidden_size,\n            bias=False,\n            prefix=f"{prefix}.o_proj",\n',
    )
    ctx.edit(
        "model.py",
        "            else:\n                param = params_dict[name]\n",
        "            else:\n"
        "                if name not in params_dict:\n"
        "                    continue  # nothing of the model's to load it into\n"
        "                param = params_dict[name]\n",
    )
