"""The plugin registers the model but does not tell vLLM that its model_type uses MLA (no
convertor in ``MODEL_ARCH_CONFIG_CONVERTORS``, see tiny_mla_model/arch.py). vLLM decides MLA from a
fixed list of model types, so for ``tiny_doctor_mla`` it reads the head size as hidden_size /
num_attention_heads (32), not the latent's 512 + 64: the MLA layers are built, the engine starts,
and the first request fails."""

EXPECT_CODE = "VD216"  # model.layers.0.self_attn.mla_attn.mla_attn: vLLM reads the model as no MLA model
ENGINE_MODE = "inprocess"
DESCRIPTION = "the plugin builds MLA layers but does not register its model_type as MLA with vLLM"


def apply(ctx):
    ctx.edit("__init__.py", '    register_mla_model_type("tiny_doctor_mla")\n', "")
