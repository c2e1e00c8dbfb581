"""The model class does not derive from `SupportsMultiModal`."""

EXPECT_CODE = None  # no check yet (issue 32, step 2)
ENGINE_MODE = "inprocess"
DESCRIPTION = "the model class is not a SupportsMultiModal: vLLM treats it as a text model"


def apply(ctx):
    ctx.edit(
        "model.py",
        "class TinyDoctorVLForConditionalGeneration(nn.Module, SupportsMultiModal):",
        "class TinyDoctorVLForConditionalGeneration(nn.Module):",
    )
