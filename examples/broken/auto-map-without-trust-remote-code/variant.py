"""config.json has auto_map to a config class shipped in the model dir; no trust_remote_code."""

EXPECT_CODE = "VD105"
ENGINE_MODE = "inprocess"
DESCRIPTION = "auto_map AutoConfig in config.json, no AutoConfig.register, no trust_remote_code"


def apply(ctx):
    ctx.edit(
        "__init__.py",
        "    from transformers import AutoConfig\n\n"
        "    from .configuration import TinyDoctorConfig\n\n"
        '    AutoConfig.register("tiny_doctor", TinyDoctorConfig, exist_ok=True)\n\n',
        "",
    )
    ctx.config["auto_map"] = {"AutoConfig": "configuration_tiny_doctor.TinyDoctorConfig"}
    ctx.copy_to_model_dir("configuration_tiny_doctor.py")
