"""The model class has get_input_embeddings (older name) and no embed_input_ids."""

EXPECT_CODE = "VD206"
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyDoctorForCausalLM.get_input_embeddings, no embed_input_ids"


def apply(ctx):
    ctx.edit(
        "model.py",
        "    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:\n"
        "        return self.model.embed_input_ids(input_ids)\n",
        "    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:\n"
        "        return self.model.embed_input_ids(input_ids)\n",
    )
