"""embed_input_ids takes the image embeddings and ignores them."""

EXPECT_CODE = "VD212"
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "embed_input_ids() accepts multimodal_embeddings and is_multimodal but returns the token "
    "embeddings only: the image placeholders keep the <image> token's embedding"
)


def apply(ctx):
    ctx.edit(
        "model.py",
        "        inputs_embeds = self.language_model.model.embed_tokens(input_ids)\n"
        "        if multimodal_embeddings is None or len(multimodal_embeddings) == 0:\n"
        "            return inputs_embeds\n"
        "        assert is_multimodal is not None\n"
        "        image_embeds = torch.cat(list(multimodal_embeddings)).to(inputs_embeds.dtype)\n"
        "        inputs_embeds[is_multimodal] = image_embeds\n"
        "        return inputs_embeds\n",
        "        # copied from the text model: the image embeddings are never written in\n"
        "        return self.language_model.model.embed_tokens(input_ids)\n",
    )
