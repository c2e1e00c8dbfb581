"""The checkpoint uses the transformers >= 4.52 LLaVA layout; the mapper maps only its text part."""

EXPECT_CODE = "VD313"  # vision_tower and multi_modal_projector, with the mapper entry
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "checkpoint re-saved with model.vision_tower.* / model.multi_modal_projector.* / "
    "model.language_model.* / lm_head.*; hf_to_vllm_mapper maps only the language model's names"
)

RENAMES = {
    "language_model.model.": "model.language_model.",
    "language_model.lm_head.": "lm_head.",
    "vision_tower.": "model.vision_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
}


def _renamed(name):
    for old, new in RENAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    raise ValueError(f"unexpected tensor {name}")


def apply(ctx):
    ctx.weights = {_renamed(name): tensor for name, tensor in ctx.weights.items()}
    ctx.edit(
        "model.py",
        '            "model.vision_tower.": "vision_tower.",\n'
        '            "model.multi_modal_projector.": "multi_modal_projector.",\n',
        "",
    )
