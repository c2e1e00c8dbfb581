"""The vllm.general_plugins entry point names a function that does not exist."""

EXPECT_CODE = "VD109"
ENGINE_MODE = "inprocess"
DESCRIPTION = "entry point tiny_doctor = <package>:regsiter (typo): the plugin never loads"


def apply(ctx):
    ctx.entry_points["tiny_doctor"] = f"{ctx.package}:regsiter"
