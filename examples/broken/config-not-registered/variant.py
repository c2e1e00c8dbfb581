"""The plugin never registers its config class with transformers."""

EXPECT_CODE = "VD104"
ENGINE_MODE = "inprocess"
DESCRIPTION = "plugin registers the model but not TinyDoctorConfig: model_type unknown"


def apply(ctx):
    ctx.edit(
        "__init__.py",
        "    from transformers import AutoConfig\n\n"
        "    from .configuration import TinyDoctorConfig\n\n"
        '    AutoConfig.register("tiny_doctor", TinyDoctorConfig, exist_ok=True)\n\n',
        "",
    )
