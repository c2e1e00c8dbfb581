"""The plugin registers its class under a built-in architecture name."""

EXPECT_CODE = "VD110"
ENGINE_MODE = "inprocess"
DESCRIPTION = "plugin registers TinyDoctorForCausalLM as LlamaForCausalLM (shadows the built-in)"


def apply(ctx):
    ctx.edit(
        "__init__.py",
        'ModelRegistry.register_model(\n        "TinyDoctorForCausalLM",',
        'ModelRegistry.register_model(\n        "LlamaForCausalLM",',
    )
    ctx.config["architectures"] = ["LlamaForCausalLM"]
