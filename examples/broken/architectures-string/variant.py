"""config.json architectures is a string, not a list."""

EXPECT_CODE = "VD108"
ENGINE_MODE = "inprocess"
DESCRIPTION = "config.json architectures is the string 'TinyDoctorForCausalLM', not a list"


def apply(ctx):
    ctx.config["architectures"] = "TinyDoctorForCausalLM"
