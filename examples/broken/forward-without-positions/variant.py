"""forward() takes position_ids (HF name) instead of vLLM's positions."""

EXPECT_CODE = "VD203"
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyDoctorForCausalLM.forward(input_ids, position_ids, ...): no positions"


def apply(ctx):
    ctx.edit(
        "model.py",
        "        positions: torch.Tensor,\n"
        "        intermediate_tensors: IntermediateTensors | None = None,\n",
        "        position_ids: torch.Tensor,\n"
        "        intermediate_tensors: IntermediateTensors | None = None,\n",
    )
    ctx.edit(
        "model.py",
        "return self.model(input_ids, positions, inputs_embeds)",
        "return self.model(input_ids, position_ids, inputs_embeds)",
    )
