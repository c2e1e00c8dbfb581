"""load_weights sends layer 1's k_proj into the "v" shard of qkv_proj and v_proj into "k"
(same shapes, so no error). Layer 0 is right; layer 1 computes something else."""

EXPECT_CODE = None
ENGINE_MODE = "inprocess"
DESCRIPTION = "load_weights swaps the k and v shards of layer 1's qkv_proj"
EXPECT_FIRST_DIVERGENT_LAYER = 1


def apply(ctx):
    ctx.edit(
        "model.py",
        "                param.weight_loader(param, loaded_weight, shard_id)\n",
        '                if ".layers.1." in name and shard_id in ("k", "v"):\n'
        '                    shard_id = "v" if shard_id == "k" else "k"\n'
        "                param.weight_loader(param, loaded_weight, shard_id)\n",
    )
