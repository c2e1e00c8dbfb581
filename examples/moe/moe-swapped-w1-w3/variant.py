"""The expert params mapping is built with the gate and up projections swapped: every expert's
w1 (gate) lands in the up half of w13_weight and w3 (up) in the gate half. Same shapes, so
nothing fails; silu is applied to the wrong projection."""

EXPECT_CODE = "VD312"  # experts.<e>.w1 loaded as shard w3 and w3 as w1
ENGINE_MODE = "inprocess"
DESCRIPTION = "fused_moe_make_expert_params_mapping called with w1 and w3 swapped (gate <-> up)"


def apply(ctx):
    ctx.edit(
        "model.py",
        '            ckpt_gate_proj_name="w1",\n'
        '            ckpt_down_proj_name="w2",\n'
        '            ckpt_up_proj_name="w3",\n',
        '            ckpt_gate_proj_name="w3",\n'
        '            ckpt_down_proj_name="w2",\n'
        '            ckpt_up_proj_name="w1",\n',
    )
