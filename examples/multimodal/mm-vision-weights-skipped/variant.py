"""load_weights drops the vision tower's tensors and returns None."""

EXPECT_CODE = "VD313"  # the vision tower, once (VD301/VD302 defer to it)
ENGINE_MODE = "inprocess"
DESCRIPTION = (
    "load_weights() filters out vision_tower.* and returns None: vLLM's missing-weight check is "
    "off, the vision tower keeps its construction-time values"
)


def apply(ctx):
    ctx.edit(
        "model.py",
        "weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:\n"
        "        loader = AutoWeightsLoader(self)\n"
        "        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)\n",
        "weights: Iterable[tuple[str, torch.Tensor]]) -> None:\n"
        "        loader = AutoWeightsLoader(self)\n"
        '        text_and_projector = ((n, w) for n, w in weights if not n.startswith("vision_tower."))\n'
        "        loader.load_weights(text_and_projector, mapper=self.hf_to_vllm_mapper)\n",
    )
