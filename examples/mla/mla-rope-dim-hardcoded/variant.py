"""The port copies DeepSeek-V2's rotary key width (``qk_rope_head_dim = 64``) into its attention;
the model's config.json (and checkpoint) has a rope dim of 32. The layer builds its query
projection, its latent projection and its cache for 64."""

EXPECT_CODE = "VD216"  # model.layers.0.self_attn.mla_attn.mla_attn: qk_rope_head_dim 64 (config.json: 32)
ENGINE_MODE = "inprocess"
DESCRIPTION = "TinyMlaAttention hard-codes qk_rope_head_dim = 64; config.json's qk_rope_head_dim is 32"

ROPE = 32


def apply(ctx):
    ctx.edit(
        "model.py",
        "        self.qk_rope_head_dim = config.qk_rope_head_dim\n",
        "        self.qk_rope_head_dim = 64  # DeepSeek-V2's\n",
    )
    cfg = ctx.config
    rank, nope, old = cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    cfg["qk_rope_head_dim"] = ROPE
    # the checkpoint of a model with a rope dim of 32: each query head's nope part and first 32
    # rotary values, the latent and the first 32 rotary key values
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        q = ctx.weights[p + "q_proj.weight"].view(heads, nope + old, hidden)
        ctx.weights[p + "q_proj.weight"] = q[:, : nope + ROPE].reshape(heads * (nope + ROPE), hidden).contiguous()
        kv_a = ctx.weights[p + "kv_a_proj_with_mqa.weight"]
        ctx.weights[p + "kv_a_proj_with_mqa.weight"] = kv_a[: rank + ROPE].contiguous()
