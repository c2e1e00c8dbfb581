"""A GPTQ checkpoint (quant_method gptq, 4 bits, groups of 64, desc_act false: qweight, qzeros,
scales, g_idx per projection, named as HF Llama names them: `model.layers.N.mlp.down_proj`) and a
model that calls its MLP `feed_forward` (its load_weights renames `.mlp.` to `.feed_forward.`).
Every layer gets quant_config; vLLM's GPTQ decides which layers are quantized by module NAME
(the checkpoint's quantized modules, `modules_in_block_to_quantize`), and the MLP's names match
none of them."""

EXPECT_CODE = "VD317"  # tests/unit/test_quant_checks_replies.py
ENGINE_MODE = "inprocess"
DESCRIPTION = "GPTQ checkpoint whose module names (mlp.*) differ from the model's (feed_forward.*)"
GROUP_SIZE = 64
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": GROUP_SIZE, "desc_act": False, "sym": True}


def gptq_tensors(weight, group_size=GROUP_SIZE):
    """GPTQ's tensors of one float [out, in] weight (4 bits, symmetric, no act-order): qweight
    int32 [in / 8, out], qzeros int32 [in / group, out / 8], scales float16 [in / group, out],
    g_idx int32 [in]."""
    import torch

    w = weight.float().t().contiguous()  # [in, out]
    inp, out = w.shape
    groups = w.view(inp // group_size, group_size, out)
    scales = (groups.abs().amax(dim=1) / 7.0).clamp(min=1e-8)  # [in / group, out]
    q = (torch.round(groups / scales[:, None, :]).clamp(-8, 7) + 8).to(torch.int32).view(inp, out)
    qweight = torch.zeros(inp // 8, out, dtype=torch.int32)
    for i in range(8):
        qweight |= (q[i::8] & 0xF) << (4 * i)
    qzeros = torch.zeros(inp // group_size, out // 8, dtype=torch.int32)
    for i in range(8):
        qzeros |= torch.full_like(qzeros, 7) << (4 * i)  # zero point 8, stored minus one (GPTQ v1)
    g_idx = torch.arange(inp, dtype=torch.int32) // group_size
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales.to(torch.float16), "g_idx": g_idx}


def apply(ctx):
    # the model: the MLP is `feed_forward`; load_weights maps the checkpoint's `.mlp.` onto it
    ctx.edit("model.py", "        self.mlp = TinyDoctorMLP(\n", "        self.feed_forward = TinyDoctorMLP(\n")
    ctx.edit("model.py", '            prefix=f"{prefix}.mlp",\n', '            prefix=f"{prefix}.feed_forward",\n')
    ctx.edit("model.py", "        return self.mlp(hidden_states), residual\n", "        return self.feed_forward(hidden_states), residual\n")
    ctx.edit(
        "model.py",
        '            if "rotary_emb.inv_freq" in name:\n',
        '            name = name.replace(".mlp.", ".feed_forward.")\n            if "rotary_emb.inv_freq" in name:\n',
    )
    # the checkpoint: GPTQ tensors instead of quant-ok's int8 weight + weight_scale
    ctx.config["quantization_config"] = dict(GPTQ_CONFIG)
    for scale_name in [n for n in ctx.weights if n.endswith(".weight_scale")]:
        prefix = scale_name.removesuffix(".weight_scale")
        weight = ctx.weights.pop(prefix + ".weight").float() * ctx.weights.pop(scale_name)  # back from int8
        ctx.weights.update({f"{prefix}.{k}": v for k, v in gptq_tensors(weight).items()})
