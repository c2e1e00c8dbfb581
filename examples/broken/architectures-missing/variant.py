"""config.json has no architectures entry at all."""

EXPECT_CODE = "VD108"
ENGINE_MODE = "inprocess"
DESCRIPTION = "config.json without architectures"


def apply(ctx):
    del ctx.config["architectures"]
