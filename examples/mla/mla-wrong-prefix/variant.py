"""The port passes ``prefix=f"{prefix}.attn"`` to vLLM's MLA wrapper, as it would to an
``Attention``: the wrapper adds ``.attn`` itself, so each layer's MLAAttention registers in vLLM's
forward context as ``model.layers.N.self_attn.attn.attn``, a name that is no place in the model (it
sits at ``model.layers.N.self_attn.mla_attn.mla_attn``)."""

EXPECT_CODE = "VD208"  # model.layers.0.self_attn.attn.attn sits at model.layers.0.self_attn.mla_attn.mla_attn
ENGINE_MODE = "inprocess"
DESCRIPTION = 'TinyMlaAttention passes prefix=f"{prefix}.attn" to MultiHeadLatentAttentionWrapper'


def apply(ctx):
    ctx.edit("model.py", "            prefix=prefix,\n", '            prefix=f"{prefix}.attn",\n')
