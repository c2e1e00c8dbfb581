"""config.json's hybrid_override_pattern has a letter the model does not know ('X' at layer 2)."""

EXPECT_CODE = "VD215"  # hybrid_override_pattern[2] = 'X'
ENGINE_MODE = "inprocess"
DESCRIPTION = "hybrid_override_pattern 'M*X-': a layer kind the model does not build"


def apply(ctx):
    ctx.config["hybrid_override_pattern"] = "M*X-"
