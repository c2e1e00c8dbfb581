"""config.json's image_token_index is not the tokenizer's `<image>` id."""

EXPECT_CODE = None  # no check yet (issue 32, step 2)
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "config.json image_token_index 32000 (LLaVA-1.5's, copied over) while the tokenizer's "
    "<image> is 3: the processor's prompt replacement targets a token the prompt never has"
)


def apply(ctx):
    assert ctx.config["image_token_index"] == 3
    ctx.config["image_token_index"] = 32000
