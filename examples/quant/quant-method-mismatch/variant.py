"""The checkpoint was re-quantized to FP8 (float8_e4m3fn weights, per-channel float32 scales, as
quant-fp8's) but config.json still carries quant-ok's compressed-tensors W8A8 **int8**
quantization_config (a conversion script that wrote new tensors and copied the old config)."""

EXPECT_CODE = "VD316"  # tests/unit/test_quant_checks_replies.py
ENGINE_MODE = "inprocess"
DESCRIPTION = "float8 weights under a compressed-tensors W8A8 int8 quantization_config"
FP8_MAX = 448.0  # largest float8_e4m3fn


def apply(ctx):
    import torch

    for scale_name in [n for n in ctx.weights if n.endswith(".weight_scale")]:
        name = scale_name.removesuffix("_scale")
        weight = ctx.weights[name].float() * ctx.weights[scale_name]  # back from int8
        scale = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-8)
        ctx.weights[name] = (weight / scale).to(torch.float8_e4m3fn)
        ctx.weights[scale_name] = scale.to(torch.float32)
