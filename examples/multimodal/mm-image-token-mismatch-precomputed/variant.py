"""mm-image-token-mismatch in a processor that states its token count up front."""

EXPECT_CODE = None  # no check yet (issue 32, step 2)
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "config.json image_token_index 32000 vs the tokenizer's <image> 3, and the processing info "
    "returns get_mm_max_tokens_per_item (vLLM's start-up speed-up): no dummy input is processed "
    "at engine start, the mismatch surfaces at the first image request"
)


def apply(ctx):
    assert ctx.config["image_token_index"] == 3
    ctx.config["image_token_index"] = 32000
    ctx.edit(
        "processing.py",
        "        return (config.vision_image_size // config.vision_patch_size) ** 2\n",
        "        return (config.vision_image_size // config.vision_patch_size) ** 2\n"
        "\n"
        "    def get_mm_max_tokens_per_item(\n"
        "        self, seq_len: int, mm_counts: Mapping[str, int]\n"
        "    ) -> Mapping[str, int]:\n"
        '        return {"image": self.get_num_image_tokens()}\n',
    )
