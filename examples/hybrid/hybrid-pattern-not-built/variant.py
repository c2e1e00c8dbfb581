"""config.json's pattern says layer 1 is attention ('*'); the model's table builds a Mamba mixer
for '*' (a copy-paste slip). With the checkpoint vLLM fails to load the attention weights into the
Mamba layer; with dummy weights it runs a different model than the checkpoint describes."""

EXPECT_CODE = "VD215"  # model.layers.1: pattern '*' (attention), built MambaMixer2
ENGINE_MODE = "inprocess"
DESCRIPTION = "the model builds a Mamba 2 mixer where hybrid_override_pattern says attention"


def apply(ctx):
    ctx.edit(
        "model.py",
        'LAYERS = {"M": TinyHybridMamba, "*": TinyHybridAttention, "-": TinyHybridMLP}',
        'LAYERS = {"M": TinyHybridMamba, "*": TinyHybridMamba, "-": TinyHybridMLP}',
    )
