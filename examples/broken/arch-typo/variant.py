"""config.json names an architecture that nothing registers (a one-letter typo)."""

EXPECT_CODE = "VD101"
ENGINE_MODE = "inprocess"
DESCRIPTION = "config.json architectures has a typo: TinyDoctorForCausalLm"


def apply(ctx):
    ctx.config["architectures"] = ["TinyDoctorForCausalLm"]
