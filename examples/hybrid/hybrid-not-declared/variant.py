"""The class leaves out `IsHybrid`: vLLM does not size a Mamba state cache for it, and the
first Mamba mixer that asks for its cache spec trips a bare `assert mamba_block_size is not None`
(vLLM 0.32, KV-cache set-up)."""

EXPECT_CODE = "VD214"  # the Mamba mixers at model.layers.0.mixer, model.layers.2.mixer need IsHybrid
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyHybridForCausalLM has Mamba 2 mixers and attention but does not declare IsHybrid"


def apply(ctx):
    ctx.edit(
        "model.py",
        "class TinyHybridForCausalLM(nn.Module, HasInnerState, IsHybrid):",
        "class TinyHybridForCausalLM(nn.Module, HasInnerState):",
    )
