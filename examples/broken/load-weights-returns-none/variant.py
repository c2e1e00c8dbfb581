"""load_weights returns None instead of the set of loaded parameter names."""

EXPECT_CODE = "VD205"
ENGINE_MODE = "inprocess"
DESCRIPTION = "load_weights() -> None: vLLM's missing-weight check is skipped"


def apply(ctx):
    ctx.edit(
        "model.py",
        "weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:",
        "weights: Iterable[tuple[str, torch.Tensor]]) -> None:",
    )
    ctx.edit(
        "model.py",
        "            loaded_params.add(name)\n        return loaded_params\n",
        "            loaded_params.add(name)\n",
    )
