"""Layer 1's input RMSNorm uses a hard-coded epsilon instead of config.rms_norm_eps (1e-5).
Same greedy tokens as the reference; the logprob values and layer 1's output differ."""

EXPECT_CODE = None
ENGINE_MODE = "inprocess"
DESCRIPTION = "layer 1's input_layernorm has eps=1e-3 instead of config.rms_norm_eps (1e-5)"
EXPECT_FIRST_DIVERGENT_LAYER = 1


def apply(ctx):
    ctx.edit(
        "model.py",
        "        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n",
        "        self.input_layernorm = RMSNorm(\n"
        '            config.hidden_size, eps=1e-3 if prefix.endswith(".layers.1") else config.rms_norm_eps\n'
        "        )\n",
    )
