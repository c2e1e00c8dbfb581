"""The plugin registers the class under the model_type string, not the architecture name."""

EXPECT_CODE = "VD103"
ENGINE_MODE = "inprocess"
DESCRIPTION = "register_model('tiny_doctor', ...) while config.json says TinyDoctorForCausalLM"


def apply(ctx):
    ctx.edit(
        "__init__.py",
        'ModelRegistry.register_model(\n        "TinyDoctorForCausalLM",',
        'ModelRegistry.register_model(\n        "tiny_doctor",',
    )
