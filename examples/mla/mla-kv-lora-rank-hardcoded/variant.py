"""The port copies DeepSeek-V2's latent width (``kv_lora_rank = 512``) into its attention; the
model's config.json (and checkpoint) has a latent of 256. The layer builds its projections and its
latent cache 512 wide."""

import torch

EXPECT_CODE = "VD216"  # model.layers.0.self_attn.mla_attn.mla_attn: kv_lora_rank 512 (config.json: 256)
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyMlaAttention hard-codes kv_lora_rank = 512; config.json's kv_lora_rank is 256"

RANK = 256


def apply(ctx):
    ctx.edit(
        "model.py",
        "        self.kv_lora_rank = config.kv_lora_rank\n",
        "        self.kv_lora_rank = 512  # DeepSeek-V2's\n",
    )
    old, rope = ctx.config["kv_lora_rank"], ctx.config["qk_rope_head_dim"]
    ctx.config["kv_lora_rank"] = RANK
    # the checkpoint of a model with a latent of 256: the first 256 latent values of each tensor
    for i in range(ctx.config["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        w = ctx.weights[p + "kv_a_proj_with_mqa.weight"]
        ctx.weights[p + "kv_a_proj_with_mqa.weight"] = torch.cat([w[:RANK], w[old : old + rope]]).contiguous()
        ctx.weights[p + "kv_a_layernorm.weight"] = ctx.weights[p + "kv_a_layernorm.weight"][:RANK].contiguous()
        ctx.weights[p + "kv_b_proj.weight"] = ctx.weights[p + "kv_b_proj.weight"][:, :RANK].contiguous()
