"""load_weights skips the router: a filter meant for something else drops every
`block_sparse_moe.gate.weight`. The router keeps the memory it was created with, and the
parameter is not in the returned set."""

EXPECT_CODE = "VD301"  # block_sparse_moe.gate.weight of each layer never filled (and VD302)
ENGINE_MODE = "inprocess"
DESCRIPTION = "load_weights never loads block_sparse_moe.gate.weight (the router)"


def apply(ctx):
    ctx.edit(
        "model.py",
        '            if "rotary_emb.inv_freq" in name:\n                continue\n',
        '            if "rotary_emb.inv_freq" in name or name.endswith(".gate.weight"):\n'
        "                continue\n",
    )
