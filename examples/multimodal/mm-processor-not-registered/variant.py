"""The model class lost its `@MULTIMODAL_REGISTRY.register_processor(...)` decorator."""

EXPECT_CODE = None  # no check yet (issue 32, step 2)
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "no @MULTIMODAL_REGISTRY.register_processor on the model class: vLLM runs it text-only"
)


def apply(ctx):
    ctx.edit(
        "model.py",
        "@MULTIMODAL_REGISTRY.register_processor(\n"
        "    TinyDoctorVLMultiModalProcessor,\n"
        "    info=TinyDoctorVLProcessingInfo,\n"
        "    dummy_inputs=TinyDoctorVLDummyInputsBuilder,\n"
        ")\n"
        "class TinyDoctorVLForConditionalGeneration(",
        "class TinyDoctorVLForConditionalGeneration(",
    )
