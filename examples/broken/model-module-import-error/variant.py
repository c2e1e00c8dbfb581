"""The lazily registered model module cannot be imported (a typo in a vLLM import)."""

EXPECT_CODE = "VD106"
ENGINE_MODE = "inprocess"
DESCRIPTION = "model.py imports vllm.model_executor.layers.layer_norm (no such module)"


def apply(ctx):
    ctx.edit(
        "model.py",
        "from vllm.model_executor.layers.layernorm import RMSNorm",
        "from vllm.model_executor.layers.layer_norm import RMSNorm",
    )
