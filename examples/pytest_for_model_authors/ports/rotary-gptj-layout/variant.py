"""The port applies rotary embeddings in the GPT-J (interleaved) layout; the checkpoint was
trained with the NeoX / rotate-half layout Llama uses. Loads and runs; every layer differs
from position 1 on (position 0 is not rotated)."""

EXPECT_CODE = None
ENGINE_MODE = "inprocess"
DESCRIPTION = "get_rope(..., is_neox_style=False): rotary in the GPT-J layout instead of NeoX"
EXPECT_FIRST_DIVERGENT_LAYER = 0


def apply(ctx):
    ctx.edit(
        "model.py",
        "            max_position=config.max_position_embeddings,\n",
        "            max_position=config.max_position_embeddings,\n            is_neox_style=False,\n",
    )
