"""The checkpoint lacks all three tensors of one expert (layer 1, expert 3), e.g. a conversion
script that wrote range(num_experts - 1). The experts' parameters are fused ([experts, ...]), so
the parameter counts as loaded once any expert filled it: vLLM's missing-weight check cannot see
the hole."""

EXPECT_CODE = "VD311"  # layer 1, expert 3: w1, w3, w2 never loaded
ENGINE_MODE = "inprocess"
DESCRIPTION = "checkpoint without layer 1's expert 3 (w1, w2, w3)"
MISSING_LAYER = 1
MISSING_EXPERT = 3


def apply(ctx):
    prefix = f"model.layers.{MISSING_LAYER}.block_sparse_moe.experts.{MISSING_EXPERT}."
    for proj in ("w1", "w2", "w3"):
        del ctx.weights[f"{prefix}{proj}.weight"]
