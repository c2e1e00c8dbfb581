"""The image encoder method still has its pre-rename name, get_multimodal_embeddings."""

EXPECT_CODE = "VD212"
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "the vision encoder is get_multimodal_embeddings() (vLLM's name before the rename to "
    "embed_multimodal): vLLM calls SupportsMultiModal's empty embed_multimodal, which returns None"
)


def apply(ctx):
    ctx.edit(
        "model.py",
        "    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings:",
        "    def get_multimodal_embeddings(self, **kwargs: object) -> MultiModalEmbeddings:",
    )
