"""The class declares IsHybrid but does not give the Mamba state's shapes
(`get_mamba_state_shape_from_config`): vLLM's page size computation iterates over None
(vLLM 0.32: `TypeError: 'NoneType' object is not iterable` in kv_cache_interface)."""

EXPECT_CODE = "VD214"  # get_mamba_state_shape_from_config missing
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyHybridForCausalLM declares IsHybrid without get_mamba_state_shape_from_config"


def apply(ctx):
    ctx.edit(
        "model.py",
        "    @classmethod\n    def get_mamba_state_shape_from_config(",
        "    @classmethod\n    def mamba_state_shape(",
    )
